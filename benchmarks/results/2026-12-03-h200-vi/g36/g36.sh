#!/usr/bin/env bash
# g36 (issue 20): the decode expert GEMVs per format at batch 1 and 8 as a share of a device copy's bandwidth,
# at the expert shapes of Qwen3-30B-A3B, Qwen3-235B-A22B, DeepSeek-V3 and gpt-oss-120b (shapes.py: int4 and bf16
# at every shape first, then fp8, mxfp4, int8, until 480 s are spent).
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g36/g36.sh $OUT"); outputs in g36.tgz
set -u
out=$1; w=/tmp/g36-out; mkdir -p $w; d=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $w/gpu.txt 2>&1
PYTHONPATH=$PWD timeout -s ABRT 560 python3 $d/shapes.py $w/shapes.jsonl 480 2>&1 | grep -v "arn" | tee $w/log.txt
tar czf $out/g36.tgz -C $w .
