#!/usr/bin/env bash
# g7 (issue 22 item 7): the trained routing proxy's trace replayed on the device: adaptive, fetch and cpu at the
# budget shares of the estimate (12%, 15%, 30%, 89%, 100% of the 9 GiB of experts), twice; beside the CPU model's estimate.
set -u
out=$1; w=/tmp/g7; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/g7.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 540 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
el build; (PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
tr() {
  [ $(left) -gt 200 ] || return 1
  el trace $1
  timeout -s ABRT 240 .probe/ft.sh $PWD bench decode --synthetic qwen3-30b-a3b --layers 8 --moe-policy adaptive,fetch,cpu \
    --routing trace:$PWD/benchmarks/traces/qwen3-30b-a3b-proxy.npy --expert-budget 1152MiB,1365MiB,2731MiB,8GiB,16GiB \
    --tokens 64 --repeats 3 --out $w/trace_$1.json > $w/trace_$1.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/trace_$1.json'))
for r in d['rows']: print('$1', round(r['budget_gib'], 2), r['policy'], round(r['tok_s'], 1), round(r['hit_rate'], 4), round(r['tok_s'] / r['bound_tok_s'], 3))" | tee -a $w/summary.txt
  pack
}
tr a; tr b
el done; pack
