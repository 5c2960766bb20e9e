#!/usr/bin/env bash
# g25 (issue 20): g23's trace found the workers joining a job one futex wake-up at a time (mean join 15 us at 14
# threads) and phase-2 units with ~2.9 us fixed cost each (int4: 16 rows of 384 B an expert). Three trees,
# alternating: x (d19aca4), j (x + the workers spinning for the pool's lock), jp (j + each phase-2 unit asking for
# the next expert's rows into L2; join_prefetch.patch is jp against x). trace.py on each with trace.patch (tx, tj,
# tjp); int4 adaptive decode of the 8-layer model at 1152 MiB, uniform routing, three rounds; bf16 once.
# Prepare (.probe, carried): .probe/ab/{x,j,jp,tx,tj,tjp} = `git archive d19aca4 engine kernels ftw freetoken_cli
# pyproject.toml` without engine/demo/model, patched as named.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g25/g25.sh $OUT", carry=[".probe"]); outputs in g25.tgz
set -u
out=$1; w=/tmp/g25; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g25.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 540 - ($(date +%s) - t0) )); }
ft="$PWD/.probe/ft.sh"; ab=$PWD/.probe/ab
for t in x j jp tx tj tjp; do (cd $ab/$t && PYTHONPATH=$ab/$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1 & done; wait; el built
for t in tx tj tjp; do (cd $ab/$t && PYTHONPATH=$ab/$t FT_TRACE=1 timeout -s ABRT 90 python3 $d/g23/trace.py int4,bfloat16 14 200) 2>&1 | grep -v "Warn\|warn\|leaked" | sed "s/^/$t /" | tee -a $w/trace_jobs.txt; done; el traced; pack
dec() {  # name fmt i
  [ $(left) -gt 40 ] || { el skip $1 $2 $3; return 1; }
  el decode $1 $2 $3; a="--quant $2"; [ $2 = bf16 ] && a=""
  FREETOKEN_CACHE=/tmp/ftc timeout -s ABRT 60 $ft $ab/$1 bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB \
    --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_$1_$2_$3.json > $w/dec_$1_$2_$3.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$2_$3.json'))
for r in d['rows']: print('$1 $2 $3', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'cpu', round(r['cpu'], 2), 'B_H', round(r.get('b_h_online_gbps') or 0, 1))" | tee -a $w/summary.txt
}
dec x int4 1; dec j int4 1; dec jp int4 1; pack
dec jp int4 2; dec x int4 2; dec j int4 2; pack
dec j int4 3; dec jp int4 3; dec x int4 3; pack
dec x bf16 1; dec jp bf16 1
el done; pack
