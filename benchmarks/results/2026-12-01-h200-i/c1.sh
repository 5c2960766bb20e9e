#!/usr/bin/env bash
# Next session's first call: the hybrid agent session at 64k now that the synthetic Qwen3.5 shape holds 262,144
# tokens (the 64k rows of the nineteenth run ended each turn at its first token), and 32k again; the demo's greedy
# and penalty tests on CUDA (the penalty's mask kept on the device); the all-resident / 1/8 16k prefill again.
# needs, beside the tracked files: .probe/n7.sh .whl
set -u
out=$1; w=/tmp/n7; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache PYTHONPATH=$PWD:/tmp/site
pack() { tar czf $out/n7.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/
el tests; timeout -s ABRT 100 python3 -m pytest -q -rf -p no:cacheprovider --engine-device cuda tests/test_demo.py \
  -k "greedy or repetition" > $w/tests.txt 2>&1; tail -2 $w/tests.txt
timeout -s ABRT 90 python3 -m pytest -q -rf -p no:cacheprovider tests/test_triton_kernels.py -k "paged or flash" > $w/attn_tests.txt 2>&1; tail -2 $w/attn_tests.txt
el profile; python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1
for n in 64000 32000; do
  [ $(left) -gt 150 ] || break
  el agent $n; timeout -s ABRT $(( $(left) - 60 )) python3 -m freetoken_cli.main bench agent --synthetic qwen3.5-35b-a3b --layers 16 \
    --cpu-threads 8 --expert-budget 8GiB --system-tokens $n --out $w/agent_$n.json > $w/agent_$n.txt 2> $w/agent_$n.err; tail -11 $w/agent_$n.txt; pack
done
for b in 16GiB 1152MiB; do
  [ $(left) -gt 40 ] || break
  el prefill $b; timeout -s ABRT 60 python3 -m freetoken_cli.main bench prefill --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 \
    --expert-budget $b --lengths 16384 --follow-up 200 --mode adaptive --repeats 5 --out $w/prefill_$b.json > $w/prefill_$b.txt 2>&1
  grep -E "cold|after" $w/prefill_$b.txt; pack
done; el done
