#!/usr/bin/env bash
# g16 (prepared, not run; issue 20, a probe): the int4 gate_up and down GEMVs on mma.sync from registers with shuffled codes (mma4.py) against the
# tree's kernels. run(command="bash benchmarks/results/2026-12-03-h200-v/next/g16.sh $OUT")
set -u
out=$1; d=$(dirname $0)
export PYTHONUNBUFFERED=1
nvidia-smi -L > $out/machine.txt
PYTHONPATH=$PWD timeout -s ABRT 200 python3 $d/mma4.py 4,8,16 2>&1 | grep -v "leaked\|nanobind\|^ -\|^See" | tee $out/mma4.jsonl
