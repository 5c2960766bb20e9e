#!/usr/bin/env bash
# thirty-second run, call 8: the decode GEMVs load the next block's codes while one computes (new = working tree)
# against HEAD (.probe/ab/head); GPU tests of the quantized kernels; int4 decode, every expert resident, if time is left.
set -u
w=$1; mkdir -p $w
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftcache
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }
P=$PWD; ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
F=int4,bf16,fp8,int8,mxfp4
for t in head new; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 60 python3 $P/.probe/gemv2.py $F > $w/gemv_$t.jsonl 2>&1); el gemv $t $(wc -l < $w/gemv_$t.jsonl) rows; done
(PYTHONPATH=$PWD timeout -s ABRT 60 python3 -m pytest -q -p no:cacheprovider tests/test_triton_kernels.py -k "quantized_matches_ref" > $w/tests.txt 2>&1); tail -n 1 $w/tests.txt; el tests
n=0; for t in new head; do n=$((n+1)); [ $(( $(date +%s) - t0 )) -gt 120 ] && break; el decode int4 $t $n
  timeout -s ABRT 30 $ft $(tree $t) bench decode --synthetic qwen3-30b-a3b --layers 8 --quant int4 --expert-budget 16GiB --moe-policy fetch \
    --routing uniform --tokens 32 --repeats 3 > $w/decode_$t.txt 2>&1; grep "│" $w/decode_$t.txt | cut -c100-220
done
el done
