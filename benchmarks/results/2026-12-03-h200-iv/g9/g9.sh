#!/usr/bin/env bash
# g9 (issue 22 item 7): three plan rules alternating on the trained proxy's trace (adaptive at 2731 MiB and 8 GiB) and
# uniform routing at 8 GiB: HEAD 1002eac (.probe/ab/head), a lone miss into an empty slot (new = the working tree), every
# miss into the empty slots first in line (.probe/ab/all); then "all" over a longer window; the plan tests of "all" on the GPU.
set -u
out=$1; w=/tmp/g9; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/g9.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 560 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab; T=$PWD/benchmarks/traces/qwen3-30b-a3b-proxy.npy
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
el build; (PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
summ() { python3 -c "
import json; d=json.load(open('$w/$1.json'))
for r in d['rows']: print('$1', r['routing'], round(r['budget_gib'], 2), r['policy'], round(r['tok_s'], 1), round(r['hit_rate'], 4), round(r['fetched'], 3), round(r['cpu'], 3), round(r['tok_s'] / r['bound_tok_s'], 3))" | tee -a $w/summary.txt; }
dec() {  # tree tag
  [ $(left) -gt 70 ] || return 1
  el decode $*
  timeout -s ABRT 70 $ft $(tree $1) bench decode --synthetic qwen3-30b-a3b --layers 8 --moe-policy adaptive --routing trace:$T,uniform \
    --expert-budget 2731MiB,8GiB --tokens 64 --repeats 3 --out $w/dec_$1_$2.json > $w/dec_$1_$2.txt 2>&1
  summ dec_$1_$2; pack
}
dec head a; dec new a; dec all a; dec head b; dec new b; dec all b
[ $(left) -gt 80 ] && { el long; timeout -s ABRT 80 $ft $A/all bench decode --synthetic qwen3-30b-a3b --layers 8 --moe-policy adaptive,fetch \
  --routing trace:$T --expert-budget 2731MiB,8GiB --tokens 256 --repeats 3 --out $w/long_all.json > $w/long_all.txt 2>&1; summ long_all; pack; }
[ $(left) -gt 50 ] && { el tests; (cd $A/all && PYTHONPATH=$A/all timeout -s ABRT 50 python3 -m pytest -q -p no:cacheprovider --engine-device cuda \
  tests/test_triton_kernels.py -k "plan") > $w/tests.txt 2>&1; tail -2 $w/tests.txt; pack; }
el done; pack
