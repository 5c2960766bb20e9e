#!/usr/bin/env bash
# g34b (issue 20, the forty-first run): four more int4 rounds of g34's decode A/B, g34 first, on the machine g34 left
# warm (its trees /tmp/main and /tmp/g34 and the synthetic checkpoint in /tmp/ftc); outputs in out34b/.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g33-34/g34b.sh $OUT") right after g34.sh
w=/tmp/g34b; mkdir -p $w
for i in 1 2 3 4; do for t in g34 main; do
  (cd /tmp/$t && FREETOKEN_CACHE=/tmp/ftc PYTHONPATH=/tmp/$t:/tmp/site timeout -s ABRT 60 python3 -m freetoken_cli.main bench decode \
    --synthetic qwen3-30b-a3b --layers 8 --quant int4 --expert-budget 1152MiB --moe-policy adaptive --routing uniform --tokens 64 \
    --repeats 3 --out $w/dec_${t}_$i.json > $w/dec_${t}_$i.txt 2>&1)
  python3 -c "
import json; d=json.load(open('$w/dec_${t}_$i.json'))
for r in d['rows']: print('$t int4 $i', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1))" | tee -a $w/summary.txt
done; done
tar czf ${1:-$OUT}/g34b.tgz -C $w .
