#!/usr/bin/env bash
# g5: a timeline of the cold int8 16k prompt at 1152 MiB (the step's inputs through numpy); decode at depth on main (issue 22 item 3): every expert resident and 1152 MiB, 1k / 16k / 32k, model routing, default threads; twice.
set -u
out=$1; w=/tmp/g5; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/g5.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 500 - ($(date +%s) - t0) )); }
cp $0 .probe/pprof.py $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
el build; (PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
dep() {
  [ $(left) -gt 100 ] || return 1
  el depth $1
  timeout -s ABRT 200 .probe/ft.sh $PWD bench decode --synthetic qwen3-30b-a3b --layers 8 --moe-policy adaptive --routing model --tokens 32 --repeats 3 \
    --expert-budget 16GiB,1152MiB --depth 1024,16384,32768 --out $w/depth_$1.json > $w/depth_$1.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/depth_$1.json'))
for r in d['rows']: print('$1', r.get('depth'), round(r.get('budget_gib', 0) or 0, 2), r.get('policy'), round(r['tok_s'], 1), r.get('hit_rate'))" | tee -a $w/summary.txt
  pack
}
prof() { [ $(left) -gt 70 ] || return 1; el prof; (PYTHONPATH=$PWD timeout -s ABRT 70 python3 $w/pprof.py $w new int8) > $w/prof_new.txt 2>&1; tail -1 $w/prof_new.txt; pack; }
dep a; prof; dep b
el done; pack
