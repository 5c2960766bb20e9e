#!/usr/bin/env bash
# call 2: depth rows (to the model's 40960-token context), the startup phases, run's decode after a ~16k prompt
set -u
out=$1; w=/tmp/c2; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
m8="--synthetic qwen3-30b-a3b --layers 8 --moe-policy adaptive --routing model --tokens 32 --repeats 3"
el depth; timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode $m8 --expert-budget 16GiB,1152MiB \
  --depth 1024,16384,32768,40000 --out $w/depth.json > $w/depth.txt 2>&1; tail -12 $w/depth.txt; pack
el startup; bash benchmarks/h200.sh startup $w/startup | grep -v "^$" | tail -60; pack
el depth-run; timeout 200 bash benchmarks/h200.sh depth-run $w/depthrun; pack; el done
