#!/usr/bin/env bash
# The hybrid agent session at the contexts agents send (16k, 32k, 64k of system prompt), 8 GiB, checkpoints on/off
# (issue 24's ratio grows with the context the edit makes the "off" side re-prefill).
# First prefetchnext at 32k (against main's 32k rows of the eighteenth run, s1/agent_main.json).
# needs, beside the tracked files: .probe/n4.sh .probe/ab .whl
set -u
out=$1; w=/tmp/n4; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache PYTHONPATH=$PWD:/tmp/site
pack() { tar czf $out/n4.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/
[ -f /tmp/ftcache/profile* ] || python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1
root=$PWD/.probe/ab/prefetchnext
el agent prefetchnext 32000; (cd $root && PYTHONPATH=$root:/tmp/site timeout -s ABRT 170 python3 -m freetoken_cli.main bench agent \
  --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 --expert-budget 8GiB --system-tokens 32000 \
  --out $w/agent_prefetchnext_32000.json > $w/agent_prefetchnext_32000.txt 2> $w/agent_prefetchnext_32000.err); tail -11 $w/agent_prefetchnext_32000.txt; pack
for n in 64000 16000; do
  lim=240; [ $n = 16000 ] && lim=110
  el agent $n; timeout -s ABRT $lim python3 -m freetoken_cli.main bench agent --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 \
    --expert-budget 8GiB --system-tokens $n --out $w/agent_$n.json > $w/agent_$n.txt 2> $w/agent_$n.err; tail -11 $w/agent_$n.txt; pack
done; el done
