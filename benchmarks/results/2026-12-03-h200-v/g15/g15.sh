#!/usr/bin/env bash
# g15 (issue 20): a CPU job of few experts takes smaller phase-1 units (the working tree) against 2ec16e9 (.probe/ab/old =
# git archive 2ec16e9 engine kernels ftw freetoken_cli pyproject.toml, without engine/demo/model): the executor's job
# times (g13's cpujobs.py, copied to .probe/), then int4 adaptive decode at 1152 MiB, alternating.
# run(command="bash benchmarks/results/2026-12-03-h200-v/g15/g15.sh $OUT", carry=[".probe"])
set -u
out=$1; w=/tmp/g15; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/g15.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 560 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab; CJ=$PWD/.probe/cpujobs.py
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
el build
for t in new old; do (cd $(tree $t) && PYTHONPATH=$(tree $t) timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1; done
for t in new old; do el jobs $t; (cd $(tree $t) && PYTHONPATH=$(tree $t) timeout -s ABRT 60 python3 $CJ int4) > $w/jobs_$t.jsonl 2>&1; done
paste -d' ' <(cut -c1-200 $w/jobs_new.jsonl) <(grep -o '"us": [0-9.]*' $w/jobs_old.jsonl) | tee $w/jobs.txt; pack
dec() {  # tree tag
  [ $(left) -gt 50 ] || return 1
  el decode $*
  timeout -s ABRT 60 $ft $(tree $1) bench decode --synthetic qwen3-30b-a3b --layers 8 --quant int4 --moe-policy adaptive --routing uniform \
    --expert-budget 1152MiB --tokens 64 --repeats 3 --out $w/dec_$1_$2.json > $w/dec_$1_$2.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$2.json'))
for r in d['rows']: print('$1 $2', round(r['tok_s'], 1), round(r['tok_s'] / r['bound_tok_s'], 3), round(r['cpu'], 2), round(r.get('b_h_online_gbps') or 0, 1))" | tee -a $w/summary.txt
  pack
}
dec new a; dec old a; dec old b; dec new b; dec new c; dec old c
el done; pack
