#!/usr/bin/env bash
# Call 1: the decode step's serial GPU work — GEMV linear layers, the fused attention prologue,
# a one-warp router, the plan kernel's idle skip — GPU tests, then each change against its
# absence, taking turns repeat by repeat in one process (benchmarks/interleave.py).
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout -s ABRT 240 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py \
  tests/test_graphs.py tests/test_parity.py tests/test_policies.py > "$out/gpu_tests.txt" 2>&1; tail -3 "$out/gpu_tests.txt"
python3 -c "from kernels.linear_triton import bench_linear; import json; print(json.dumps(bench_linear(), indent=1))" \
  > "$out/linear.txt" 2>&1; cat "$out/linear.txt"
python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
python3 benchmarks/make_trace.py /tmp/trace.npy --tokens 512
old=engine.layers.linear.GEMV=False,engine.layers.attention.FUSED_PROLOGUE=False,kernels.router_triton.WARPS=4,kernels.plan_triton.SKIP_IDLE=False
timeout -s ABRT 330 python3 -m benchmarks.interleave --budget 60GiB,8GiB --routing model,trace:/tmp/trace.npy --repeats 5 \
  --variant new --variant old:$old --variant nogemv:engine.layers.linear.GEMV=False \
  --variant noprologue:engine.layers.attention.FUSED_PROLOGUE=False --variant noskip:kernels.plan_triton.SKIP_IDLE=False \
  > "$out/interleave.txt" 2>&1; grep median "$out/interleave.txt"; tail -3 "$out/interleave.txt"
