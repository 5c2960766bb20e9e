#!/usr/bin/env bash
# next session's first call: main (the scoped small groups, pinned slot maps) against fcb9883 (.probe/ab/g15) on one
# machine: 16k + follow-up at 1152 MiB (int8, fp8, bf16) and at 2 GiB int8 (three layers fit: small groups for the
# follow-up now), alternating; the hybrid agent session at 64k on main; GPU tests of the prefill.
# needs, beside the tracked files: .probe/n1.sh .probe/ft.sh .probe/ab/g15 .whl (fla-core, flash-linear-attention, einops)
set -u
out=$1; w=/tmp/n1; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new g15; do
  d=$(tree $t); el executor $t; (cd $d && PYTHONPATH=$d timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
el rows; timeout -s ABRT 90 env PYTHONPATH=$PWD:/tmp/site python3 -c "
from kernels.cpu_executor import expert_gbps
for f in ('bf16','int8','fp8','int4'):
    print(f, [(t, round(expert_gbps(f, 14, seconds=0.4, tokens=t),1)) for t in (1,2,4,8,12,16,32)], flush=True)
" > $w/rows.txt 2>&1; cat $w/rows.txt; pack
pre() {  # tree format budgets tag
  [ $(left) -gt 40 ] || return 1
  el prefill $*; a="--quant $2"; [ $2 = bf16 ] && a=""
  timeout -s ABRT 70 $ft $(tree $1) bench prefill --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget $3 --lengths 16384 \
    --follow-up 200 --mode adaptive --repeats 3 --out $w/prefill_$1_$2_$4.json > $w/prefill_$1_$2_$4.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/prefill_$1_$2_$4.json'))
for r in d['rows']: print(r['prompt'], round(r['budget_gib'],2), round(r['ttft_s'],4), [round(x,3) for x in r['ttft_runs']], r.get('of_floor') and round(r['of_floor'],3), round(r['moved_gib'],2), r['streamed_layers'], r.get('stream_passes'))"
  pack
}
pre new int8 1152MiB,16GiB a; pre g15 int8 1152MiB,16GiB a; pre new int8 2GiB,16GiB b; pre g15 int8 2GiB,16GiB b
if [ $(left) -gt 170 ]; then
  el agent; timeout -s ABRT 160 $ft $PWD bench agent --synthetic qwen3.5-35b-a3b --layers 16 --expert-budget 8GiB \
    --system-tokens 64000 --out $w/agent_new.json > $w/agent_new.txt 2> $w/agent_new.err
  grep "│" $w/agent_new.txt | cut -c1-120; grep "^turn 2" $w/agent_new.txt; pack
fi
pre new fp8 1152MiB,16GiB a; pre g15 fp8 1152MiB,16GiB a; pre new bf16 1152MiB,16GiB a; pre g15 bf16 1152MiB,16GiB a
[ $(left) -gt 60 ] && { el tests; PYTHONPATH=$PWD timeout -s ABRT 55 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_prefill.py > $w/tests.txt 2>&1; tail -2 $w/tests.txt; pack; }
el done
