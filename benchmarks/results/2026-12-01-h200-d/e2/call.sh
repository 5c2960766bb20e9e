#!/usr/bin/env bash
# call 2 (2026-12-01 fifteenth run): the hybrid CUDA suites after the FLA keyword fix; an agent session with
# turns 4-5 profiled (torch.profiler + cProfile); a startup's two 500-token prefills profiled (cProfile)
set -u
out=$1; w=/tmp/e2; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD:/tmp/site FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/e2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh; git log --oneline | head -1 > $w/commit.txt 2>/dev/null
el hybrid-tests; timeout -s ABRT 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider --durations=5 --engine-device cuda \
  tests/test_linear_attention.py tests/test_hybrid.py tests/test_parity.py -k "linear or hybrid or qwen3_next or qwen3_5 or checkpoint or pool or preempt or batched" > $w/hybrid_tests.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Aborted" $w/hybrid_tests.txt | tail -12; pack
el agent; PROF_TURNS=4,5 PROF_TORCH=1 timeout -s ABRT 190 python3 benchmarks/results/2026-12-01-h200-d/prof.py bench agent --synthetic qwen3.5-35b-a3b --layers 16 \
  --cpu-threads 8 --expert-budget 8GiB --out $w/agent.json > $w/agent.txt 2> $w/agent.err; tail -11 $w/agent.txt; grep "^turn" $w/agent.err; pack
el startup; timeout -s ABRT 90 python3 benchmarks/results/2026-12-01-h200-d/prof.py bench startup --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 \
  --expert-budget 16GiB > $w/startup.txt 2> $w/startup.err; grep -E "prefill|ready" $w/startup.txt; pack; el done
