#!/usr/bin/env bash
# Cold start A/B of branch earlyread (the dense read starts before the device is picked) against main, with the new
# phases (setup, header, driver): build + convert the 8-layer Qwen3-30B-A3B checkpoint, then bench startup twice per
# tree with bytecode kept (as a user's install has it); then the hybrid GPU tests call 4 did not reach; then the
# VDPBF16PS probe (chains and rows per core: why the executor's multi-route compute per core is ~5x below the CPU machine's).
# Before: as in next_s1.sh (exports .probe/ab/earlyread)
# needs, beside the tracked files: ".probe/next_s2.sh", ".probe/dpbf16.py", ".probe/ab", ".whl"
set -u
out=$1; w=/tmp/s2; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/s2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh
el checkpoint; { PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 200 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 150 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -1 $w/checkpoint.txt
[ -f /tmp/ftcache/profile* ] || PYTHONPATH=$PWD:/tmp/site python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1
for run in main1 earlyread1 main2 earlyread2; do
  tree=${run%?}; root=$PWD; [ $tree = main ] || root=$PWD/.probe/ab/$tree
  el startup $run; (cd $root && env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc_$tree PYTHONPATH=$root:/tmp/site \
    timeout -s ABRT 60 python3 -m freetoken_cli.main bench startup /tmp/q30b8/ftw --cpu-threads 8 \
    --out $w/startup_$run.json > $w/startup_$run.txt 2>&1); grep -E "import|setup|header|driver|dense|ready|prefill" $w/startup_$run.txt; pack
done
el hybrid tests; PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 150 python3 -m pytest -q -p no:cacheprovider -rf --engine-device cuda \
  tests/test_hybrid.py -k "batched or preempted or restore or scheduler or follow or pool or anchor" > $w/hybrid_tests.txt 2>&1; tail -3 $w/hybrid_tests.txt; pack
el dpbf16; cp .probe/dpbf16.py $w/; PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 150 python3 .probe/dpbf16.py > $w/dpbf16.txt 2>&1; tail -4 $w/dpbf16.txt; pack; el done
