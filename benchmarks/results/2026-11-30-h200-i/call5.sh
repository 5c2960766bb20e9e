#!/usr/bin/env bash
# Call 5: the attention combine in the last split program of each (sequence, kv head), against
# the combine kernel, in one process; GPU tests of the candidate first.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout -s ABRT 150 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py \
  tests/test_graphs.py tests/test_parity.py > "$out/gpu_tests.txt" 2>&1; tail -3 "$out/gpu_tests.txt"
python3 benchmarks/make_trace.py /tmp/trace.npy --tokens 512
timeout -s ABRT 200 python3 -m benchmarks.interleave --budget 60GiB,8GiB --routing model,trace:/tmp/trace.npy --repeats 5 \
  --variant fused --variant kernel:kernels.attention_triton.FUSED_COMBINE=False > "$out/interleave.txt" 2>&1
grep -E "median|Error|error" "$out/interleave.txt" | tail -6
