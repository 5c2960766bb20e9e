#!/usr/bin/env bash
# FlashAttention for prefill (a causal mask aligned to the last key) against the masked SDPA it replaces (base = the
# tree before): kernel parity tests, the attention alone, end to end; bench prefill 16k at all resident and 1/8 budget
# side by side; startup with the CPU executor's library loaded from the cache directory, one start's stacks sampled;
# the import's cost; the hybrid agent session at 32k and 64k.
# needs, beside the tracked files: .probe/n5.sh .probe/attn_flash.py .probe/sample.py .probe/ab/base .whl
set -u
out=$1; w=/tmp/n5; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n5.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 580 - ($(date +%s) - t0) )); }
cp $0 .probe/attn_flash.py .probe/sample.py $w/
base=$PWD/.probe/ab/base
el tests; PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 90 python3 -m pytest -q -rf -p no:cacheprovider tests/test_triton_kernels.py \
  -k "paged or flash" > $w/tests.txt 2>&1; tail -2 $w/tests.txt
el attention; PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 120 python3 .probe/attn_flash.py $w/attn.json > $w/attn.txt 2>&1; tail -9 $w/attn.txt; pack
el profile; PYTHONPATH=$PWD:/tmp/site python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1
for run in new:16GiB base:16GiB new:1152MiB base:1152MiB; do
  [ $(left) -gt 300 ] || break
  t=${run%:*}; b=${run#*:}; root=$PWD; [ $t = new ] || root=$base
  el prefill $t $b; (cd $root && PYTHONPATH=$root:/tmp/site timeout -s ABRT 70 python3 -m freetoken_cli.main bench prefill \
    --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 --expert-budget $b --lengths 16384 --follow-up 200 \
    --mode adaptive --repeats 5 --out $w/prefill_${t}_$b.json > $w/prefill_${t}_$b.txt 2>&1); grep -E "cold|after" $w/prefill_${t}_$b.txt; pack
done
[ $(left) -gt 200 ] && { el checkpoint; { PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 120 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 100 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -c 100 $w/checkpoint.txt; }
for run in 1 2 3; do
  [ -d /tmp/q30b8/ftw ] && [ $(left) -gt 150 ] || break
  s=""; [ $run = 3 ] && s=".probe/sample.py $w/stacks.txt"
  el startup $run; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc_new PYTHONPATH=$PWD:/tmp/site \
    timeout -s ABRT 60 python3 ${s:--m freetoken_cli.main} bench startup /tmp/q30b8/ftw --cpu-threads 8 \
    --out $w/startup_$run.json > $w/startup_$run.txt 2>&1; grep -E "import|device|dense|experts|prefill|ready|wait" $w/startup_$run.txt | cut -c1-100; pack
done
env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc_new PYTHONPATH=$PWD:/tmp/site python3 -X importtime -c \
  "import freetoken_cli.main, freetoken_cli.bench, engine.loader, engine.scheduler, engine.bench.startup" 2> $w/importtime.txt
for n in 64000 32000; do
  [ $(left) -gt 100 ] || break
  el agent $n; PYTHONPATH=$PWD:/tmp/site timeout -s ABRT $(( $(left) - 10 )) python3 -m freetoken_cli.main bench agent --synthetic qwen3.5-35b-a3b --layers 16 \
    --cpu-threads 8 --expert-budget 8GiB --system-tokens $n --out $w/agent_$n.json > $w/agent_$n.txt 2> $w/agent_$n.err; tail -11 $w/agent_$n.txt; pack
done; el done
