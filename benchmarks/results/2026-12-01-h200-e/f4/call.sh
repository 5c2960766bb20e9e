#!/usr/bin/env bash
# sixteenth run, call 4: hybrid agent session with a 32,000-token system prompt; then the cold start of the 8-layer
# Qwen3 checkpoint on disk (as h200.sh startup, without its GPU tests and profile)
# needs, beside the tracked files: ".probe/f4.sh", ".whl"
set -u
out=$1; w=/tmp/f4; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache PYTHONPATH=$PWD:/tmp/site
pack() { tar czf $out/f4.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( $1 - ($(date +%s) - t0) )); }
cp $0 $w/call.sh
el agent; timeout -s ABRT 230 python3 -m freetoken_cli.main bench agent --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 \
  --expert-budget 8GiB --system-tokens 32000 --out $w/agent.json > $w/agent.txt 2> $w/agent.err; tail -11 $w/agent.txt; pack
el checkpoint; { timeout -s ABRT $(left 400) python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  timeout -s ABRT $(left 470) python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -2 $w/checkpoint.txt
for run in cold warm; do
  [ $(left 530) -gt 20 ] || break
  el startup $run; FREETOKEN_CACHE=/tmp/ftc2 timeout -s ABRT $(left 540) python3 -m freetoken_cli.main bench startup /tmp/q30b8/ftw --cpu-threads 8 \
    --out $w/startup_$run.json > $w/startup_$run.txt 2>&1; cat $w/startup_$run.txt; pack
done; el done
