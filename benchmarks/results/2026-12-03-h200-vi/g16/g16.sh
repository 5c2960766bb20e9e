#!/usr/bin/env bash
# g16 (issue 20, a probe; prepared in the thirty-eighth run, run in the thirty-ninth): the int4 gate_up and down GEMVs on mma.sync from registers with shuffled codes (mma4.py) against the
# tree's kernels. run(command="bash benchmarks/results/2026-12-03-h200-vi/g16/g16.sh $OUT")
set -u
out=$1; d=$(dirname $0)
export PYTHONUNBUFFERED=1
nvidia-smi -L > $out/machine.txt
PYTHONPATH=$PWD timeout -s ABRT 200 python3 $d/mma4.py 4,8,16 2>&1 | grep -v "leaked\|nanobind\|^ -\|^See" | tee $out/mma4.jsonl
# then the CPU branch's B_H for int4 jobs of 1, 2 and 8 experts, the executor alone against the poller's protocol
# (g14 found int4's branch 30-40% below the executor alone in decode)
PYTHONPATH=$PWD timeout -s ABRT 200 python3 -m engine.bench.threads --format int4 --experts 1,2,8 --threads 8,12,14 \
  --spinners 0,1 --seconds 1 2>&1 | tee $out/threads_int4.jsonl
