#!/usr/bin/env bash
# g23 (prepared, not run; issue 20): the graph branch's poller pinned to a core of its own (../poller_pin.patch: the
# first core after the workers'), against main: the branch's own time a job (g17/jobtimes.py, no link load), then
# int4 adaptive decode of the 8-layer model at 1152 MiB, uniform routing, alternating (and bf16 once).
# Prepare: .probe/ab/pin = `git archive HEAD engine kernels ftw freetoken_cli pyproject.toml` without
# engine/demo/model, patched with poller_pin.patch; .probe/ab/main = the same unpatched.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/next/g23.sh $OUT", carry=[".probe"]); outputs in g23.tgz
set -u
out=$1; w=/tmp/g23; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g23.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 500 - ($(date +%s) - t0) )); }
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab/main; B=$PWD/.probe/ab/pin
for t in $A $B; do (cd $t && PYTHONPATH=$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1; done
for n in main:$A pin:$B; do (cd ${n#*:} && PYTHONPATH=${n#*:} timeout -s ABRT 90 python3 $d/g17/jobtimes.py int4,bfloat16 14 150 none) 2>&1 | grep -v "Warn\|warn\|leaked" | sed "s/^/${n%%:*} /" | tee -a $w/jobtimes.txt; done; pack
dec() {  # name tree fmt i
  [ $(left) -gt 45 ] || { el skip $1 $3 $4; return 1; }
  el decode $1 $3 $4; a="--quant $3"; [ $3 = bf16 ] && a=""
  FREETOKEN_CACHE=/tmp/ftc timeout -s ABRT 60 $ft $2 bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB \
    --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_$1_$3_$4.json > $w/dec_$1_$3_$4.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$3_$4.json'))
for r in d['rows']: print('$1 $3 $4', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'cpu', round(r['cpu'], 2), 'B_H', round(r.get('b_h_online_gbps') or 0, 1))" | tee -a $w/summary.txt
}
for i in 1 2 3; do dec main $A int4 $i; dec pin $B int4 $i; done; pack
dec main $A bf16 1; dec pin $B bf16 1
el done; pack
