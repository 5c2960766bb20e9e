#!/usr/bin/env bash
# call 2 (2026-12-01 fourteenth run): the elastic scenario again (Sequence copies its prompt; resize timings
# logged); then issue 24 on CUDA with flash-linear-attention 0.6.0 (carried wheels): parity suites, an agent
# session with state checkpoints on and off, decode and 16k prefill; Qwen3.5-35B-A3B shape cut to 16 layers
set -u
out=$1; w=/tmp/d2; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD:/tmp/site FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/d2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh
python3 -c "import kernels.linear_attn as k, fla; print('flash-linear-attention', fla.__version__, k._fla() is not None)" 2>&1 | tail -1 | tee $w/hybrid_env.txt
el elastic; timeout -s ABRT 150 python3 -m engine.bench.elastic --layers 16 --gpu-gib 32 --other-gib 20 --baseline 8 --hold 15 --recover 15 \
    > $w/elastic.json 2> $w/elastic.err; tail -1 $w/elastic.json; grep -v "^W1201" $w/elastic.err | grep -v Warning | tail -12; pack
el tests; timeout -s ABRT 130 python3 -m pytest -q -rf -p no:cacheprovider --engine-device cuda tests/test_linear_attention.py \
    tests/test_hybrid.py > $w/hybrid_tests.txt 2>&1; grep -E "^(FAILED|ERROR)|passed|failed|^\.|Timeout|Aborted" $w/hybrid_tests.txt | tail -20; pack
hy="--synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 --expert-budget 8GiB"
el agent; timeout -s ABRT 130 python3 -m freetoken_cli.main bench agent $hy --out $w/agent.json > $w/agent.txt 2>&1; tail -16 $w/agent.txt; pack
el decode; timeout -s ABRT 75 python3 -m freetoken_cli.main bench decode $hy --tokens 32 --repeats 3 --moe-policy adaptive,fetch,cpu \
    --routing model --out $w/hybrid_decode.json > $w/hybrid_decode.txt 2>&1; tail -8 $w/hybrid_decode.txt; pack
el prefill; timeout -s ABRT 75 python3 -m freetoken_cli.main bench prefill $hy --lengths 16384 --mode adaptive --follow-up 200 \
    --out $w/hybrid_prefill.json > $w/hybrid_prefill.txt 2>&1; tail -8 $w/hybrid_prefill.txt; pack; el done
