#!/usr/bin/env bash
# The hybrid 16k cold prefill took 1.22-1.33 s on main in this run's calls 3-4 against 0.684 s in the nineteenth
# run's call 2 (before FlashAttention prefill, 3e1e357, and the 262,144-token shape, 36fec87): main, the tree
# before 36fec87 (.probe/ab/preshape) and the tree before 3e1e357 (.probe/ab/prefa), one after the other.
# needs, beside the tracked files: .probe/n10.sh .probe/ft.sh .probe/ab/prefa .probe/ab/preshape .whl
set -u
out=$1; w=/tmp/n10; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n10.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 200 - ($(date +%s) - t0) )); }
cp $0 $w/
ft="$PWD/.probe/ft.sh"
for tree in main preshape prefa; do
  [ $(left) -gt 45 ] || break
  d=$PWD; [ $tree != main ] && d=$PWD/.probe/ab/$tree
  el $tree; timeout -s ABRT 60 $ft $d bench prefill --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 \
    --expert-budget 8GiB --lengths 16384 --follow-up 0 --mode adaptive --repeats 2 --out $w/hprefill_$tree.json > $w/hprefill_$tree.txt 2>&1
  grep -E "cold" $w/hprefill_$tree.txt || tail -3 $w/hprefill_$tree.txt; pack
done; el done
