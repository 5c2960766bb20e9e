#!/usr/bin/env bash
# call 1 (2026-12-01 fifteenth run): the CUDA parity suites of the hybrid and issue 23 architectures
# (flash-linear-attention 0.6.0 carried), then where the first request's extra time goes: every Triton
# compile logged (with its time) through a startup of the 8-layer Qwen3 shape and an agent session
set -u
out=$1; w=/tmp/e1; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD:/tmp/site FREETOKEN_CACHE=/tmp/ftcache TRITON_PRINT_AUTOTUNING=1
pack() { tar czf $out/e1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh
python3 -c "import torch, triton, transformers, fla; print(torch.__version__, triton.__version__, transformers.__version__, fla.__version__)" 2>&1 | tail -1 | tee $w/env.txt
pt() { timeout -s ABRT $1 python3 -m pytest -q -rf --tb=short -p no:cacheprovider --durations=8 --engine-device cuda "${@:2}"; }
el hybrid-tests; pt 120 tests/test_linear_attention.py tests/test_hybrid.py > $w/hybrid_tests.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Aborted" $w/hybrid_tests.txt | tail -12; pack
el arch-tests; pt 170 tests/test_archs.py tests/test_parity.py -k "deepseek or glm or gpt_oss or qwen3_next or qwen3_5 or sliding or mtp or correction" > $w/arch_tests.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Aborted" $w/arch_tests.txt | tail -12; pack
el startup; timeout -s ABRT 90 python3 benchmarks/results/2026-12-01-h200-d/jitlog.py bench startup --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 \
   --expert-budget 16GiB > $w/startup.txt 2> $w/startup.err; tail -14 $w/startup.txt; grep -c "^JIT" $w/startup.err; pack
el agent; timeout -s ABRT 150 python3 benchmarks/results/2026-12-01-h200-d/jitlog.py bench agent --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 \
   --expert-budget 8GiB --out $w/agent.json > $w/agent.txt 2> $w/agent.err; tail -9 $w/agent.txt; grep -c "^JIT" $w/agent.err; pack; el done
