#!/usr/bin/env bash
# g28 (issue 20, a probe): g26's lock-free join shortened the graph branch's jobs alone but not decode's. The same
# trace (g23/trace.patch, FT_TRACE=1: the pool prints its sums when it closes) inside int4 adaptive decode of the
# 8-layer model at 1152 MiB, uniform routing: tx (d19aca4 + trace) and tlf (+ g26/join.patch), then tx again.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g28/g28.sh $OUT", carry=[".probe"]); outputs in g28.tgz
set -u
out=$1; w=/tmp/g28; mkdir -p $w; ft="$PWD/.probe/ft.sh"; ab=$PWD/.probe/ab
for t in tx tlf; do (cd $ab/$t && PYTHONPATH=$ab/$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1 & done; wait
for t in tx tlf tx2; do
  FT_TRACE=1 FREETOKEN_CACHE=/tmp/ftc timeout -s ABRT 60 $ft $ab/${t%2} bench decode --synthetic qwen3-30b-a3b --layers 8 --quant int4 --expert-budget 1152MiB \
    --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_$t.json > $w/dec_$t.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$t.json'))
for r in d['rows']: print('$t', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'cpu', round(r['cpu'], 2), 'B_H', round(r.get('b_h_online_gbps') or 0, 1))" | tee -a $w/summary.txt
  grep -a "trace:" $w/dec_$t.txt | sed "s/^/$t /" | tee -a $w/summary.txt
done
tar czf $out/g28.tgz -C $w .
