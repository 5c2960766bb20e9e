#!/usr/bin/env bash
# A decode step's host time, before (.probe/ab/b19: each input copied on its own, a sync per sampled row)
# and after (the working tree: one pinned copy of a step's inputs, one argmax for a batch's greedy rows):
# hoststep.py's breakdown, then bench decode bf16 and int4 at 1152 MiB (uniform) and all resident, batch 1 and 8,
# the trees alternating.
# needs, beside the tracked files: .probe/n19.sh .probe/hoststep.py .probe/ft.sh .probe/ab/b19 .whl
set -u
out=$1; w=/tmp/n19; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n19.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 .probe/hoststep.py $w/
ft="$PWD/.probe/ft.sh"; new=$PWD; old=$PWD/.probe/ab/b19
for t in $new $old; do
  el executors $t; (cd $t && PYTHONPATH=$t:/tmp/site timeout -s ABRT 150 python3 -c \
    "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
el profile; timeout -s ABRT 60 $ft $new profile --cpu-threads 8 --json > $w/profile.txt 2>&1
for t in new old; do
  [ $t = new ] && d=$new || d=$old
  el hoststep $t; (cd $d && PYTHONPATH=$d:/tmp/site timeout -s ABRT 100 python3 $w/hoststep.py bf16 64) > $w/host_$t.txt 2>&1
  grep "medians" $w/host_$t.txt; pack
done
for r in 1 2; do
  for q in bf16 int4; do
    for t in new old; do
      [ $(left) -gt 60 ] || break 3
      [ $t = new ] && d=$new || d=$old; qa=""; [ $q = int4 ] && qa="--quant int4"
      el decode $q $t $r; timeout -s ABRT 120 $ft $d bench decode --synthetic qwen3-30b-a3b --layers 8 $qa --cpu-threads 8 \
        --expert-budget 1152MiB,16GiB --moe-policy adaptive --routing uniform --batch 1,8 --tokens 64 --repeats 3 \
        --out $w/decode_${q}_${t}_$r.json > $w/decode_${q}_${t}_$r.txt 2>&1
      python3 -c "import json,sys; [print(f\"  {r['budget_gib']:.1f} GiB b{r['batch']}: {r['tok_s']:.1f} tok/s\") for r in json.load(open(sys.argv[1]))['rows']]" $w/decode_${q}_${t}_$r.json 2>&1 | head -4
      pack
    done
  done
done; el done
