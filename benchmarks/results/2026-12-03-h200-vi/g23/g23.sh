#!/usr/bin/env bash
# g23 (issue 20): three trees, alternating: main (f370642), pin (main + poller_pin.patch: the graph branch's poller
# pinned to the first core after the workers'), x (d19aca4: a job's x row for the BF16 dot products written 64 values
# a step). The branch's own time a job (g17/jobtimes.py, no link load); where a job's thread time goes (trace.py on
# x + trace.patch, FT_TRACE=1: joins, units, barrier, busy share; 1-14 threads and the graph branch's protocol); int4
# adaptive decode of the 8-layer model at 1152 MiB, uniform routing, alternating, and bf16 once.
# Prepare (.probe, carried): .probe/ab/{main,pin,x,tr} = `git archive <commit> engine kernels ftw freetoken_cli
# pyproject.toml` without engine/demo/model; pin patched with poller_pin.patch, tr = x patched with trace.patch.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g23/g23.sh $OUT", carry=[".probe"]); outputs in g23.tgz
set -u
out=$1; w=/tmp/g23; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g23.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 540 - ($(date +%s) - t0) )); }
ft="$PWD/.probe/ft.sh"; ab=$PWD/.probe/ab
for t in main pin x tr; do (cd $ab/$t && PYTHONPATH=$ab/$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1 & done; wait
cat /sys/kernel/mm/transparent_hugepage/enabled > $w/machine.txt 2>&1; lscpu >> $w/machine.txt; el built
(cd $ab/tr && for n in 1 4 8 14; do PYTHONPATH=$ab/tr FT_TRACE=1 timeout -s ABRT 60 python3 $d/g19/rates.py $n 1 int4,bf16 dram; done) 2>&1 | grep -v "Warn\|warn" | tee $w/trace_rates.txt
(cd $ab/tr && PYTHONPATH=$ab/tr FT_TRACE=1 timeout -s ABRT 90 python3 $d/g23/trace.py int4,bfloat16 14 200) 2>&1 | grep -v "Warn\|warn\|leaked" | tee $w/trace_jobs.txt; el traced; pack
for n in main pin x; do (cd $ab/$n && PYTHONPATH=$ab/$n timeout -s ABRT 90 python3 $d/g17/jobtimes.py int4,bfloat16 14 150 none) 2>&1 | grep -v "Warn\|warn\|leaked" | sed "s/^/$n /" | tee -a $w/jobtimes.txt; done; el jobtimes; pack
dec() {  # name fmt i
  [ $(left) -gt 45 ] || { el skip $1 $2 $3; return 1; }
  el decode $1 $2 $3; a="--quant $2"; [ $2 = bf16 ] && a=""
  FREETOKEN_CACHE=/tmp/ftc timeout -s ABRT 60 $ft $ab/$1 bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB \
    --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_$1_$2_$3.json > $w/dec_$1_$2_$3.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$2_$3.json'))
for r in d['rows']: print('$1 $2 $3', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'cpu', round(r['cpu'], 2), 'B_H', round(r.get('b_h_online_gbps') or 0, 1))" | tee -a $w/summary.txt
}
for i in 1 2; do dec main int4 $i; dec pin int4 $i; dec x int4 $i; done; pack
dec main int4 3; dec x int4 3; dec pin int4 3
el done; pack
