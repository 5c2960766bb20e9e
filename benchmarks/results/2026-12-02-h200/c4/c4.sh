#!/usr/bin/env bash
# The working tree (grouped prefill streaming, reserved slots never filled, uniform routing drawn in the router
# kernel) on CUDA: its tests; bench prefill fp8 and bf16 at 1152 MiB against main before the grouped streaming
# (.probe/ab/m0), 5 repeats, alternating; bench decode bf16 (1152 MiB and all resident) and int4 (1152 MiB) at the
# default threads, uniform routing.
# needs, beside the tracked files: .probe/c4.sh .probe/ft.sh .probe/ab/m0
# (.probe/ab/m0: `git archive 37dff69 engine kernels ftw freetoken_cli pyproject.toml`, engine/demo/model removed)
set -u
out=$1; w=/tmp/c4; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c4.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 365 - ($(date +%s) - t0) )); }
cp $0 $w/
ft="$PWD/.probe/ft.sh"; new=$PWD; old=$PWD/.probe/ab/m0
for t in $new $old; do
  el executor $t; (cd $t && PYTHONPATH=$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
el tests; PYTHONPATH=$new timeout -s ABRT 100 python3 -m pytest -q --engine-device cuda tests/test_prefill.py tests/test_expert_memory.py \
  tests/test_triton_kernels.py -k "prefill or buffers or tables or uniform or router or stream" > $w/tests.txt 2>&1; tail -2 $w/tests.txt; pack
el profile; timeout -s ABRT 90 $ft $new profile --json > $w/profile.txt 2>&1; tail -c 200 $w/profile.txt; echo
pre() {  # tree format tag
  [ $(left) -gt 30 ] || return 1
  [ $1 = new ] && d=$new || d=$old; qa=""; [ $2 = bf16 ] || qa="--quant $2"
  el prefill $*; timeout -s ABRT 60 $ft $d bench prefill --synthetic qwen3-30b-a3b --layers 8 $qa \
    --expert-budget 1152MiB --lengths 16384 --follow-up 200 --mode adaptive --repeats 5 \
    --out $w/prefill_$2_$1_$3.json > $w/prefill_$2_$1_$3.txt 2>&1
  grep "│ adaptive" $w/prefill_$2_$1_$3.txt | cut -c4-100; pack
}
pre new fp8 1 && pre old fp8 1 && pre new bf16 1 && pre old bf16 1
for q in bf16 int4; do
  [ $(left) -gt 50 ] || break
  qa="--expert-budget 1152MiB,16GiB"; [ $q = int4 ] && qa="--quant int4 --expert-budget 1152MiB"
  el decode $q; timeout -s ABRT 80 $ft $new bench decode --synthetic qwen3-30b-a3b --layers 8 $qa \
    --moe-policy adaptive --routing uniform --batch 1,8 --depth 1024 --tokens 64 --repeats 3 \
    --out $w/decode_$q.json > $w/decode_$q.txt 2>&1
  grep "tok/s (" $w/decode_$q.txt; pack
done
el done
