#!/usr/bin/env bash
# call 5: a streamed pass's slot map copied pinned and queued instead of pageable (which waited for all the queued
# compute, once a pass): main + that (the working tree) and fcb9883 + that (.probe/ab/g15fix: the largest groups
# everywhere), bench prefill 16k +200 at 1152 MiB and all resident; the hybrid agent session at 64k on the working tree.
# needs, beside the tracked files: .probe/c5.sh .probe/ft.sh .probe/ab/g15fix .whl
set -u
out=$1; w=/tmp/c5; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c5.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 268 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new g15fix; do
  d=$(tree $t); el executor $t; (cd $d && PYTHONPATH=$d timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
pre() {  # tree format
  [ $(left) -gt 30 ] || return 1
  el prefill $*; a="--quant $2"; [ $2 = bf16 ] && a=""
  timeout -s ABRT 60 $ft $(tree $1) bench prefill --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB,16GiB --lengths 16384 \
    --follow-up 200 --mode adaptive --repeats 3 --out $w/prefill_$1_$2.json > $w/prefill_$1_$2.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/prefill_$1_$2.json'))
for r in d['rows']: print(r['prompt'], round(r['budget_gib'],2), round(r['ttft_s'],4), [round(x,3) for x in r['ttft_runs']], r.get('of_floor') and round(r['of_floor'],3), round(r['moved_gib'],2), r['streamed_layers'])"
  pack
}
pre new int8; pre g15fix int8; pre new bf16
if [ $(left) -gt 140 ]; then
  el agent; timeout -s ABRT $(( $(left) - 3 )) $ft $PWD bench agent --synthetic qwen3.5-35b-a3b --layers 16 --expert-budget 8GiB \
    --system-tokens 64000 --out $w/agent_new.json > $w/agent_new.txt 2> $w/agent_new.err
  grep "│" $w/agent_new.txt | cut -c1-120; grep "^turn 2" $w/agent_new.txt; pack
fi
pre new fp8; pre g15fix bf16
el done
