#!/usr/bin/env bash
# Call 1b (right after next1.sh, same machine): A/B of branch partialstream (prefill streams only the non-resident experts, copies overlap the
# current layer) against main: the hybrid agent session at a 32k-token system prompt, and the 8-layer Qwen3 16k prefill
# at a budget where streaming is usable (4 GiB >= 3 layers of experts) and all resident.
# Before: b=partialstream; rm -rf .probe/ab/$b; mkdir -p .probe/ab/$b; git archive $b engine kernels ftw freetoken_cli tests pyproject.toml | tar -x -C .probe/ab/$b; rm -f .probe/ab/$b/engine/demo/model/*.safetensors
# needs, beside the tracked files: ".probe/next1b.sh", ".probe/ab", ".whl"
set -u
out=$1; w=/tmp/n1b; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n1b.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh
[ -f /tmp/n1/profile.json ] || (PYTHONPATH=$PWD:/tmp/site python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1)
for tree in main partialstream; do
  root=$PWD; [ $tree = main ] || root=$PWD/.probe/ab/$tree
  el agent $tree; (cd $root && PYTHONPATH=$root:/tmp/site timeout -s ABRT 200 python3 -m freetoken_cli.main bench agent \
    --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 --expert-budget 8GiB --system-tokens 32000 \
    --out $w/agent_$tree.json > $w/agent_$tree.txt 2> $w/agent_$tree.err); tail -11 $w/agent_$tree.txt; pack
done; el done
