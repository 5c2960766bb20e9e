#!/usr/bin/env bash
# Call 4 (after call 3's recovery run was killed: its spawned hogs re-ran the script without a
# main guard, and its contention bench ran past a 150 s limit): the recovery after a 12-hog load,
# then the 12-hog contention rows with call 2's limit.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
python3 -m engine.bench.make_trace /tmp/trace.npy --tokens 512
timeout -s ABRT 200 python3 benchmarks/results/2026-11-30-h200-k/recovery.py /tmp/trace.npy 12 > "$out/recovery.txt" 2>&1
grep -v "^ \|^Fatal\|^Current\|^$" "$out/recovery.txt" | tail -40
timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --cpu-threads 8 --tokens 32 --repeats 5 \
  --expert-budget 8GiB --moe-policy adaptive,adaptive-fixed --routing trace:/tmp/trace.npy --contention 12 \
  --out "$out/decode_c12.json" > "$out/decode_c12.txt" 2>&1; grep "tok/s" "$out/decode_c12.txt"
