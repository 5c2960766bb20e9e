#!/usr/bin/env bash
# g4: one residency read a chunk and no host route reads on streamed layers (new) against 54756e4 (prev): 16k at 1152 MiB, int8 / fp8 / bf16 / int4 alternating; a timeline of the new int8 cold prompt.
set -u
out=$1; w=/tmp/g4; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/g4.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 560 - ($(date +%s) - t0) )); }
cp $0 .probe/pprof.py $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
el build; (PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
pre() {  # tree format tag
  [ $(left) -gt 75 ] || return 1
  el prefill $*; a="--quant $2"; [ $2 = bf16 ] && a=""
  timeout -s ABRT 75 $ft $(tree $1) bench prefill --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB,16GiB --lengths 16384 \
    --follow-up 200 --mode adaptive --repeats 5 --out $w/prefill_$1_$2_$3.json > $w/prefill_$1_$2_$3.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/prefill_$1_$2_$3.json'))
for r in d['rows']: print('$1 $2', r['prompt'], round(r['budget_gib'],2), round(r['ttft_s'],4), [round(x,3) for x in r['ttft_runs']], r.get('of_floor') and round(r['of_floor'],3), round(r['moved_gib'],2), r['streamed_layers'], r.get('stream_passes'))" | tee -a $w/summary.txt
  pack
}
prof() { [ $(left) -gt 70 ] || return 1; el prof $1; (cd $(tree $1) && PYTHONPATH=$(tree $1) timeout -s ABRT 70 python3 $w/pprof.py $w $1 int8) > $w/prof_$1.txt 2>&1; tail -3 $w/prof_$1.txt; pack; }
pre new int8 a; pre prev int8 a; pre new fp8 a; pre prev fp8 a
prof new
pre new int8 b; pre prev int8 b; pre new fp8 b; pre prev fp8 b
pre new bf16 a; pre prev bf16 a; pre new int4 a; pre prev int4 a
pre new int8 c; pre prev int8 c; pre new fp8 c; pre prev fp8 c
[ $(left) -gt 100 ] && { el tests; PYTHONPATH=$PWD timeout -s ABRT 90 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_prefill.py tests/test_policies.py tests/test_expert_memory.py > $w/tests.txt 2>&1; tail -2 $w/tests.txt; pack; }
el done; pack
