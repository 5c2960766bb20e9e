#!/usr/bin/env bash
# Call 2: main (15438bd), the same machine: GPU tests, a profile, then online q* against q* fixed
# at the profile's value with 6 and 12 processes streaming host memory.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout -s ABRT 200 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py \
  tests/test_graphs.py tests/test_policies.py tests/test_parity.py tests/test_cpu_executor.py > "$out/gpu_tests.txt" 2>&1
tail -3 "$out/gpu_tests.txt"
python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
python3 -m engine.bench.make_trace /tmp/trace.npy --tokens 512
for hogs in 6 12; do
  timeout -s ABRT 170 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --cpu-threads 8 --tokens 32 --repeats 5 \
    --expert-budget 8GiB --moe-policy adaptive,adaptive-fixed --routing trace:/tmp/trace.npy --contention $hogs \
    --out "$out/decode_c$hogs.json" > "$out/decode_c$hogs.txt" 2>&1; tail -9 "$out/decode_c$hogs.txt"
done
