#!/usr/bin/env bash
# g10: the CPU branch in a step with no CPU route. new = main 242752c; skip (.probe/ab/skip) = such a step stages nothing,
# the plan raises the answer flag itself and the merge reads no host partial sum. Alternating: the trained proxy's trace at
# 2731 MiB and 8 GiB (adaptive, fetch), uniform at 1152 MiB (adaptive); the GPU tests of skip; step profiles of both at 8 GiB.
set -u
out=$1; w=/tmp/g10; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/g10.tgz -C $w . ; }
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
  timeout -s ABRT 70 $ft $(tree $1) bench decode --synthetic qwen3-30b-a3b --layers 8 --moe-policy adaptive,fetch --routing trace:$T \
    --expert-budget 2731MiB,8GiB --tokens 64 --repeats 3 --out $w/trace_$1_$2.json > $w/trace_$1_$2.txt 2>&1
  timeout -s ABRT 40 $ft $(tree $1) bench decode --synthetic qwen3-30b-a3b --layers 8 --moe-policy adaptive --routing uniform \
    --expert-budget 1152MiB --tokens 64 --repeats 3 --out $w/uniform_$1_$2.json > $w/uniform_$1_$2.txt 2>&1
  summ trace_$1_$2; summ uniform_$1_$2; pack
}
[ $(left) -gt 150 ] && { el tests; (cd $A/skip && PYTHONPATH=$A/skip timeout -s ABRT 150 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda \
  tests/test_triton_kernels.py tests/test_graphs.py tests/test_policies.py -k "plan or merge or graph or adaptive or poller or branch") > $w/tests.txt 2>&1; tail -2 $w/tests.txt; pack; }
dec new a; dec skip a; dec new b; dec skip b
for t in skip new; do [ $(left) -gt 60 ] && { el profile $t; (cd $(tree $t) && PYTHONPATH=$(tree $t):/tmp/site timeout -s ABRT 60 python3 -m engine.bench.step_profile trace:$T 8 8GiB) > $w/step_profile_$t.txt 2>&1; grep -E "tok/s|GPU busy" $w/step_profile_$t.txt; pack; }; done
el done; pack
