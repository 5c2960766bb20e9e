#!/usr/bin/env bash
# Where an int4 decode step's time goes at 1/8 budget (adaptive at 52% of its bound; bf16 at 77%): step_profile per
# policy, int4 then bf16, uniform routing, 8 layers, 1152 MiB; then every expert resident at depth 1k and 32k (where
# the 0.15 ms a 32k token adds beyond attention and the page table goes: GPU busy vs span); chrome traces kept.
# needs, beside the tracked files: .probe/n3.sh .whl
set -u
out=$1; w=/tmp/n3; mkdir -p $w/int4 $w/bf16 $w/d1024 $w/d32768
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache PYTHONPATH=$PWD:/tmp/site
pack() { tar czf $out/n3.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/
for q in int4 bf16; do
  el $q; timeout -s ABRT 150 python3 -m engine.bench.step_profile uniform 8 1152MiB $w/$q qwen3-30b-a3b cuda $q > $w/step_$q.txt 2>&1
  grep -E "ms per token|GPU busy" $w/step_$q.txt; gzip -f $w/$q/*.json; pack
done
for d in 1024 32768; do
  el depth $d; timeout -s ABRT 150 python3 -m engine.bench.step_profile model 8 16GiB $w/d$d qwen3-30b-a3b cuda bf16 $d > $w/step_d$d.txt 2>&1
  grep -E "ms per token|GPU busy" $w/step_d$d.txt; gzip -f $w/d$d/*.json; pack
done; el done
