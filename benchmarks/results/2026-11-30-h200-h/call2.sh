#!/usr/bin/env bash
# Call 2: one-row GEMV timings (Triton against cuBLAS), where a step's GPU time goes with the
# candidate's defaults, and the model-routing row that twice hung before the poller fix.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
python3 -c "from kernels.linear_triton import bench_linear; import json; print(json.dumps(bench_linear(), indent=1))" \
  > "$out/linear.txt" 2>&1; cat "$out/linear.txt"
python3 benchmarks/make_trace.py /tmp/trace.npy --tokens 512
timeout -s ABRT 150 python3 -m benchmarks.step_profile trace:/tmp/trace.npy 12 2GiB > "$out/step_profile.txt" 2>&1
grep -E "ms per token|^  one layer" "$out/step_profile.txt"
python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --cpu-threads 8 --tokens 32 --repeats 3 \
  --expert-budget 8GiB --moe-policy adaptive,fetch,cpu,static:auto --routing model --out "$out/decode_am.json" \
  > "$out/decode_am.txt" 2>&1; tail -10 "$out/decode_am.txt"
