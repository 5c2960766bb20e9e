#!/usr/bin/env bash
# call 3 (2026-12-01 fifteenth run): masked-SDPA first-call cost per shape; prefill MoE grouped GEMMs against the
# per-expert loop (bf16); GPU tests of the plain grouped GEMMs and of gpt-oss's sliding pool; 16k prefill of the
# 8-layer Qwen3 shape all resident and at 1/8 budget; the hybrid agent session
set -u
out=$1; w=/tmp/e3; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD:/tmp/site FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/e3.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh; cp benchmarks/results/2026-12-01-h200-d/sdpa.py benchmarks/results/2026-12-01-h200-d/gemm_ab.py $w/
el sdpa; timeout -s ABRT 60 python3 benchmarks/results/2026-12-01-h200-d/sdpa.py > $w/sdpa.txt 2>&1; cat $w/sdpa.txt
el gemm; timeout -s ABRT 90 python3 benchmarks/results/2026-12-01-h200-d/gemm_ab.py > $w/gemm_ab.txt 2>&1; cat $w/gemm_ab.txt; pack
el tests; timeout -s ABRT 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider --engine-device cuda tests/test_sliding.py \
  tests/test_triton_kernels.py tests/test_graphs.py -k "gemm or gpt_oss or sliding or window or graph" > $w/gpu_tests.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Aborted" $w/gpu_tests.txt | tail -12; pack
m8="--synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 --lengths 16384 --follow-up 200"
el prefill; for b in 16GiB 1152MiB; do timeout -s ABRT 70 python3 -m freetoken_cli.main bench prefill $m8 --expert-budget $b \
  --out $w/prefill_$b.json > $w/prefill_$b.txt 2>&1; tail -7 $w/prefill_$b.txt; done; pack
el agent; timeout -s ABRT 170 python3 -m freetoken_cli.main bench agent --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 \
  --expert-budget 8GiB --out $w/agent.json > $w/agent.txt 2> $w/agent.err; tail -12 $w/agent.txt; grep "^turn" $w/agent.err | cut -c1-60; pack; el done
