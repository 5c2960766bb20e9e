#!/usr/bin/env bash
# Call 1: the GPU tests on the candidate, then, in one process on the trace at 8 and 16 GiB,
# (a) the hits computed on a second stream while the fills land (OVERLAP) and (b) besides that
# an expert split by rows between the CPU and the GPU's scratch slot (ROWS), against neither.
# Run on 6987639 with rows_overlap.patch applied (the switches exist only there).
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout -s ABRT 240 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py \
  tests/test_graphs.py tests/test_policies.py tests/test_cpu_executor.py tests/test_parity.py > "$out/gpu_tests.txt" 2>&1
tail -8 "$out/gpu_tests.txt"
python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
python3 benchmarks/make_trace.py /tmp/trace.npy --tokens 512
m=engine.moe.device_control
timeout -s ABRT 330 python3 -m benchmarks.interleave --budget 8GiB,16GiB --routing trace:/tmp/trace.npy --repeats 5 \
  --variant rows --variant overlap:$m.ROWS=False --variant neither:$m.OVERLAP=False,$m.ROWS=False \
  > "$out/interleave.txt" 2>&1
grep -E "median|Error|error" "$out/interleave.txt" | tail -12
