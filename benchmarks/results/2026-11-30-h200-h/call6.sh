#!/usr/bin/env bash
# Call 6: candidates — (g) the plan kernel also adds the step's counts to the running totals
# (one launch less per layer step), (h) the residual add and the next RMSNorm in one kernel;
# every expert resident, model routing; then the GPU tests that cover them.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout -s ABRT 130 python3 -m benchmarks.interleave --budget 60GiB --routing model --repeats 5 \
  --variant both --variant noadd:engine.layers.attention.ADD_NORM=False \
  --variant nototals:engine.moe.device_control.PLAN_TOTALS=False \
  --variant main:engine.layers.attention.ADD_NORM=False,engine.moe.device_control.PLAN_TOTALS=False \
  > "$out/interleave.txt" 2>&1; grep median "$out/interleave.txt"; tail -2 "$out/interleave.txt"
timeout -s ABRT 90 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda tests/test_graphs.py tests/test_parity.py \
  tests/test_triton_kernels.py -k "plan or graph or parity or decode" > "$out/gpu_tests.txt" 2>&1; tail -2 "$out/gpu_tests.txt"
