#!/usr/bin/env bash
# executor probes (prefetch variants, int4 lookup cost, per-thread rates, unit2 loop order), decode bf16/int4 at defaults,
# 421d1c6 (v3) against main (m0) prefill follow-ups.
set -u
out=$1; w=/tmp/a1; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/a1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 575 - ($(date +%s) - t0) )); }
cp $0 .probe/gbs.py $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt; lscpu >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
el builds
for t in new m0 v3 pfT1 pf0 pf8k noperm; do
  d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 200 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) &
done; wait; el built
timeout 60 python3 -c "
import torch, time
x = torch.ones(1 << 29, dtype=torch.int32)  # 2 GiB
for th in (1, 2, 4, 7, 14):
    torch.set_num_threads(th); x.sum(); t = time.perf_counter(); n = 0
    while time.perf_counter() - t < 0.5: x.sum(); n += 1
    print('torch int32 sum read GB/s, threads', th, round(n * x.numel() * 4 / (time.perf_counter() - t) / 1e9, 1), flush=True)
" > $w/stream.txt 2>&1; cat $w/stream.txt
for th in 1 14; do for t in new pfT1 pf0 pf8k noperm; do
  d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 60 python3 $w/gbs.py $t $th bf16:1 int4:1 int8:1) >> $w/gbs.txt 2>&1
done; done
(cd $PWD && timeout -s ABRT 60 python3 $w/gbs.py new 1 int4:1:avx512 bf16:1:avx2_fma) >> $w/gbs.txt 2>&1
(cd $PWD && timeout -s ABRT 60 python3 $w/gbs.py new 14 int4:1:avx512 bf16:1:avx2_fma) >> $w/gbs.txt 2>&1
cat $w/gbs.txt; pack; el routes
for t in new m0; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 90 python3 $w/gbs.py $t 14 bf16:8,16,32,64 int8:16,32) >> $w/routes.txt 2>&1; done
cat $w/routes.txt; pack
dec() {  # format tag
  [ $(left) -gt 90 ] || return 1
  el decode $*; a="--quant $1"; [ $1 = bf16 ] && a=""
  timeout -s ABRT 120 $ft $PWD bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB --moe-policy adaptive,fetch,cpu \
    --routing uniform --tokens 64 --repeats 3 --out $w/decode_$1_$2.json > $w/decode_$1_$2.txt 2>&1; grep "│" $w/decode_$1_$2.txt | cut -c1-200; pack
}
dec bf16 a; dec int4 a
pre() {  # tree format budgets tag
  [ $(left) -gt 45 ] || return 1
  el prefill $*; a="--quant $2"; [ $2 = bf16 ] && a=""
  timeout -s ABRT 70 $ft $(tree $1) bench prefill --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget $3 --lengths 16384 \
    --follow-up 200 --mode adaptive --repeats 3 --out $w/prefill_$1_$2_$4.json > $w/prefill_$1_$2_$4.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/prefill_$1_$2_$4.json'))
for r in d['rows']: print('$1 $2', r['prompt'], round(r['budget_gib'],2), round(r['ttft_s'],4), [round(x,3) for x in r['ttft_runs']], r.get('of_floor') and round(r['of_floor'],3), 'link', round(r['moved_gib'],2), 'cpu', round(r.get('cpu_gib', 0),2), r['streamed_layers'])"
  pack
}
pre v3 bf16 1152MiB a; pre m0 bf16 1152MiB a; pre v3 int8 1152MiB a; pre m0 int8 1152MiB a
pre v3 bf16 1152MiB b; pre m0 bf16 1152MiB b
el done; pack
