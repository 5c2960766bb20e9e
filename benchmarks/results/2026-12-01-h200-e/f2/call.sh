#!/usr/bin/env bash
# sixteenth run, call 2: kernel A/B of branches q4gemv and mlasplit against main; the issue 23 shapes' 16k prefill rows (as h200.sh archs)
# needs, beside the tracked files: ".probe/f2.sh", ".probe/ab"
set -u
out=$1; w=/tmp/f2; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/f2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh
for tree in main q4gemv mlasplit; do
  root=$PWD; [ $tree = main ] || root=$PWD/.probe/ab/$tree
  el kernels $tree; (cd $root && PYTHONPATH=$root timeout -s ABRT 60 python3 -c "
from kernels.moe_triton import bench_quant; from kernels.mla_triton import bench_mla
print(bench_mla()); print(bench_quant())") > $w/kernels_$tree.txt 2>&1; tail -c 1500 $w/kernels_$tree.txt; echo
done; pack
for spec in "gpt-oss-120b --layers 8" "deepseek-v3 --layers 5 --quant int4" "glm-4.5-air --layers 9"; do
  name=${spec%% *}; el prefill $name
  PYTHONPATH=$PWD timeout -s ABRT 140 python3 -m freetoken_cli.main bench prefill --synthetic $spec --cpu-threads 8 \
    --expert-budget 8GiB --lengths 16384 --mode adaptive --follow-up 200 --out $w/prefill_$name.json > $w/prefill_$name.txt 2>&1
  grep -E "cold|after|Error|error" $w/prefill_$name.txt | tail -5; pack
done; el done
