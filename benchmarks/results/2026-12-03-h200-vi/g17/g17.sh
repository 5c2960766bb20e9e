#!/usr/bin/env bash
# g17 (issue 20, a probe; this call was refused, jobtimes.py ran inside g19): where a CPU job's time goes in the graph branch's protocol against the executor alone,
# beside a busy link (copy engine or the fill kernel). run(command="bash benchmarks/results/2026-12-03-h200-vi/g17/g17.sh $OUT")
set -u
out=$1; d=$(dirname $0)
export PYTHONUNBUFFERED=1
nvidia-smi -L > $out/machine.txt; lscpu > $out/lscpu.txt
PYTHONPATH=$PWD timeout -s ABRT 400 python3 $d/jobtimes.py int4,bfloat16 14,12 2>&1 | grep -v "leaked\|nanobind" | tee $out/jobtimes.jsonl
