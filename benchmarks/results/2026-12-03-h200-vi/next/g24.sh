#!/usr/bin/env bash
# g24 (prepared, not run; issue 20, a probe): is a phase-1 unit's stream length what holds an executor thread at half
# its lone rate? Every job's phase-1 unit forced to 16, 64, 128 and 256 gate/up row pairs (the tree picks 64 for
# int4, 16 for bf16, at 8 experts and 14 threads), each phase timed (g21/phases.patch, FT_PHASES=1); int4 and bf16
# jobs of 8 experts from DRAM at 14 threads (g19/rates.py), two rounds alternating.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/next/g24.sh $OUT"); outputs in g24.tgz
set -u
out=$1; w=/tmp/g24; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 FT_PHASES=1
V="16 64 128 256"
for v in $V; do
  t=/tmp/t_r$v; mkdir -p $t; cp -r freetoken_kernels engine ftw $t/; (cd $t && sed "s,\([ab]\)/kernels/,\1/freetoken_kernels/,g" $d/g21/phases.patch | patch -p1 -s || echo "r$v: PATCH FAILED" >> $w/variants.txt)
  sed -i "s/^    J->r1 = unit_rows(.*/    J->r1 = $v;/" $t/freetoken_kernels/csrc/cpu_moe.cpp
  grep -n "J->r1 = " $t/freetoken_kernels/csrc/cpu_moe.cpp | sed "s/^/r$v /" >> $w/variants.txt
done
for v in $V; do (cd /tmp/t_r$v && PYTHONPATH=/tmp/t_r$v timeout -s ABRT 100 python3 -c "from freetoken_kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1 & done; wait
for i in 1 2; do for v in $V; do
  (cd /tmp/t_r$v && PYTHONPATH=/tmp/t_r$v timeout -s ABRT 40 python3 $d/g19/rates.py 14 1 int4,bf16 dram) 2>&1 | grep -v "Warn\|warn" | sed "s/^/r$v $i /" | tee -a $w/rates.txt
done; done
tar czf $out/g24.tgz -C $w .
