#!/usr/bin/env bash
# g11 (prepared): the merge kernel waits for the CPU branch's answer itself, only in a layer step with a CPU route
# (next/merge_wait.patch), against main (the working tree), alternating; the GPU tests of the patched tree first.
# Before the call: mkdir -p .probe/ab/wait && git archive HEAD engine kernels ftw freetoken_cli tests pyproject.toml |
#   tar x -C .probe/ab/wait && rm -rf .probe/ab/wait/engine/demo/model &&
#   (cd .probe/ab/wait && patch -p1 < ../../../benchmarks/results/2026-12-03-h200-iv/next/merge_wait.patch);
# copy this script and ft.sh into .probe/; run(command="bash .probe/g11.sh $OUT", carry=[".probe"]).
set -u
out=$1; w=/tmp/g11; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/g11.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 560 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab; T=$PWD/benchmarks/traces/qwen3-30b-a3b-proxy.npy
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
el build; (PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
(cd $A/wait && PYTHONPATH=$A/wait timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
summ() { python3 -c "
import json; d=json.load(open('$w/$1.json'))
for r in d['rows']: print('$1', r['routing'], round(r['budget_gib'], 2), r['policy'], round(r['tok_s'], 1), round(r['hit_rate'], 4), round(r['fetched'], 3), round(r['cpu'], 3), round(r['tok_s'] / r['bound_tok_s'], 3))" | tee -a $w/summary.txt; }
el tests; (cd $A/wait && PYTHONPATH=$A/wait timeout -s ABRT 150 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda \
  tests/test_triton_kernels.py tests/test_graphs.py tests/test_policies.py -k "plan or merge or graph or adaptive or poller or branch") > $w/tests.txt 2>&1
tail -2 $w/tests.txt; pack
grep -q " passed" $w/tests.txt && ! grep -q "failed\|error" $w/tests.txt || { el "tests did not pass: no A/B"; pack; exit 0; }
dec() {  # tree tag
  [ $(left) -gt 70 ] || return 1
  el decode $*
  timeout -s ABRT 60 $ft $(tree $1) bench decode --synthetic qwen3-30b-a3b --layers 8 --moe-policy adaptive --routing trace:$T,uniform \
    --expert-budget 1152MiB,2731MiB,8GiB --tokens 64 --repeats 3 --out $w/dec_$1_$2.json > $w/dec_$1_$2.txt 2>&1
  summ dec_$1_$2; pack
}
dec new a; dec wait a; dec new b; dec wait b; dec new c; dec wait c
el done; pack
