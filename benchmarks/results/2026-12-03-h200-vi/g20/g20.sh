#!/usr/bin/env bash
# g20 (issue 20): a unit's rows asked of L2 before it computes them (cpu_moe.cpp Rows::prefetch), against main
# (.probe/ab/main = git archive e6555ae without engine/demo/model): the executor's rates (g19/rates.py) alternating,
# then adaptive decode of the 8-layer model at 1152 MiB, uniform routing, int4 and bf16, alternating.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g20/g20.sh $OUT", carry=[".probe"]); outputs in g20.tgz
set -u
out=$1; w=/tmp/g20; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g20.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 330 - ($(date +%s) - t0) )); }
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab/main; B=$PWD
nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
for t in $A $B; do (cd $t && PYTHONPATH=$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1; done
el built
for i in 1 2; do for n in main:$A pf:$B; do
  el rates ${n%%:*} $i; (cd ${n#*:} && PYTHONPATH=${n#*:} timeout -s ABRT 60 python3 $d/g19/rates.py 8,14 1 int4 cache,dram; PYTHONPATH=${n#*:} timeout -s ABRT 60 python3 $d/g19/rates.py 14 1 bf16 dram) 2>/dev/null | sed "s/^/${n%%:*} /" | tee -a $w/rates.txt
done; done; pack
dec() {  # name tree fmt i
  [ $(left) -gt 40 ] || { el skip $1 $3 $4; return 1; }
  el decode $1 $3 $4; a="--quant $3"; [ $3 = bf16 ] && a=""
  FREETOKEN_CACHE=/tmp/ftc_$1 timeout -s ABRT 60 $ft $2 bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB \
    --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_$1_$3_$4.json > $w/dec_$1_$3_$4.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$3_$4.json')); p=d['profile']
for r in d['rows']: print('$1 $3 $4', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'fetched', round(r['fetched'], 2), 'cpu', round(r['cpu'], 2), 'q', round(r['q_star'], 3), 'B_H', round(r.get('b_h_online_gbps') or 0, 1), 'prof B_H', round(p['cpu_expert_gbps'], 1))" | tee -a $w/summary.txt
}
for i in 1 2; do dec main $A int4 $i; dec pf $B int4 $i; done; pack
for i in 1; do dec main $A bf16 $i; dec pf $B bf16 $i; done
el done; pack
