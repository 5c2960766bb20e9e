#!/usr/bin/env bash
# Cold start: main, early2 (the experts read from before the import, pages zeroed ahead) and early3 (early2 whose read
# waits while the dense weights are read), alternating on the 8-layer checkpoint built here.
# needs, beside the tracked files: .probe/c5.sh .probe/ft.sh .probe/ab/{early2,early3} .whl
set -u
out=$1; w=/tmp/c5; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c5.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
el executors; PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 150 python3 -c \
  "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build.txt 2>&1
el checkpoint; { PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 120 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 100 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -c 100 $w/checkpoint.txt
for run in main:0 early3:0 main:1 early3:1 early2:1 main:2 early3:2 early2:2 main:3 early3:3; do
  [ -d /tmp/q30b8/ftw ] && [ $(left) -gt 40 ] || break
  t=${run%:*}; i=${run#*:}; d=$PWD; [ $t != main ] && d=$A/$t
  el startup $t $i; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc_$t timeout -s ABRT 60 $ft $d bench startup \
    /tmp/q30b8/ftw --cpu-threads 8 --out $w/startup_${t}_$i.json > $w/startup_${t}_$i.txt 2>&1
  grep -E "populate|import|device|dense|wait|ready" $w/startup_${t}_$i.txt | cut -c1-60 | tr -s ' ' | tr '\n' ' '; echo; pack
done; el done
