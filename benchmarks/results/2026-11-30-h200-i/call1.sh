#!/usr/bin/env bash
# Call 1: the split expert with its rows filled afterwards on a side stream (SPLIT_GRANULE = 16)
# against whole experts (SPLIT_GRANULE = 0): GPU tests, profile, then both variants taking turns
# in one process at 4/8/16 GiB on the locality trace.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout -s ABRT 170 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py \
  tests/test_graphs.py tests/test_policies.py tests/test_cpu_executor.py > "$out/gpu_tests.txt" 2>&1; tail -3 "$out/gpu_tests.txt"
python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
python3 benchmarks/make_trace.py /tmp/trace.npy --tokens 512
timeout -s ABRT 330 python3 -m benchmarks.interleave --budget 4GiB,8GiB,16GiB --routing trace:/tmp/trace.npy \
  --repeats 5 --variant split --variant whole:engine.moe.device_control.SPLIT_GRANULE=0 > "$out/interleave.txt" 2>&1
grep -E "median|Error|error" "$out/interleave.txt" | tail -12
