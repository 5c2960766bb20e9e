#!/usr/bin/env bash
# Call 3: a step with no CPU route no longer waits for the poller, and the CPU probe: GPU tests,
# then the 12-hog contention rows, then the recovery after the load (recovery.py).
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout -s ABRT 200 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py \
  tests/test_graphs.py tests/test_policies.py tests/test_parity.py tests/test_cpu_executor.py > "$out/gpu_tests.txt" 2>&1
tail -3 "$out/gpu_tests.txt"
python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
python3 -m engine.bench.make_trace /tmp/trace.npy --tokens 512
timeout -s ABRT 150 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --cpu-threads 8 --tokens 32 --repeats 5 \
  --expert-budget 8GiB --moe-policy adaptive,adaptive-fixed --routing trace:/tmp/trace.npy --contention 12 \
  --out "$out/decode_c12.json" > "$out/decode_c12.txt" 2>&1; grep "tok/s" "$out/decode_c12.txt"
timeout -s ABRT 200 python3 benchmarks/results/2026-11-30-h200-k/recovery.py /tmp/trace.npy 12 > "$out/recovery.txt" 2>&1
cat "$out/recovery.txt"
