#!/usr/bin/env bash
# g27 (issue 20): int4 against bf16 on main (d19aca4 = .probe/ab/x), 8-layer model at 1152 MiB, uniform routing,
# adaptive, three rounds alternating, one machine: the 3x at the same budget, in one run.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g27/g27.sh $OUT", carry=[".probe"]); outputs in g27.tgz
set -u
out=$1; w=/tmp/g27; mkdir -p $w; ft="$PWD/.probe/ft.sh"; x=$PWD/.probe/ab/x
for i in 1 2 3; do for f in int4 bf16; do
  a="--quant $f"; [ $f = bf16 ] && a=""
  FREETOKEN_CACHE=/tmp/ftc timeout -s ABRT 60 $ft $x bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB \
    --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_${f}_$i.json > $w/dec_${f}_$i.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_${f}_$i.json'))
for r in d['rows']: print('$f $i', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'cpu', round(r['cpu'], 2), 'B_H', round(r.get('b_h_online_gbps') or 0, 1), 'B_P', round(r.get('b_p_online_gbps') or 0, 1))" | tee -a $w/summary.txt
done; done
tar czf $out/g27.tgz -C $w .
