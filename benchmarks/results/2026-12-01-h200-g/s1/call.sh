#!/usr/bin/env bash
# A/B of branch streamsplit (scan-mode prefill leaves a share of its missing experts to the CPU, streamed layers too)
# against main: its CUDA tests, the machine profile with F_H, the hybrid agent session at 32k and 16k, and the 8-layer
# Qwen3 16k prefill with its 200-token follow-up at 1/8 budget (issue 22's 10%).
# Before: for b in streamsplit earlyread; do rm -rf .probe/ab/$b; mkdir -p .probe/ab/$b; git archive $b engine kernels ftw freetoken_cli tests pyproject.toml | tar -x -C .probe/ab/$b; rm -f .probe/ab/$b/engine/demo/model/*.safetensors; done
# needs, beside the tracked files: ".probe/next_s1.sh", ".probe/ab", ".whl"
set -u
out=$1; w=/tmp/s1; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/s1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh
br=$PWD/.probe/ab/streamsplit
el profile; (cd $br && PYTHONPATH=$br:/tmp/site python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1)
el tests; (cd $br && PYTHONPATH=$br:/tmp/site timeout -s ABRT 90 python3 -m pytest -q -p no:cacheprovider -rf --engine-device cuda \
  tests/test_prefill.py tests/test_policies.py > $w/gpu_tests.txt 2>&1); tail -3 $w/gpu_tests.txt; pack
for tree in main streamsplit; do
  root=$PWD; [ $tree = main ] || root=$br
  el agent $tree; (cd $root && PYTHONPATH=$root:/tmp/site timeout -s ABRT 150 python3 -m freetoken_cli.main bench agent \
    --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 --expert-budget 8GiB --system-tokens 32000 \
    --out $w/agent_$tree.json > $w/agent_$tree.txt 2> $w/agent_$tree.err); tail -11 $w/agent_$tree.txt; pack
  for b in 1152MiB 4GiB; do
  el prefill $tree $b; (cd $root && PYTHONPATH=$root:/tmp/site timeout -s ABRT 60 python3 -m freetoken_cli.main bench prefill \
    --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 --expert-budget $b --lengths 4096,16384 --follow-up 200 \
    --mode adaptive,routed --out $w/prefill_${tree}_$b.json > $w/prefill_${tree}_$b.txt 2>&1); grep -E "cold|after" $w/prefill_${tree}_$b.txt; pack
  done
done; el done
