#!/usr/bin/env bash
# Call 5: the recovery after a 12-hog load at 16 GiB (where a high q* leaves no step a CPU route),
# then adaptive beside fetch with model routing at 8 GiB (almost every step all hits: no CPU route).
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
python3 -m engine.bench.make_trace /tmp/trace.npy --tokens 512
timeout -s ABRT 130 python3 benchmarks/results/2026-11-30-h200-k/recovery.py /tmp/trace.npy 12 16GiB > "$out/recovery16.txt" 2>&1
grep -v "^ \|^Fatal\|^Current\|^$" "$out/recovery16.txt" | tail -40
timeout -s ABRT 100 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --cpu-threads 8 --tokens 32 --repeats 3 \
  --expert-budget 8GiB --moe-policy adaptive,fetch --routing model --out "$out/decode_m.json" > "$out/decode_m.txt" 2>&1
grep "tok/s" "$out/decode_m.txt"
