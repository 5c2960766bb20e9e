#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftcache PYTHONPATH=$PWD
python3 benchmarks/make_trace.py /tmp/trace.npy --tokens 512 > /dev/null
timeout 90 python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$OUT/profile.json" 2> "$OUT/profile.err"; cat "$OUT/profile.json"
HANG=120 timeout 300 python3 benchmarks/results/2026-11-30-h200-f/sweep/q_sweep.py /tmp/trace.npy 8GiB,4GiB 0.38,0.44,0.50 3 > "$OUT/q_sweep.txt" 2>&1
cat "$OUT/q_sweep.txt" | grep -v Warning
