#!/usr/bin/env bash
# thirty-second run, call 5: fp8's tiles as bench_quant found them (new = working tree) against d22d34e; fp8 decode, every expert resident.
set -u
out=$1; w=$out/d5; mkdir -p $w; cp $0 $w/
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftcache; ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
n=0; for t in new head head new; do n=$((n+1))
  timeout -s ABRT 50 $ft $(tree $t) bench decode --synthetic qwen3-30b-a3b --layers 8 --quant fp8 --expert-budget 16GiB --moe-policy fetch \
    --routing uniform --batch 1,8 --tokens 32 --repeats 3 --out $w/decode_fp8_${t}_$n.json > $w/decode_fp8_${t}_$n.txt 2>&1; echo $t; grep "│" $w/decode_fp8_${t}_$n.txt | cut -c100-220
done
cd $out && tar -czf d5.tgz d5 && rm -rf d5
