#!/usr/bin/env bash
# g37 (issue 20): g29 found a decode job's workers joining 10-20 us after its submit in most jobs (14 workers, the
# poller and the stepping thread on 16 cores). Do fewer workers join sooner, and does int4 adaptive decode gain?
# --cpu-threads 10, 12 and 14 (the default), the join histogram of g29's trace tree (g29/trace2.patch, FT_TRACE=1),
# int4 adaptive at 1152 MiB, uniform routing, two rounds alternating.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g37/g37.sh $OUT"); outputs in g37.tgz
set -u
out=$1; w=/tmp/g37; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g37.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 330 - ($(date +%s) - t0) )); }
t=/tmp/tr; mkdir -p $t; cp -r freetoken_kernels engine ftw freetoken_cli pyproject.toml $t/; (cd $t && patch -s -p1 < $d/g29/trace2.patch)
(cd $t && PYTHONPATH=$t timeout -s ABRT 150 python3 -c "from freetoken_kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1; el built
dec() {  # threads i
  [ $(left) -gt 30 ] || { el skip $1 $2; return 1; }
  el decode $1 $2
  (cd $t && FT_TRACE=1 FREETOKEN_CACHE=/tmp/ftc PYTHONPATH=$t:/tmp/site timeout -s ABRT 60 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b \
    --layers 8 --quant int4 --expert-budget 1152MiB --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --cpu-threads $1 --out $w/dec_$1_$2.json) > $w/dec_$1_$2.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$2.json'))
for r in d['rows']: print('threads $1 round $2', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'cpu', round(r['cpu'], 2), 'B_H', round(r.get('b_h_online_gbps') or 0, 1))" | tee -a $w/summary.txt
  grep -a "trace:" $w/dec_$1_$2.txt | tail -2 | sed "s/^/threads $1 round $2 /" | tee -a $w/summary.txt
}
dec 14 0  # warm-up: builds the synthetic checkpoint (or reuses the warm machine's)
for i in 1 2; do for n in 10 12 14; do dec $n $i; done; pack; done
el done; pack
