#!/usr/bin/env bash
# Call 3: three launches less per layer step with CPU routes, each against its absence in one
# process: the plan kernel stages the CPU branch and writes its go flag (PLAN_STAGES), the fill
# kernel's last program writes the fill flag (FILL_SIGNALS), the merge sums the routes
# (MERGE_SUMS). Every expert resident (model routing), then 8 GiB on the trace. GPU tests first.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout -s ABRT 200 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py \
  tests/test_graphs.py tests/test_policies.py tests/test_parity.py > "$out/gpu_tests.txt" 2>&1; tail -3 "$out/gpu_tests.txt"
python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
python3 benchmarks/make_trace.py /tmp/trace.npy --tokens 512
m=engine.moe.device_control
timeout -s ABRT 340 python3 -m benchmarks.interleave --budget 60GiB,8GiB --routing model,trace:/tmp/trace.npy --repeats 5 \
  --variant all --variant none:$m.PLAN_STAGES=False,$m.FILL_SIGNALS=False,$m.MERGE_SUMS=False \
  --variant no_plan_stages:$m.PLAN_STAGES=False --variant no_fill_signals:$m.FILL_SIGNALS=False \
  --variant no_merge_sums:$m.MERGE_SUMS=False > "$out/interleave.txt" 2>&1
grep -E "median|Error|error" "$out/interleave.txt" | tail -12
