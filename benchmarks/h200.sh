#!/usr/bin/env bash
# The GPU measurements recorded in RESULTS.md, as run on the lent H200 machine (its python3 has
# torch + triton). Usage: benchmarks/h200.sh PART OUTDIR, PART = tests | graphs | decode-a | decode-b | prefill | step | depth |
# startup | depth-run | threads-probe | threads-decode | elastic | hybrid | archs | train.
set -u
part=$1; out=${2:-/tmp/ftout}; mkdir -p "$out"
# PYTHONFAULTHANDLER + timeout -s ABRT: a run cut off by its limit leaves every thread's stack in its log
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
ft() { python3 -m freetoken_cli.main "$@"; }
shape="--synthetic qwen3-30b-a3b --cpu-threads 8 --tokens 32 --repeats 3"
case $part in
tests)
  nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv > "$out/env.txt"
  python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> "$out/env.txt"
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Flags" | cut -c1-300 >> "$out/env.txt"
  timeout -s ABRT 300 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py tests/test_graphs.py tests/test_prefill.py \
    tests/test_parity.py tests/test_expert_memory.py tests/test_policies.py tests/test_cpu_executor.py \
    tests/test_radix.py tests/test_ftw.py tests/test_archs.py tests/test_sliding.py > "$out/gpu_tests.txt" 2>&1
  tail -5 "$out/gpu_tests.txt"
  ft profile --json --cpu-threads 8 > "$out/profile.json" 2> "$out/profile.err"; cat "$out/profile.json"
  python3 -c "from freetoken_kernels.moe_triton import bench_moe; from freetoken_kernels.attention_triton import bench_attention
from freetoken_kernels.plan_triton import bench_plan; from freetoken_kernels.fill_triton import bench_fill; from freetoken_kernels.mla_triton import bench_mla
print(bench_moe()); print(bench_attention()); print(bench_plan()); print(bench_fill()); print(bench_mla())" > "$out/kernels.txt" 2>&1
  tail -3 "$out/kernels.txt"
  python3 -m freetoken_kernels.moe_triton > "$out/kernels_quant.json" 2>&1; tail -60 "$out/kernels_quant.json" ;;
graphs)  # graph decode: GPU tests, then graph vs eager rows
  timeout -s ABRT 300 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda tests/test_graphs.py \
    tests/test_triton_kernels.py tests/test_parity.py tests/test_policies.py > "$out/gpu_tests.txt" 2>&1
  tail -15 "$out/gpu_tests.txt"
  ft bench decode $shape --expert-budget 8GiB --moe-policy adaptive,fetch,cpu --graph on,off \
    --routing model > "$out/decode_graph.txt" 2>&1; cat "$out/decode_graph.txt" ;;
decode-a)  # issue 4: the four policies at three budgets on a locality trace, then with model routing
  ft profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
  python3 -m engine.bench.make_trace /tmp/trace.npy --tokens 512
  # 12 rows took ~300 s on 2026-11-30; --out keeps the rows measured before a time limit
  timeout -s ABRT 360 python3 -m freetoken_cli.main bench decode $shape --expert-budget 4GiB,8GiB,16GiB \
    --moe-policy adaptive,fetch,cpu,static:auto --routing trace:/tmp/trace.npy --out "$out/decode_a.json" \
    > "$out/decode_a.txt" 2>&1; tail -12 "$out/decode_a.txt"
  timeout -s ABRT 160 python3 -m freetoken_cli.main bench decode $shape --expert-budget 8GiB --moe-policy adaptive,fetch,cpu,static:auto \
    --routing model --out "$out/decode_am.json" > "$out/decode_am.txt" 2>&1; tail -10 "$out/decode_am.txt" ;;
decode-b)  # issue 4: a locality trace at three budgets, a competing host-memory load, model routing
  ft profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
  python3 -m engine.bench.make_trace /tmp/trace.npy --tokens 512
  timeout -s ABRT 330 python3 -m freetoken_cli.main bench decode $shape --expert-budget 4GiB,8GiB,16GiB --moe-policy adaptive,fetch,cpu \
    --routing trace:/tmp/trace.npy --out "$out/decode_b.json" > "$out/decode_b.txt" 2>&1; tail -16 "$out/decode_b.txt"
  for hogs in 6 12; do  # 12 hogs also oversubscribe the 16 cores the executor's 8 threads run on
    timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode $shape --repeats 5 --expert-budget 8GiB --moe-policy adaptive,adaptive-fixed \
      --routing trace:/tmp/trace.npy --contention $hogs --out "$out/decode_c$hogs.json" > "$out/decode_c$hogs.txt" 2>&1
    tail -10 "$out/decode_c$hogs.txt"
  done
  timeout -s ABRT 90 python3 -m freetoken_cli.main bench decode $shape --expert-budget 8GiB --moe-policy adaptive,fetch,cpu \
    --routing model --out "$out/decode_m.json" > "$out/decode_m.txt" 2>&1; tail -9 "$out/decode_m.txt" ;;
prefill)  # issue 5: TTFT per prefill mode (16k prompt in 2048-token chunks), 200-token follow-up
  ft profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
  ft bench prefill --synthetic qwen3-30b-a3b --cpu-threads 8 --expert-budget 8GiB --lengths 1024,16384 \
    --mode stream,adaptive --follow-up 200 --prefill-chunk 2048 --out "$out/prefill.json" > "$out/prefill.txt" 2>&1; cat "$out/prefill.txt"
  # the compute floor: the same 16k prompt with every expert resident
  ft bench prefill --synthetic qwen3-30b-a3b --cpu-threads 8 --expert-budget 60GiB --lengths 16384 --mode routed \
    --follow-up 0 --prefill-chunk 2048 --out "$out/prefill_resident.json" > "$out/prefill_resident.txt" 2>&1; cat "$out/prefill_resident.txt" ;;
depth)  # issue 22: decode at 1k-64k of context and with 1, 4, 8 streams; every expert resident (16GiB > 9 GiB) and 1/8
  ft profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
  m8="--synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 --moe-policy adaptive --routing model --tokens 32 --repeats 3"
  timeout -s ABRT 300 python3 -m freetoken_cli.main bench decode $m8 --expert-budget 16GiB,1152MiB \
    --depth 1024,16384,32768,65536 --out "$out/depth.json" > "$out/depth.txt" 2>&1; tail -14 "$out/depth.txt"
  timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode $m8 --expert-budget 16GiB,1152MiB --depth 1024 \
    --batch 1,4,8 --out "$out/batch.json" > "$out/batch.txt" 2>&1; tail -12 "$out/batch.txt" ;;
startup)  # issue 22: the norm kernels, graph decode and the prefill warm-up, two fresh starts' compiles on the GPU; then
  # the phases of a cold start of the 8-layer checkpoint on disk: empty compile and bytecode caches, then warm ones
  # twice; then `run`'s own wall time to an 8-token answer (its tokenizer too), twice
  timeout -s ABRT 300 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_graphs.py \
    tests/test_triton_kernels.py::test_norm_kernels_match_reference tests/test_bench.py::test_a_second_start_reuses_the_compiled_artifacts \
    > "$out/gpu_tests.txt" 2>&1; tail -5 "$out/gpu_tests.txt"
  [ -d /tmp/q30b8/ftw ] || { timeout -s ABRT 300 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
    timeout -s ABRT 200 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > "$out/checkpoint.txt" 2>&1
  ls /tmp/ftcache/profiles/*.json > /dev/null 2>&1 || ft profile --json --cpu-threads 8 > "$out/profile.json" 2>&1
  rm -rf /tmp/ftcache/compile /tmp/ftcache/pycache
  for run in cold warm warm2; do
    timeout -s ABRT 150 python3 -m freetoken_cli.main bench startup /tmp/q30b8/ftw --cpu-threads 8 \
      --out "$out/startup_$run.json" > "$out/startup_$run.txt" 2>&1; cat "$out/startup_$run.txt"
  done
  for i in 1 2; do
    t0=$(date +%s.%N)
    timeout -s ABRT 150 python3 -m freetoken_cli.main run /tmp/q30b8/ftw --prompt hello --max-tokens 8 --raw --no-server \
      --cpu-threads 8 > "$out/run_$i.txt" 2>&1
    echo "run $i: exit $?, $(python3 -c "print(round($(date +%s.%N) - $t0, 2))") s to the answer" | tee -a "$out/run_wall.txt"
  done ;;
depth-run)  # issue 22: `run`'s own decode tok/s after a ~16k-token prompt beside a bench row at that depth, same checkpoint
  # (the checkpoint of part startup)
  python3 -c "print('def f(x):\n    return x * 2\n' * 1450)" | timeout -s ABRT 200 python3 -m freetoken_cli.main run \
    /tmp/q30b8/ftw --raw --max-tokens 129 --ignore-eos --cpu-threads 8 --json > "$out/run16k.json" 2> "$out/run16k.err"
  n=$(python3 -c "import json; print(json.load(open('$out/run16k.json'))['stats']['prompt_tokens'])")
  python3 -c "import json; s = json.load(open('$out/run16k.json'))['stats']; print('run:', s['prompt_tokens'], 'prompt tokens,', round(s['decode_tok_s'], 1), 'decode tok/s')"
  timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode /tmp/q30b8/ftw --cpu-threads 8 --moe-policy adaptive \
    --depth "$n" --tokens 128 --out "$out/bench16k.json" > "$out/bench16k.txt" 2>&1; tail -6 "$out/bench16k.txt" ;;
hybrid)  # issue 24: hybrid parity on CUDA, an agent session with state checkpoints on and off, decode and 16k prefill
  hy="--synthetic qwen3.5-35b-a3b --cpu-threads 8 --expert-budget 8GiB"
  python3 -c "import freetoken_kernels.linear_attn as k; print('flash-linear-attention:', k._fla() is not None)" > "$out/hybrid_env.txt" 2>&1
  timeout -s ABRT 300 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_linear_attention.py \
    tests/test_hybrid.py tests/test_parity.py -k "linear or hybrid or qwen3_next or qwen3_5" > "$out/hybrid_tests.txt" 2>&1
  tail -5 "$out/hybrid_tests.txt"
  timeout -s ABRT 400 python3 -m freetoken_cli.main bench agent $hy --out "$out/agent.json" > "$out/agent.txt" 2>&1; cat "$out/agent.txt"
  timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode $hy --tokens 32 --repeats 3 --moe-policy adaptive,fetch,cpu \
    --routing model --out "$out/hybrid_decode.json" > "$out/hybrid_decode.txt" 2>&1; tail -8 "$out/hybrid_decode.txt"
  timeout -s ABRT 300 python3 -m freetoken_cli.main bench prefill $hy --lengths 16384 --mode adaptive --follow-up 200 \
    --out "$out/hybrid_prefill.json" > "$out/hybrid_prefill.txt" 2>&1; cat "$out/hybrid_prefill.txt" ;;
step)  # where one decode step's GPU time goes, 12 layers, per policy
  python3 -m engine.bench.make_trace /tmp/trace.npy --tokens 512
  python3 -m engine.bench.step_profile trace:/tmp/trace.npy 12 2GiB > "$out/step_profile.txt" 2>&1 ;;
threads-probe)  # issue 22: B_H per thread count beside 0, 1, 2 busy processes (alone and through the poller),
  # without the cap on workers and with it; then the profile's sweep, whose pick is the default
  timeout -s ABRT 200 python3 -m engine.bench.threads --reserve 0 --seconds 0.5 > "$out/threads_uncapped.jsonl" 2>&1
  timeout -s ABRT 200 python3 -m engine.bench.threads --seconds 0.5 > "$out/threads.jsonl" 2>&1
  cat "$out/threads_uncapped.jsonl" "$out/threads.jsonl"
  ft profile --json > "$out/profile.json" 2> "$out/profile.err"
  python3 -c "import json; p = json.load(open('$out/profile.json')); print('sweep', p['thread_sweep'], 'pick', p['cpu_threads'])" ;;
threads-decode)  # issue 22: graph decode rows at 1..16 CPU threads, 8 layers, 1/8 budget (after part threads-probe:
  # the rows at the profile's pick are the default's)
  timeout -s ABRT 560 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --layers 8 \
    --expert-budget 1152MiB --routing uniform --moe-policy adaptive,cpu --tokens 64 --repeats 3 \
    --cpu-threads 1,4,8,10,12,13,14,15,16 --out "$out/threads_decode.json" > "$out/threads_decode.txt" 2>&1
  tail -22 "$out/threads_decode.txt"
  python3 -c "import json; [print(r['policy'], r['threads'], r['pool_threads'], round(r['tok_s'], 1), r['cpu_busy'])
    for r in json.load(open('$out/threads_decode.json'))['rows']]" ;;
archs)  # issue 23: graph decode (three policies) and a 16k prefill with its 200-token follow-up, per shape, 8 GiB
  for spec in "gpt-oss-120b --layers 8" "deepseek-v3 --layers 5 --quant int4" "glm-4.5-air --layers 9"; do
    name=${spec%% *}
    timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode --synthetic $spec --cpu-threads 8 --expert-budget 8GiB \
      --moe-policy adaptive,fetch,cpu --routing model --tokens 32 --repeats 3 --out "$out/decode_$name.json" > "$out/decode_$name.txt" 2>&1
    timeout -s ABRT 200 python3 -m freetoken_cli.main bench prefill --synthetic $spec --cpu-threads 8 --expert-budget 8GiB \
      --lengths 16384 --mode adaptive --follow-up 200 --out "$out/prefill_$name.json" > "$out/prefill_$name.txt" 2>&1
    tail -4 "$out/decode_$name.txt"; tail -4 "$out/prefill_$name.txt"
  done ;;
elastic)  # issue 22 item 6: the elastic resize on the GPU, then another process takes 20 GiB mid-decode and frees it
  timeout -s ABRT 240 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_elastic.py \
    tests/test_graphs.py > "$out/gpu_tests.txt" 2>&1; tail -5 "$out/gpu_tests.txt"
  timeout -s ABRT 330 python3 -m engine.bench.elastic --layers 16 --gpu-gib 32 --other-gib 20 \
    > "$out/elastic.json" 2> "$out/elastic.err"; cat "$out/elastic.json"; tail -5 "$out/elastic.err" ;;
train)  # issues 21 and 22, item 7 of each: the demo model, then the routing proxy, on the corpus that
  # `scripts/train_demo.py corpus` built (carried: .probe/train/corpus.jsonl.xz). Under 9 minutes: each
  # training loop ends at a fixed time after its script started (--train-until), whatever the data
  # preparation took, and still anneals. Seven files come back: the demo's safetensors shards, a tar of
  # its other files, the proxy's trace and metrics, two logs.
  corpus=.probe/train/corpus.jsonl.xz
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  timeout -s ABRT 320 python3 scripts/train_demo.py demo --corpus $corpus --device cuda --threads 16 \
    --train-until 240 --baseline engine/demo/model --out /tmp/demo > "$out/train_demo.log" 2>&1
  tail -32 "$out/train_demo.log"
  mv /tmp/demo/*.safetensors "$out/" && tar -C /tmp/demo -cf "$out/demo_files.tar" . && ls -l "$out"
  timeout -s ABRT 195 python3 scripts/train_demo.py proxy --corpus $corpus --device cuda --threads 16 \
    --train-until 150 --tokenizer /tmp/demo --out "$out" > "$out/train_proxy.log" 2>&1
  tail -42 "$out/train_proxy.log" ;;
esac
