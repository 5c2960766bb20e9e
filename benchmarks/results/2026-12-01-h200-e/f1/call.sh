#!/usr/bin/env bash
# sixteenth run, call 1: A/B of branch scansplit against main on the hybrid agent session (2,000- and 16,000-token system prompts)
# needs, beside the tracked files: ".probe/f1.sh", ".probe/ab", ".whl"
set -u
out=$1; w=/tmp/f1; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/f1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh; nvidia-smi > $w/env.txt; lscpu >> $w/env.txt
hy="--synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 --expert-budget 8GiB"
root() { [ $1 = main ] && echo $PWD || echo $PWD/.probe/ab/$1; }
r=$(root scansplit); el profile; (cd $r && PYTHONPATH=$r:/tmp/site timeout -s ABRT 90 python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1); tail -c 600 $w/profile.json; echo
for spec in "main 2000 140" "scansplit 2000 140" "scansplit 16000 170" "main 16000 170"; do
  set -- $spec; r=$(root $1); el agent $1 sys $2
  (cd $r && PYTHONPATH=$r:/tmp/site timeout -s ABRT $3 python3 -m freetoken_cli.main bench agent $hy --system-tokens $2 \
    --out $w/agent_$1_$2.json > $w/agent_$1_$2.txt 2> $w/agent_$1_$2.err); tail -11 $w/agent_$1_$2.txt; pack
done; el done
