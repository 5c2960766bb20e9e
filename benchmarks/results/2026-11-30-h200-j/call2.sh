#!/usr/bin/env bash
# Call 2: main (6987639, the refactor after the ninth run's call 4 not yet run on a GPU): the GPU
# tests, then the four policies at 4/8/16 GiB on the locality trace.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout -s ABRT 200 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py \
  tests/test_graphs.py tests/test_policies.py tests/test_parity.py > "$out/gpu_tests.txt" 2>&1; tail -3 "$out/gpu_tests.txt"
python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
python3 -m engine.bench.make_trace /tmp/trace.npy --tokens 512
timeout -s ABRT 330 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --cpu-threads 8 --tokens 32 --repeats 3 \
  --expert-budget 4GiB,8GiB,16GiB --moe-policy adaptive,fetch,cpu,static:auto --routing trace:/tmp/trace.npy \
  --out "$out/decode.json" > "$out/decode.txt" 2>&1; tail -18 "$out/decode.txt"
