#!/usr/bin/env bash
# Short prefill chunks (<= 16 routes an expert, was 4) split their misses by q* like decode: A/B against main
# (e35c9cf, .probe/ab/main) on the hybrid agent session's reuse turns (32k; 64k new only) and the 16k
# prompt's +200 follow-up; the CPU executor's GFLOP/s per routes an expert on this host at 8 and 16 threads.
# needs, beside the tracked files: .probe/n8.sh .probe/ab/main .whl
set -u
out=$1; w=/tmp/n8; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
NEW=$PWD; OLD=$PWD/.probe/ab/main
pack() { tar czf $out/n8.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/
ft() { local tree=$1; shift; (cd $tree && PYTHONPATH=$tree:/tmp/site python3 -m freetoken_cli.main "$@"); }
el routes; PYTHONPATH=$NEW:/tmp/site timeout -s ABRT 60 python3 benchmarks/cpu_routes.py --threads 8,16 --formats bf16 --tokens 1,4,8,16,32 > $w/routes.txt 2>&1; tail -1 $w/routes.txt
PYTHONPATH=$NEW:/tmp/site timeout -s ABRT 30 python3 benchmarks/cpu_routes.py --threads 8 --formats int4 --tokens 1,8,16 > $w/routes_int4.txt 2>&1; tail -1 $w/routes_int4.txt
el profile; ft $NEW profile --json --cpu-threads 8 > $w/profile.json 2>&1
for tree in new old; do
  [ $(left) -gt 200 ] || break
  d=$NEW; [ $tree = old ] && d=$OLD
  el agent32 $tree; timeout -s ABRT 150 ft $d bench agent --synthetic qwen3.5-35b-a3b --layers 16 \
    --cpu-threads 8 --expert-budget 8GiB --system-tokens 32000 --out $w/agent32_$tree.json > $w/agent32_$tree.txt 2> $w/agent32_$tree.err; tail -11 $w/agent32_$tree.txt; pack
done
for tree in new old; do
  d=$NEW; [ $tree = old ] && d=$OLD
  for b in 1152MiB; do
    [ $(left) -gt 40 ] || break
    el prefill $b $tree; timeout -s ABRT 60 ft $d bench prefill --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 \
      --expert-budget $b --lengths 16384 --follow-up 200 --mode adaptive --repeats 5 --out $w/prefill_${b}_$tree.json > $w/prefill_${b}_$tree.txt 2>&1
    grep -E "cold|after" $w/prefill_${b}_$tree.txt; pack
  done
done
for tree in new old; do
  [ $(left) -gt 70 ] || break
  d=$NEW; [ $tree = old ] && d=$OLD
  el hybrid prefill $tree; timeout -s ABRT 80 ft $d bench prefill --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 \
    --expert-budget 8GiB --lengths 16384 --follow-up 200 --mode adaptive --repeats 2 --out $w/hprefill_$tree.json > $w/hprefill_$tree.txt 2>&1
  grep -E "cold|after" $w/hprefill_$tree.txt; pack
done
if [ $(left) -gt 160 ]; then
  el agent64 new; timeout -s ABRT $(( $(left) - 20 )) ft $NEW bench agent --synthetic qwen3.5-35b-a3b --layers 16 \
    --cpu-threads 8 --expert-budget 8GiB --system-tokens 64000 --out $w/agent64_new.json > $w/agent64_new.txt 2> $w/agent64_new.err; tail -11 $w/agent64_new.txt
fi
pack; el done
