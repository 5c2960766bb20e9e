#!/usr/bin/env bash
# g21 (issue 20, a probe): where an int4 job's time goes, phase 1 (gate/up) against phase 2 (down), per thread count
# (phases.patch: each phase's time summed in the pool, printed at its close under FT_PHASES=1), on main and with
# longer units: R2 = 64 down rows a phase-2 unit, R1 = 64 gate/up row pairs a phase-1 unit (16 each on main).
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g21/g21.sh $OUT"); outputs in g21.tgz
set -u
out=$1; w=/tmp/g21; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 FT_PHASES=1
pack() { tar czf $out/g21.tgz -C $w . ; }
for v in main r2_64 r1_64; do
  t=/tmp/t_$v; mkdir -p $t; cp -r kernels engine ftw $t/; (cd $t && patch -p1 -s < $d/g21/phases.patch || echo "$v: PATCH FAILED" >> $w/variants.txt)
  [ $v = r2_64 ] && sed -i 's/^constexpr int R2 = 16;/constexpr int R2 = 64;/' $t/kernels/csrc/cpu_moe.cpp
  [ $v = r1_64 ] && sed -i 's/^constexpr int R1 = 16;/constexpr int R1 = 64;/' $t/kernels/csrc/cpu_moe.cpp
  grep -n "^constexpr int R[12]" $t/kernels/csrc/cpu_moe.cpp >> $w/variants.txt
done
for v in main r2_64 r1_64; do (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v timeout -s ABRT 100 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1 & done; wait
for v in main r2_64 r1_64; do
  (cd /tmp/t_$v && PYTHONPATH=/tmp/t_$v timeout -s ABRT 40 python3 $d/g19/rates.py 1,8,14 1 int4 dram) 2>&1 | grep -v "Warn\|warn" | sed "s/^/$v /" | tee -a $w/rates.txt
done; pack
