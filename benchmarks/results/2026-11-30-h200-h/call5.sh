#!/usr/bin/env bash
# Call 5: candidate — the expert kernel's sum over a token's k routes inside the down kernel
# (program per token and block of output rows, routes in order) instead of a separate reduction.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout -s ABRT 120 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py tests/test_graphs.py \
  > "$out/gpu_tests.txt" 2>&1; tail -2 "$out/gpu_tests.txt"
python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
python3 benchmarks/make_trace.py /tmp/trace.npy --tokens 512
timeout -s ABRT 330 python3 -m benchmarks.interleave --budget 60GiB,8GiB --routing model,trace:/tmp/trace.npy --repeats 5 \
  --variant sum4 --variant sum8:kernels.moe_triton.SUM_BLOCK_O=8 --variant sum2:kernels.moe_triton.SUM_BLOCK_O=2 \
  --variant main:kernels.moe_triton.SUM_IN_DOWN=False > "$out/interleave.txt" 2>&1; grep median "$out/interleave.txt"; tail -2 "$out/interleave.txt"
