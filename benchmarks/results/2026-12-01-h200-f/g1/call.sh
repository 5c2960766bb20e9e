#!/usr/bin/env bash
# Call 1 (then next1b.sh on the same machine): A/B of branches partialstream (prefill streams only the non-resident experts, copies
# overlap the current layer) and fillgroups (a long chunk's fetched experts filled and computed in groups) against main: the hybrid agent session at a 32k-token system prompt, and the 8-layer Qwen3 16k prefill
# at a budget where streaming is usable (4 GiB >= 3 layers of experts) and all resident.
# Before: for b in partialstream fillgroups; do rm -rf .probe/ab/$b; mkdir -p .probe/ab/$b; git archive $b engine kernels ftw freetoken_cli tests pyproject.toml | tar -x -C .probe/ab/$b; rm -f .probe/ab/$b/engine/demo/model/*.safetensors; done
# needs, beside the tracked files: ".probe/next1.sh", ".probe/ab", ".whl"
set -u
out=$1; w=/tmp/n1; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh
(PYTHONPATH=$PWD:/tmp/site python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1)
for t in partialstream fillgroups; do
  r=$PWD/.probe/ab/$t; el tests $t; (cd $r && PYTHONPATH=$r:/tmp/site timeout -s ABRT 80 python3 -m pytest -q -p no:cacheprovider \
    --engine-device cuda tests/test_prefill.py tests/test_expert_memory.py > $w/gpu_tests_$t.txt 2>&1); tail -3 $w/gpu_tests_$t.txt
done
for pair in main:1152MiB fillgroups:1152MiB main:4GiB partialstream:4GiB fillgroups:4GiB main:16GiB partialstream:16GiB; do
  tree=${pair%%:*}; b=${pair##*:}; root=$PWD; [ $tree = main ] || root=$PWD/.probe/ab/$tree
  el prefill $tree $b; (cd $root && PYTHONPATH=$root:/tmp/site timeout -s ABRT 70 python3 -m freetoken_cli.main bench prefill \
    --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 --expert-budget $b --lengths 4096,16384 --follow-up 200 \
    --mode adaptive,routed --out $w/prefill_${tree}_$b.json > $w/prefill_${tree}_$b.txt 2>&1); grep -E "cold|after" $w/prefill_${tree}_$b.txt; pack
done; el done
