#!/usr/bin/env bash
# g26 (issue 20): workers join a job without the pool's lock (join.patch against d19aca4: the queue's front published
# as an atomic head, a reference taken only while the job still has one, a freed job waiting out the joiners), against
# x (d19aca4). trace.py on both with trace.patch (tx, tlf); int4 adaptive decode of the 8-layer model at 1152 MiB,
# uniform routing, three rounds alternating; bf16 once each.
# Prepare (.probe, carried): .probe/ab/{x,lf,tx,tlf} = `git archive d19aca4 engine kernels ftw freetoken_cli
# pyproject.toml` without engine/demo/model; lf patched with join.patch; tx, tlf: x, lf patched with ../g23/trace.patch.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g26/g26.sh $OUT", carry=[".probe"]); outputs in g26.tgz
set -u
out=$1; w=/tmp/g26; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g26.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 520 - ($(date +%s) - t0) )); }
ft="$PWD/.probe/ft.sh"; ab=$PWD/.probe/ab
for t in x lf tx tlf; do (cd $ab/$t && PYTHONPATH=$ab/$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1 & done; wait; el built
for t in tx tlf; do (cd $ab/$t && PYTHONPATH=$ab/$t FT_TRACE=1 timeout -s ABRT 90 python3 $d/g23/trace.py int4,bfloat16 14 200) 2>&1 | grep -v "Warn\|warn\|leaked" | sed "s/^/$t /" | tee -a $w/trace_jobs.txt; done; el traced; pack
dec() {  # name fmt i
  [ $(left) -gt 40 ] || { el skip $1 $2 $3; return 1; }
  el decode $1 $2 $3; a="--quant $2"; [ $2 = bf16 ] && a=""
  FREETOKEN_CACHE=/tmp/ftc timeout -s ABRT 60 $ft $ab/$1 bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB \
    --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_$1_$2_$3.json > $w/dec_$1_$2_$3.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$2_$3.json'))
for r in d['rows']: print('$1 $2 $3', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'cpu', round(r['cpu'], 2), 'B_H', round(r.get('b_h_online_gbps') or 0, 1), 'B_P', round(r.get('b_p_online_gbps') or 0, 1))" | tee -a $w/summary.txt
}
dec x int4 1; dec lf int4 1; pack
dec lf int4 2; dec x int4 2; pack
dec x int4 3; dec lf int4 3; pack
dec lf bf16 1; dec x bf16 1
el done; pack
