#!/usr/bin/env bash
# A decode step's inputs moved to the device each on its own, in one pageable copy, or in one pinned copy
# (hoststep2.py, one process, taking turns), then bench decode on main before (.probe/ab/b19) and the working
# tree (one copy of a step's inputs, one argmax for a batch's greedy rows): bf16 all resident and int4 at
# 1152 MiB, batch 1 and 8.
# needs, beside the tracked files: .probe/n20.sh .probe/hoststep2.py .probe/ft.sh .probe/ab/b19 .whl
set -u
out=$1; w=/tmp/n20; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n20.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 320 - ($(date +%s) - t0) )); }
cp $0 .probe/hoststep2.py $w/
ft="$PWD/.probe/ft.sh"; new=$PWD; old=$PWD/.probe/ab/b19
for t in $new $old; do
  el executors $t; (cd $t && PYTHONPATH=$t:/tmp/site timeout -s ABRT 150 python3 -c \
    "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
el profile; timeout -s ABRT 60 $ft $new profile --cpu-threads 8 --json > $w/profile.txt 2>&1
el hoststep2; PYTHONPATH=$new:/tmp/site timeout -s ABRT 120 python3 $w/hoststep2.py > $w/host.txt 2>&1; grep medians $w/host.txt; pack
for q in bf16 int4; do
  for t in new old; do
    [ $(left) -gt 45 ] || break 2
    [ $t = new ] && d=$new || d=$old; qa="--expert-budget 16GiB"; [ $q = int4 ] && qa="--quant int4 --expert-budget 1152MiB"
    el decode $q $t; timeout -s ABRT 80 $ft $d bench decode --synthetic qwen3-30b-a3b --layers 8 $qa --cpu-threads 8 \
      --moe-policy adaptive --routing uniform --batch 1,8 --tokens 64 --repeats 5 --out $w/decode_${q}_$t.json > $w/decode_${q}_$t.txt 2>&1
    python3 -c "import json,sys; [print(f\"  {r['budget_gib']:.1f} GiB b{r['batch']}: {r['tok_s']:.1f} tok/s\") for r in json.load(open(sys.argv[1]))['rows']]" $w/decode_${q}_$t.json 2>&1 | head -4
    pack
  done
done; el done
