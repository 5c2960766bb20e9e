#!/usr/bin/env bash
# (third call) long chunks give the CPU their least routed misses; prefill chunks split with the CPU at its rate for their routes (main) against 03fbc1f (.probe/ab/g16), one machine:
# B_R per format, the executor's rows sweep, 16k + follow-up at 1152 MiB (bf16, int8), the hybrid agent at 64k, GPU tests.
set -u
out=$1; w=/tmp/n3; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n3.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 575 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new g16; do
  d=$(tree $t); el executor $t; (cd $d && PYTHONPATH=$d timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
pre() {  # tree format budgets tag
  [ $(left) -gt 40 ] || return 1
  el prefill $*; a="--quant $2"; [ $2 = bf16 ] && a=""
  timeout -s ABRT 70 $ft $(tree $1) bench prefill --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget $3 --lengths 16384 \
    --follow-up 200 --mode adaptive --repeats 3 --out $w/prefill_$1_$2_$4.json > $w/prefill_$1_$2_$4.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/prefill_$1_$2_$4.json'))
for r in d['rows']: print(r['prompt'], round(r['budget_gib'],2), round(r['ttft_s'],4), [round(x,3) for x in r['ttft_runs']], r.get('of_floor') and round(r['of_floor'],3), 'link', round(r['moved_gib'],2), 'cpu', round(r.get('cpu_gib', 0),2), r['streamed_layers'], r.get('stream_passes'))"
  pack
}
pre new bf16 1152MiB,16GiB a; pre g16 bf16 1152MiB,16GiB a; pre new int8 1152MiB,16GiB a; pre g16 int8 1152MiB,16GiB a
agent() {
  [ $(left) -gt 150 ] || return 1
  el agent $1; timeout -s ABRT 150 $ft $(tree $1) bench agent --synthetic qwen3.5-35b-a3b --layers 16 --expert-budget 8GiB \
    --system-tokens 64000 --out $w/agent_$1.json > $w/agent_$1.txt 2> $w/agent_$1.err
  python3 -c "
import json; d=json.load(open('$w/agent_$1.json')); rows=d['rows'] if isinstance(d, dict) else d
for r in rows: print(r['turn'], round(r['ttft_s_on'],3), round(r['ttft_s_off'],3), round(r['ttft_s_off']/r['ttft_s_on'],2), 'on link', round(r['moved_gib_on'],2), 'cpu', round(r.get('cpu_gib_on',0),2), 'streamed', r['streamed_on'], 'off link', round(r['moved_gib_off'],2), 'cpu', round(r.get('cpu_gib_off',0),2))
" || grep "│" $w/agent_$1.txt | cut -c1-150; pack
}
agent new
[ $(left) -gt 100 ] && { el tests; PYTHONPATH=$PWD timeout -s ABRT 90 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_prefill.py tests/test_policies.py tests/test_expert_memory.py > $w/tests.txt 2>&1; tail -2 $w/tests.txt; pack; }
agent g16
el done
