#!/usr/bin/env bash
# Call 4: the landed tree with the capture guarded (gc off, thread-local capture mode): the GPU
# tests, the model-routing rows at 8 GiB, and where a step's GPU time goes.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout -s ABRT 240 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py tests/test_graphs.py \
  tests/test_parity.py tests/test_policies.py tests/test_prefill.py tests/test_cpu_executor.py tests/test_expert_memory.py \
  > "$out/gpu_tests.txt" 2>&1; tail -3 "$out/gpu_tests.txt"
python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
python3 benchmarks/make_trace.py /tmp/trace.npy --tokens 512
timeout -s ABRT 120 python3 -m benchmarks.step_profile trace:/tmp/trace.npy 12 2GiB > "$out/step_profile.txt" 2>&1
grep -E "ms per token" "$out/step_profile.txt"
timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --cpu-threads 8 --tokens 32 --repeats 3 \
  --expert-budget 8GiB --moe-policy adaptive,fetch,cpu,static:auto --routing model --out "$out/decode_am.json" \
  > "$out/decode_am.txt" 2>&1; tail -10 "$out/decode_am.txt"
