#!/usr/bin/env bash
# g46 (issue 20): the decode table on main (9e95d12: the tensor-core int4 path, the fused router and o_proj
# launches, the BF16 activation writes, the phase-1 units, all landed since the last full table, the thirty-eighth
# run's g12 on 2ec16e9): the 8-layer Qwen3-30B-A3B-shaped model at 1152 MiB, every format, adaptive / fetch / cpu,
# uniform routing and the routing proxy's trace, two rounds; then the 48-layer model at 8 GiB in int8 and fp8
# (bf16 and int4 ran in g45). run(command="bash benchmarks/results/2026-12-04-h200/g46/g46.sh $OUT"); outputs in g46.tgz
set -u
out=$1; w=/tmp/g46; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftc
pack() { tar czf $out/g46.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt; free -g >> $w/machine.txt
T=$PWD/benchmarks/traces/qwen3-30b-a3b-proxy.npy
el build; (PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from freetoken_kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
summ() { python3 -c "
import json; d=json.load(open('$w/$1.json'))
for r in d['rows']: print('$1', r['routing'][:7], round(r['budget_gib'], 2), r['policy'], round(r['tok_s'], 1), 'hits', round(r['hit_rate'], 4), 'of bound', round(r['tok_s'] / r['bound_tok_s'], 3), 'B_H', round(r.get('b_h_online_gbps') or 0, 1))" | tee -a $w/summary.txt; }
bench() {  # name need_s args...
  local n=$1 need=$2; shift 2
  [ $(left) -gt $need ] || { el skip $n; return 1; }
  el $n; (PYTHONPATH=$PWD timeout -s ABRT $(( $(left) - 5 )) python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b "$@" \
    --out $w/$n.json) > $w/$n.txt 2>&1
  summ $n; pack
}
q() { [ $1 = bf16 ] || echo "--quant $1"; }
for i in 1 2; do for f in bf16 int4 int8 fp8 mxfp4; do
  bench dec8_${f}_$i 40 --layers 8 $(q $f) --expert-budget 1152MiB --moe-policy adaptive,fetch,cpu \
    --routing uniform,trace:$T --tokens 64 --repeats 3
done; done
for f in int8 fp8; do bench dec48_$f 60 $(q $f) --expert-budget 8GiB --moe-policy adaptive,fetch --routing uniform --tokens 32 --repeats 3; done
el done; pack
