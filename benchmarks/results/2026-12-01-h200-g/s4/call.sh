#!/usr/bin/env bash
# bench prefill with repeats (median of 5) at 1/8 budget and all resident, routed first (the order effect), with the
# CPU's share; the hybrid "+200" row after the prompt-end checkpoint fix; the decode attention's tile sweep at depth.
# needs, beside the tracked files: ".probe/next_s4.sh", ".probe/attn_sweep.py", ".probe/attn_old.py", ".whl"
set -u
out=$1; w=/tmp/s4; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache PYTHONPATH=$PWD:/tmp/site
pack() { tar czf $out/s4.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 .probe/attn_sweep.py .probe/attn_old.py $w/
el profile; python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1
for b in 1152MiB 16GiB; do
  el prefill $b; timeout -s ABRT 100 python3 -m freetoken_cli.main bench prefill \
    --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 --expert-budget $b --lengths 16384 --follow-up 200 \
    --mode routed,adaptive --repeats 5 --out $w/prefill_$b.json > $w/prefill_$b.txt 2>&1; grep -E "cold|after" $w/prefill_$b.txt; pack
done
el attention; timeout -s ABRT 150 python3 .probe/attn_sweep.py $w/attn.json > $w/attn.txt 2>&1; grep -v "^{'ctx'.*'ok'" $w/attn.txt | tail -24; pack
el attention tests; timeout -s ABRT 70 python3 -m pytest -q -p no:cacheprovider -rf --engine-device cuda tests/test_triton_kernels.py \
  -k "paged_decode_attention or paged_attention" > $w/attn_tests.txt 2>&1; tail -2 $w/attn_tests.txt; pack
el depth; timeout -s ABRT 110 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 \
  --moe-policy adaptive --routing model --tokens 32 --repeats 3 --expert-budget 16GiB --depth 1024,32768 \
  --out $w/depth.json > $w/depth.txt 2>&1; tail -8 $w/depth.txt; pack
el hybrid prefill; timeout -s ABRT 90 python3 -m freetoken_cli.main bench prefill --synthetic qwen3.5-35b-a3b --layers 16 \
  --cpu-threads 8 --expert-budget 8GiB --lengths 16384 --follow-up 200 --mode adaptive --repeats 3 \
  --out $w/prefill_hybrid.json > $w/prefill_hybrid.txt 2>&1; grep -E "cold|after" $w/prefill_hybrid.txt; pack; el done
