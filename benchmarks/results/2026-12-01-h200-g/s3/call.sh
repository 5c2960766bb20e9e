#!/usr/bin/env bash
# Cold start A/B of branch earlyread against main (8-layer Qwen3-30B-A3B checkpoint on disk, bytecode kept), then
# bench prefill with repeats (median of 5) at 1/8 budget and all resident: issue 22's 1.1x and 10%.
# needs, beside the tracked files: ".probe/next_s3.sh", ".probe/ab", ".whl"
set -u
out=$1; w=/tmp/s3; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/s3.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh
{ df -h /tmp; free -g; grep -i dirty /proc/meminfo; } > $w/machine.txt
el checkpoint; { PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 300 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 150 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -c 300 $w/checkpoint.txt
{ df -h /tmp; free -g; grep -i dirty /proc/meminfo; } >> $w/machine.txt
el profile; PYTHONPATH=$PWD:/tmp/site python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1
for run in main1 earlyread1 main2 earlyread2; do
  [ -d /tmp/q30b8/ftw ] || break
  tree=${run%?}; root=$PWD; [ $tree = main ] || root=$PWD/.probe/ab/$tree
  el startup $run; (cd $root && env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc_$tree PYTHONPATH=$root:/tmp/site \
    timeout -s ABRT 60 python3 -m freetoken_cli.main bench startup /tmp/q30b8/ftw --cpu-threads 8 \
    --out $w/startup_$run.json > $w/startup_$run.txt 2>&1); grep -E "import|setup|header|driver|dense|ready|prefill" $w/startup_$run.txt; pack
done
for b in 1152MiB 16GiB; do
  el prefill $b; PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 100 python3 -m freetoken_cli.main bench prefill \
    --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 --expert-budget $b --lengths 16384 --follow-up 200 \
    --mode adaptive,routed --repeats 5 --out $w/prefill_$b.json > $w/prefill_$b.txt 2>&1; grep -E "cold|after" $w/prefill_$b.txt; pack
done; el done
