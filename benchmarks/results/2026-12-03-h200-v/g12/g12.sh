#!/usr/bin/env bash
# g12 (issue 20): the decode table on main after the merge change: the 8-layer model at 1152 MiB, every format, every
# policy, uniform routing and the proxy's trace, the bound; the 48-layer model at 8 GiB, bf16 and int4; the int4 step
# profile at 1152 MiB. run(command="bash benchmarks/results/2026-12-03-h200-v/g12/g12.sh $OUT", carry=[".probe"])
set -u
out=$1; w=/tmp/g12; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/g12.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt; free -g >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; T=$PWD/benchmarks/traces/qwen3-30b-a3b-proxy.npy
el build; (PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
summ() { python3 -c "
import json; d=json.load(open('$w/$1.json'))
for r in d['rows']: print('$1', r['routing'][:7], round(r['budget_gib'], 2), r['policy'], round(r['tok_s'], 1), round(r['hit_rate'], 4), round(r['tok_s'] / r['bound_tok_s'], 3))" | tee -a $w/summary.txt; }
dec8() {  # format
  [ $(left) -gt 80 ] || { el skip $1; return 1; }
  el decode8 $1; a="--quant $1"; [ $1 = bf16 ] && a=""
  timeout -s ABRT 120 $ft $PWD bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB \
    --moe-policy adaptive,fetch,cpu --routing uniform,trace:$T --tokens 64 --repeats 3 --out $w/dec8_$1.json > $w/dec8_$1.txt 2>&1
  summ dec8_$1; pack
}
dec48() {  # format need_s
  [ $(left) -gt $2 ] || { el skip 48 $1; return 1; }
  el decode48 $1; a="--quant $1"; [ $1 = bf16 ] && a=""
  timeout -s ABRT $(( $(left) - 5 )) $ft $PWD bench decode --synthetic qwen3-30b-a3b $a --expert-budget 8GiB \
    --moe-policy adaptive,fetch --routing uniform --tokens 32 --repeats 3 --out $w/dec48_$1.json > $w/dec48_$1.txt 2>&1
  summ dec48_$1; pack
}
dec8 bf16; dec8 int4; dec8 int8; dec8 fp8
dec48 int4 90; dec48 bf16 120
if [ $(left) -gt 60 ]; then el step_profile; (PYTHONPATH=$PWD timeout -s ABRT $(( $(left) - 5 )) python3 -m engine.bench.step_profile uniform 8 1152MiB /tmp/sp12 qwen3-30b-a3b cuda int4 1024) > $w/step_profile8_int4.txt 2>&1; tail -n 60 $w/step_profile8_int4.txt | cut -c1-160; fi
el done; pack
