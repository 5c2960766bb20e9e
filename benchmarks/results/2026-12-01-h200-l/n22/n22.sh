#!/usr/bin/env bash
# Prefill with every expert resident mapping routes to slots on the device (no plan, no wait for each layer's
# router) and the grouped GEMMs' tiles built on the device (no wait either; branch lookahead, the working tree)
# against main (.probe/ab/main22): bench prefill all resident and at
# 1152 MiB (unchanged there: the control), 16k cold and a 200-token follow-up, the trees alternating, two rounds.
# needs, beside the tracked files: .probe/n22.sh .probe/ft.sh .probe/ab/main22 .whl
set -u
out=$1; w=/tmp/n22; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n22.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/
ft="$PWD/.probe/ft.sh"; new=$PWD; old=$PWD/.probe/ab/main22
for t in $new $old; do
  el executors $t; (cd $t && PYTHONPATH=$t:/tmp/site timeout -s ABRT 150 python3 -c \
    "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
el profile; timeout -s ABRT 60 $ft $new profile --cpu-threads 8 --json > $w/profile.txt 2>&1
for r in 1 2; do
  for b in 16GiB 1152MiB; do
    for t in new old; do
      [ $(left) -gt 60 ] || break 3
      [ $t = new ] && d=$new || d=$old
      el prefill $b $t $r; timeout -s ABRT 120 $ft $d bench prefill --synthetic qwen3-30b-a3b --layers 8 --cpu-threads 8 \
        --expert-budget $b --lengths 16384 --follow-up 200 --mode adaptive --repeats 5 \
        --out $w/prefill_${b}_${t}_$r.json > $w/prefill_${b}_${t}_$r.txt 2>&1
      tail -6 $w/prefill_${b}_${t}_$r.txt | cut -c1-160; pack
    done
  done
done; el done
