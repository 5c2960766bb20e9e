#!/usr/bin/env bash
# Cold start A/B of branch bothreads (the expert read starts with the dense read) against main, with the split
# cache/experts phases: the 8-layer Qwen3-30B-A3B checkpoint (its random weights now drawn on the GPU), then
# bench startup twice per tree with bytecode kept; then where the 1/8-budget 16k prefill's time goes (torch.profiler).
# needs, beside the tracked files: .probe/n1.sh .probe/prefill_prof.py .probe/ab .whl
set -u
out=$1; w=/tmp/n1; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 .probe/prefill_prof.py $w/
el checkpoint; { PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 200 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 150 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -c 200 $w/checkpoint.txt
el profile; PYTHONPATH=$PWD:/tmp/site python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1
for run in main1 bothreads1 main2 bothreads2 main3 bothreads3; do
  [ -d /tmp/q30b8/ftw ] && [ $(left) -gt 200 ] || break
  tree=${run%?}; root=$PWD; [ $tree = main ] || root=$PWD/.probe/ab/$tree
  el startup $run; (cd $root && env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc_$tree PYTHONPATH=$root:/tmp/site \
    timeout -s ABRT 60 python3 -m freetoken_cli.main bench startup /tmp/q30b8/ftw --cpu-threads 8 \
    --out $w/startup_$run.json > $w/startup_$run.txt 2>&1); grep -E "cache|experts|dense|ready|wait" $w/startup_$run.txt; pack
done
[ $(left) -gt 60 ] && el prefill profile && PYTHONPATH=$PWD:/tmp/site timeout -s ABRT $(( $(left) - 10 )) python3 .probe/prefill_prof.py $w/prof 1152MiB 16GiB > $w/prof.txt 2>&1; tail -3 $w/prof.txt
gzip $w/prof/trace_*.json; pack; el done
