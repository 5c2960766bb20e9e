#!/usr/bin/env bash
# call 4 (2026-12-01 fifteenth run): after the cuDNN-free prefill attention, the tensor-mapped residency tables,
# the sliding pool and the mxfp4 CPU path: GPU tests; startup's first/second prefill; 16k prefill of the 8-layer
# Qwen3 shape (all resident, 1/8); the hybrid agent session; CPU executor GB/s per format at 1 and 8 threads
set -u
out=$1; w=/tmp/e4; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD:/tmp/site FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/e4.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh
el tests; timeout -s ABRT 95 python3 -m pytest -q -rf --tb=short -p no:cacheprovider --engine-device cuda tests/test_sliding.py \
  tests/test_expert_memory.py tests/test_prefill.py > $w/gpu_tests.txt 2>&1; grep -E "^(FAILED|ERROR)|passed|failed|Aborted" $w/gpu_tests.txt | tail -8; pack
el startup; timeout -s ABRT 70 python3 -m freetoken_cli.main bench startup --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 \
  --expert-budget 16GiB --out $w/startup.json > $w/startup.txt 2>&1; grep -E "prefill|ready" $w/startup.txt; pack
m8="--synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 --lengths 16384 --follow-up 200 --mode adaptive,routed"
el prefill; for b in 16GiB 1152MiB; do timeout -s ABRT 60 python3 -m freetoken_cli.main bench prefill $m8 --expert-budget $b \
  --out $w/prefill_$b.json > $w/prefill_$b.txt 2>&1; grep -E "cold|after" $w/prefill_$b.txt; done; pack
el agent; timeout -s ABRT 150 python3 -m freetoken_cli.main bench agent --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 \
  --expert-budget 8GiB --out $w/agent.json > $w/agent.txt 2> $w/agent.err; tail -12 $w/agent.txt; pack
el cpu-quant; for n in 1 8; do timeout -s ABRT 25 python3 benchmarks/cpu_quant.py --threads $n --runs 3 --seconds 0.5 \
  --formats bf16,int4,mxfp4 > $w/cpu_quant_$n.json 2>&1; cat $w/cpu_quant_$n.json; done; pack; el done
