#!/usr/bin/env bash
# Prefill streaming in groups of experts (the working tree) against main before it (.probe/ab/m0): the prefill
# tests on CUDA, then bench prefill 16k cold + 200 follow-up at 1152 MiB per format, the trees alternating, with
# each format's all-resident floor (16 GiB) in the same call.
# needs, beside the tracked files: .probe/c3.sh .probe/ft.sh .probe/ab/m0
# (.probe/ab/m0: `git archive 37dff69 engine kernels ftw freetoken_cli pyproject.toml`, engine/demo/model removed)
set -u
out=$1; w=/tmp/c3; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c3.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/
ft="$PWD/.probe/ft.sh"; new=$PWD; old=$PWD/.probe/ab/m0
for t in $new $old; do
  el executor $t; (cd $t && PYTHONPATH=$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
el tests; PYTHONPATH=$new timeout -s ABRT 150 python3 -m pytest -q --engine-device cuda tests/test_prefill.py > $w/tests.txt 2>&1; tail -2 $w/tests.txt; pack
el profile; timeout -s ABRT 120 $ft $new profile --json > $w/profile.txt 2>&1; tail -c 200 $w/profile.txt; echo
run() {  # tree format budget tag
  [ $(left) -gt 45 ] || return 1
  [ $1 = new ] && d=$new || d=$old; qa=""; [ $2 = bf16 ] || qa="--quant $2"
  el prefill $*; timeout -s ABRT 100 $ft $d bench prefill --synthetic qwen3-30b-a3b --layers 8 $qa \
    --expert-budget $3 --lengths 16384 --follow-up 200 --mode adaptive --repeats 3 \
    --out $w/prefill_$2_$3_$1_$4.json > $w/prefill_$2_$3_$1_$4.txt 2>&1
  grep "│ adaptive" $w/prefill_$2_$3_$1_$4.txt | cut -c4-100; pack
}
for q in int8 bf16 fp8; do
  run new $q 1152MiB 1 && run old $q 1152MiB 1 && run new $q 16GiB 1 || break
done
for q in int8 bf16 fp8; do
  run old $q 1152MiB 2 && run new $q 1152MiB 2 || break
done
run new int4 1152MiB 1; run new mxfp4 1152MiB 1
el done
