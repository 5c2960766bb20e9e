#!/usr/bin/env bash
# Call 2: the split's completion started after the step's fills (call 1) or after its merge (the
# CPU idle by then), against whole experts; 8 and 16 GiB on the locality trace, one process.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
python3 benchmarks/make_trace.py /tmp/trace.npy --tokens 512
timeout -s ABRT 400 python3 -m benchmarks.interleave --budget 8GiB,16GiB --routing trace:/tmp/trace.npy --repeats 5 \
  --variant whole:engine.moe.device_control.SPLIT_GRANULE=0 --variant after_fill \
  --variant after_merge:engine.moe.device_control.AFTER_MERGE=True > "$out/interleave.txt" 2>&1
grep -E "median|Error|error" "$out/interleave.txt" | tail -12
