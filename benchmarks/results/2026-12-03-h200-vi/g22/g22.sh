#!/usr/bin/env bash
# g22 (issue 20): g21's R1 = 64 against main again, alternating, int4 from DRAM at 14 threads (three pairs).
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g22/g22.sh $OUT"); outputs in g22.tgz
set -u
out=$1; w=/tmp/g22; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 FT_PHASES=1
for v in main r1_64; do
  t=/tmp/t_$v; [ -d $t ] && continue; mkdir -p $t; cp -r kernels engine ftw $t/; (cd $t && patch -p1 -s < $d/g21/phases.patch)
  [ $v = r1_64 ] && sed -i 's/^constexpr int R1 = 16;/constexpr int R1 = 64;/' $t/kernels/csrc/cpu_moe.cpp
done
for v in main r1_64; do (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v timeout -s ABRT 60 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1 & done; wait
for i in 1 2 3; do for v in main r1_64; do
  (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v timeout -s ABRT 30 python3 $d/g19/rates.py 14 1 int4 dram) 2>&1 | grep -v "Warn\|warn" | sed "s/^/$v $i /" | tee -a $w/rates.txt
done; done; tar czf $out/g22.tgz -C $w .
