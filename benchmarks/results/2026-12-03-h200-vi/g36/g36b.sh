#!/usr/bin/env bash
# g36b (issue 20, a probe): g16's int4 gate_up and down GEMVs on mma.sync from registers (g16/mma4.py, H and I from
# the command line) against the tree's kernels at the expert shapes of Qwen3-30B-A3B, Qwen3-235B-A22B and
# DeepSeek-V3. run(command="bash benchmarks/results/2026-12-03-h200-vi/g36/g36b.sh $OUT"); outputs in g36b.tgz
set -u
out=$1; w=/tmp/g36b-out; mkdir -p $w; d=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1
for hi in "2048 768" "4096 1536" "7168 2048"; do
  PYTHONPATH=$PWD timeout -s ABRT 150 python3 $d/../g16/mma4.py 4,8 $hi 2>&1 | grep -v "leaked\|nanobind\|^ -\|^See\|arn" | tee -a $w/mma4.jsonl
  tar czf $out/g36b.tgz -C $w .
done
