#!/usr/bin/env bash
# main at the defaults: the quick profile's thread sweep, then bench decode bf16 vs int4 at 1152 MiB with the
# default threads (issue 20's 3x), and the 16k prefill per format at 16 GiB (every expert resident: the floor)
# and 1152 MiB (bf16, int4 here; int8, fp8, mxfp4 in call 2).
# needs, beside the tracked files: .probe/c1.sh .probe/ft.sh
set -u
out=$1; w=/tmp/c1; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; d=$PWD
el executor; (PYTHONPATH=$d timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
el profile; timeout -s ABRT 120 $ft $d profile --json > $w/profile.txt 2>&1; tail -c 600 $w/profile.txt; echo; pack
for q in bf16 int4; do
  [ $(left) -gt 80 ] || break
  qa=""; [ $q = int4 ] && qa="--quant int4"
  el decode $q; timeout -s ABRT 150 $ft $d bench decode --synthetic qwen3-30b-a3b --layers 8 $qa --expert-budget 1152MiB \
    --moe-policy adaptive --routing uniform --batch 1,8 --depth 1024 --tokens 64 --repeats 3 \
    --out $w/decode_$q.json > $w/decode_$q.txt 2>&1
  grep "tok/s (" $w/decode_$q.txt; pack
done
for q in bf16 int4; do
  for b in 16GiB 1152MiB; do
    [ $(left) -gt 60 ] || break 2
    qa=""; [ $q = bf16 ] || qa="--quant $q"
    el prefill $q $b; timeout -s ABRT 120 $ft $d bench prefill --synthetic qwen3-30b-a3b --layers 8 $qa \
      --expert-budget $b --lengths 16384 --follow-up 200 --mode adaptive --repeats 3 \
      --out $w/prefill_${q}_$b.json > $w/prefill_${q}_$b.txt 2>&1
    grep "│ adaptive" $w/prefill_${q}_$b.txt | cut -c1-120; pack
  done
done; el done
