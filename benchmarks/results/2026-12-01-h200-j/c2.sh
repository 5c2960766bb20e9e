#!/usr/bin/env bash
# 1. Decode at depth on main (page table from the per-sequence int32 copy, 99370e0): 32k against 1k, all resident.
# 2. cudaHostRegister timings of a 9 GiB anonymous mapping (pinprobe.py).
# 3. Cold start: main, earlyexperts (cf7fe6d), and two variants of it: the mapping MAP_POPULATE'd at its creation
#    (earlypop), and the store's page-lock taken after the early read instead of while it runs (earlylate).
# needs, beside the tracked files: .probe/c2.sh .probe/ft.sh .probe/pinprobe.py .probe/ab/{early,earlypop,earlylate} .whl
set -u
out=$1; w=/tmp/c2; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
el executors; PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 150 python3 -c \
  "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build.txt 2>&1
el checkpoint; { PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 120 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 100 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -c 100 $w/checkpoint.txt
el depth; timeout -s ABRT 150 $ft $PWD bench decode --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 --moe-policy adaptive \
  --routing model --tokens 32 --repeats 5 --expert-budget 16GiB --depth 1024,32768 --out $w/depth.json > $w/depth.txt 2>&1
tail -8 $w/depth.txt | cut -c1-150; pack
el pinprobe; PYTHONPATH=/tmp/site timeout -s ABRT 90 python3 .probe/pinprobe.py > $w/pinprobe.txt 2>&1; cat $w/pinprobe.txt; pack
for run in main:0 early:0 earlypop:0 earlylate:0 main:1 early:1 earlypop:1 earlylate:1 main:2 early:2 earlypop:2 earlylate:2; do
  [ -d /tmp/q30b8/ftw ] && [ $(left) -gt 40 ] || break
  t=${run%:*}; i=${run#*:}; d=$PWD; [ $t != main ] && d=$A/$t
  el startup $t $i; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc_$t timeout -s ABRT 60 $ft $d bench startup \
    /tmp/q30b8/ftw --cpu-threads 8 --out $w/startup_${t}_$i.json > $w/startup_${t}_$i.txt 2>&1
  grep -E "populate|import|device|dense|wait|ready" $w/startup_${t}_$i.txt | cut -c1-60 | tr -s ' ' | tr '\n' ' '; echo; pack
done; el done
