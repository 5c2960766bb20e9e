#!/usr/bin/env bash
# g8 (issue 22 item 7): a lone miss fetched into an empty slot (new) against HEAD 1002eac (.probe/ab/head), alternating:
# the trained proxy's trace at 1152 MiB, 2731 MiB, 8 GiB (adaptive, fetch), uniform at 1152 MiB and 8 GiB (adaptive);
# then new alone over a longer window (--tokens 256); the plan kernel's tests on the GPU.
set -u
out=$1; w=/tmp/g8; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/g8.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 560 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab; T=$PWD/benchmarks/traces/qwen3-30b-a3b-proxy.npy
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
el build; (PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
summ() { python3 -c "
import json; d=json.load(open('$w/$1.json'))
for r in d['rows']: print('$1', r['routing'], round(r['budget_gib'], 2), r['policy'], round(r['tok_s'], 1), round(r['hit_rate'], 4), round(r['tok_s'] / r['bound_tok_s'], 3))" | tee -a $w/summary.txt; }
dec() {  # tree tag
  [ $(left) -gt 100 ] || return 1
  el decode $*
  timeout -s ABRT 100 $ft $(tree $1) bench decode --synthetic qwen3-30b-a3b --layers 8 --moe-policy adaptive,fetch --routing trace:$T \
    --expert-budget 1152MiB,2731MiB,8GiB --tokens 64 --repeats 3 --out $w/trace_$1_$2.json > $w/trace_$1_$2.txt 2>&1
  timeout -s ABRT 60 $ft $(tree $1) bench decode --synthetic qwen3-30b-a3b --layers 8 --moe-policy adaptive --routing uniform \
    --expert-budget 1152MiB,8GiB --tokens 64 --repeats 3 --out $w/uniform_$1_$2.json > $w/uniform_$1_$2.txt 2>&1
  summ trace_$1_$2; summ uniform_$1_$2; pack
}
dec new a; dec head a; dec new b; dec head b
[ $(left) -gt 90 ] && { el long; timeout -s ABRT 90 $ft $PWD bench decode --synthetic qwen3-30b-a3b --layers 8 --moe-policy adaptive,fetch,cpu \
  --routing trace:$T --expert-budget 2731MiB,8GiB --tokens 256 --repeats 3 --out $w/long_new.json > $w/long_new.txt 2>&1; summ long_new; pack; }
[ $(left) -gt 60 ] && { el tests; PYTHONPATH=$PWD timeout -s ABRT 60 python3 -m pytest -q -p no:cacheprovider --engine-device cuda \
  tests/test_triton_kernels.py -k "plan" > $w/tests.txt 2>&1; tail -2 $w/tests.txt; pack; }
el done; pack
