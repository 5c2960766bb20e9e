#!/usr/bin/env bash
# call 2: the int4 row dots on the host's AVX-512 BF16, table path against the magic path (int4mb.cpp),
# then the executor's own int4 / bf16 rates for scale
out=$1; mkdir -p $out/f2; lscpu > $out/f2/lscpu.txt; nvidia-smi -L > $out/f2/machine.txt
g++ -O3 -march=native -pthread -o /tmp/int4mb .probe/int4mb.cpp 2> $out/f2/build.err || cat $out/f2/build.err
for t in 1 2 4 8 12 14 16; do /tmp/int4mb $t 30; done 2>&1 | tee $out/f2/int4mb.txt
export PYTHONPATH=$PWD
timeout 200 python3 -c "
from kernels.cpu_executor import expert_gbps
for f in ('int4', 'bf16'):
    for t in (1, 8, 14):
        print(f, t, round(expert_gbps(f, t, seconds=1.0), 1), flush=True)
" 2>&1 | tee $out/f2/expert_gbps.txt
cp .probe/int4mb.cpp .probe/f2.sh $out/f2/
