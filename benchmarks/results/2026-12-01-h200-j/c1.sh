#!/usr/bin/env bash
# 1. The hybrid 16k cold prefill: main (1.22-1.33 s in the twentieth run's calls 3-4) against the tree before the
#    262,144-token shape (36fec87^, .probe/ab/preshape) and the tree before FlashAttention prefill (3e1e357^ =
#    0745e1d, .probe/ab/prefa, which measured 0.684 s in the nineteenth run's call 2).
# 2. Cold start, main against earlyexperts (cf7fe6d, .probe/ab/early: the experts' read begins before torch is
#    imported), alternating, on the 8-layer Qwen3-30B-A3B-shaped checkpoint built here.
# needs, beside the tracked files: .probe/c1.sh .probe/ft.sh .probe/ab/prefa .probe/ab/preshape .probe/ab/early .whl
set -u
out=$1; w=/tmp/c1; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
el executors; for d in $A/prefa $PWD; do (cd $d && PYTHONPATH=$d:/tmp/site timeout -s ABRT 150 python3 -c \
  "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$(basename $d).txt 2>&1); done
el profile; $ft $PWD profile --json --cpu-threads 8 > $w/profile.json 2>&1
for tree in main preshape prefa; do
  d=$PWD; [ $tree != main ] && d=$A/$tree
  el hybrid $tree; timeout -s ABRT 80 $ft $d bench prefill --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 \
    --expert-budget 8GiB --lengths 16384 --follow-up 0 --mode adaptive --repeats 3 --out $w/hprefill_$tree.json > $w/hprefill_$tree.txt 2>&1
  grep -E "cold" $w/hprefill_$tree.txt || tail -3 $w/hprefill_$tree.txt; pack
done
el checkpoint; { PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 120 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 100 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -c 100 $w/checkpoint.txt
for run in main:0 early:0 main:1 early:1 main:2 early:2; do
  [ -d /tmp/q30b8/ftw ] && [ $(left) -gt 50 ] || break
  t=${run%:*}; i=${run#*:}; d=$PWD; [ $t = early ] && d=$A/early
  el startup $t $i; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc_$t timeout -s ABRT 60 $ft $d bench startup \
    /tmp/q30b8/ftw --cpu-threads 8 --out $w/startup_${t}_$i.json > $w/startup_${t}_$i.txt 2>&1
  grep -E "import|dense|wait|ready" $w/startup_${t}_$i.txt | cut -c1-100; pack
done; el done
