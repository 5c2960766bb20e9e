#!/usr/bin/env bash
# g45 (prepared in the forty-third run, not run; issue 20): issue 20's int4-against-bf16 rows on main since the
# tensor-core int4 path landed (and whatever g43 / g44 landed): all 48 layers of --synthetic qwen3-30b-a3b at 8 GiB
# (thirty-eighth run: bf16 40.3, int4 110.3 tok/s, 2.74x) and the 8-layer model at 1152 MiB, adaptive, uniform
# routing, two alternating rounds each; then the int4 step profile at 1152 MiB (as g12's), where the serial GPU work
# of a layer step now goes.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g45/g45.sh $OUT"); outputs in g45.tgz
set -u
out=$1; w=/tmp/g45; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g45.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 560 - ($(date +%s) - t0) )); }
(PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from freetoken_kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
dec() {  # layers budget fmt i need_s tokens
  [ $(left) -gt $5 ] || { el skip $1 $3 $4; return 1; }
  el decode $1 $2 $3 $4; a="--quant $3"; [ $3 = bf16 ] && a=""
  (FREETOKEN_CACHE=/tmp/ftc PYTHONPATH=$PWD timeout -s ABRT $(( $(left) - 5 )) python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b \
    --layers $1 $a --expert-budget $2 --moe-policy adaptive --routing uniform --tokens $6 --repeats 3 --out $w/dec_$1_$3_$4.json) > $w/dec_$1_$3_$4.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$3_$4.json'))
for r in d['rows']: print('$1 layers $2 $3 $4', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'hits', round(r['hit_rate'], 3))" | tee -a $w/summary.txt
  pack
}
for i in 1 2; do dec 48 8GiB int4 $i 60 32; dec 48 8GiB bf16 $i 90 32; done
for i in 1 2; do dec 8 1152MiB int4 $i 30 64; dec 8 1152MiB bf16 $i 30 64; done
if [ $(left) -gt 60 ]; then el step_profile; (PYTHONPATH=$PWD timeout -s ABRT $(( $(left) - 5 )) python3 -m engine.bench.step_profile uniform 8 1152MiB /tmp/sp45 qwen3-30b-a3b cuda int4 1024) > $w/step_profile8_int4.txt 2>&1; tail -n 60 $w/step_profile8_int4.txt | cut -c1-160; fi
el done; pack
