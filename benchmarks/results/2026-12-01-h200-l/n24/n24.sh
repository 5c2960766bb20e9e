#!/usr/bin/env bash
# Steps built and sampled without waiting for the stream (the batch's and the sampler's host-to-device copies
# non-blocking; top-k by topk, not a sort of the vocabulary; the working tree) against main 9522338 (.probe/ab/la:
# steps run ahead, but each one's batch build waits for the step before it): the scheduler's GPU tests, then bench
# decode alternating, bf16 1152 MiB and all resident, sampled (a model's defaults) all resident, int4 1152 MiB.
# needs, beside the tracked files: .probe/n24.sh .probe/ft.sh .probe/sampled.py .probe/ab/la .whl
set -u
out=$1; w=/tmp/n24; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n24.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 400 - ($(date +%s) - t0) )); }
cp $0 $w/
ft="$PWD/.probe/ft.sh"; new=$PWD; old=$PWD/.probe/ab/la
for t in $new $old; do
  el executors $t; (cd $t && PYTHONPATH=$t:/tmp/site timeout -s ABRT 150 python3 -c \
    "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
el tests; PYTHONPATH=$new:/tmp/site timeout -s ABRT 100 python3 -m pytest -q --engine-device cuda tests/test_radix.py \
  tests/test_hybrid.py tests/test_sliding.py tests/test_demo.py > $w/tests.txt 2>&1; tail -3 $w/tests.txt; pack
el profile; timeout -s ABRT 60 $ft $new profile --cpu-threads 8 --json > $w/profile.txt 2>&1
for r in 1 2; do
  for q in bf16 sampled int4; do
    for t in new old; do
      [ $(left) -gt 40 ] || break 3
      [ $t = new ] && d=$new || d=$old; qa="--expert-budget 1152MiB,16GiB"; [ $q = int4 ] && qa="--quant int4 --expert-budget 1152MiB"
      cli="$ft $d"; [ $q = sampled ] && { cli="env PYTHONPATH=$d:/tmp/site python3 $PWD/.probe/sampled.py"; qa="--expert-budget 16GiB"; }
      el decode $q $t $r; (cd $d && timeout -s ABRT 100 $cli bench decode --synthetic qwen3-30b-a3b --layers 8 $qa --cpu-threads 8 \
        --moe-policy adaptive --routing uniform --batch 1,8 --depth 1024 --tokens 64 --repeats 3 \
        --out $w/decode_${q}_${t}_$r.json) > $w/decode_${q}_${t}_$r.txt 2>&1
      python3 -c "import json,sys; [print(f\"  {r['budget_gib']:.1f} GiB b{r['batch']}: {r['tok_s']:.1f} tok/s\") for r in json.load(open(sys.argv[1]))['rows']]" $w/decode_${q}_${t}_$r.json 2>&1 | head -4
      pack
    done
  done
done; el done
