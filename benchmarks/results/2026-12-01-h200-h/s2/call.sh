#!/usr/bin/env bash
# fillgroups (a scan chunk's fetched experts filled and computed in groups) and prefetchnext (a scan step loads the next
# layer's experts it used last time while it computes) against main with repeats, at 1/8 budget (and 4 GiB);
# depth after the page table's numpy build; the hybrid 16k prefill and its "+200" row.
# needs, beside the tracked files: .probe/n2.sh .probe/ab .whl
set -u
out=$1; w=/tmp/n2; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/
[ -f /tmp/ftcache/profile* ] || PYTHONPATH=$PWD:/tmp/site python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1
for run in main:1152MiB prefetchnext:1152MiB fillgroups:1152MiB prefetchnext:4GiB main:4GiB; do
  [ $(left) -gt 90 ] || break
  t=${run%:*}; b=${run#*:}; root=$PWD; [ $t = main ] || root=$PWD/.probe/ab/$t
  el prefill $t $b; (cd $root && PYTHONPATH=$root:/tmp/site timeout -s ABRT 80 python3 -m freetoken_cli.main bench prefill \
    --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 --expert-budget $b --lengths 16384 --follow-up 200 \
    --mode adaptive --repeats 5 --out $w/prefill_${t}_$b.json > $w/prefill_${t}_$b.txt 2>&1); grep -E "cold|after" $w/prefill_${t}_$b.txt; pack
done
[ $(left) -gt 120 ] && el depth && PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 110 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --layers 8 \
  --cpu-threads 8 --moe-policy adaptive --routing model --tokens 32 --repeats 3 --expert-budget 16GiB --depth 1024,32768 \
  --out $w/depth.json > $w/depth.txt 2>&1; tail -6 $w/depth.txt; pack
[ $(left) -gt 100 ] && el hybrid prefill && PYTHONPATH=$PWD:/tmp/site timeout -s ABRT $(( $(left) - 10 )) python3 -m freetoken_cli.main bench prefill --synthetic qwen3.5-35b-a3b \
  --layers 16 --cpu-threads 8 --expert-budget 8GiB --lengths 16384 --follow-up 200 --mode adaptive --repeats 2 \
  --out $w/prefill_hybrid.json > $w/prefill_hybrid.txt 2>&1; grep -E "cold|after" $w/prefill_hybrid.txt; pack; el done
