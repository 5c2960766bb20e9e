#!/usr/bin/env bash
# sixteenth run, call 3: hybrid agent session with a 16,000-token system prompt (main; JIT compiles and autotuning logged)
# needs, beside the tracked files: ".probe/f3.sh", ".probe/jitlog.py", ".whl"
set -u
out=$1; w=/tmp/f3; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache PYTHONPATH=$PWD:/tmp/site TRITON_PRINT_AUTOTUNING=1
pack() { tar czf $out/f3.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh
el agent; timeout -s ABRT 300 python3 .probe/jitlog.py bench agent --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 \
  --expert-budget 8GiB --system-tokens 16000 --out $w/agent.json > $w/agent.txt 2> $w/agent.err; tail -11 $w/agent.txt; pack; el done
