#!/usr/bin/env bash
# Call 6: the landed tree, the four policies at 8 GiB with the model's own (random-weight) routing.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --cpu-threads 8 --tokens 32 --repeats 3 \
  --expert-budget 8GiB --moe-policy adaptive,fetch,cpu,static:auto --routing model \
  --out "$out/decode_m.json" > "$out/decode_m.txt" 2>&1; tail -9 "$out/decode_m.txt"
