#!/usr/bin/env bash
# call 1: fill kernel sweep at each format's slot size; the working tree's fill (about 32 programs a slot) against
# main (.probe/ab/head: 64k-word chunks) in bench decode int4 and bf16 at 1152 MiB, default threads, uniform routing,
# adaptive and fetch, batch 1 and 8; the fill kernel's GPU test.
# needs, beside the tracked files: .probe/c1.sh .probe/ft.sh .probe/fillsweep.py .probe/ab/head
set -u
out=$1; w=/tmp/c1; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 560 - ($(date +%s) - t0) )); }
cp $0 .probe/fillsweep.py $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; new=$PWD; old=$PWD/.probe/ab/head
for t in $new $old; do
  el executor $t; (cd $t && PYTHONPATH=$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
el sweep; PYTHONPATH=$new timeout -s ABRT 120 python3 .probe/fillsweep.py $w/fillsweep.json > $w/fillsweep.txt 2>&1; cat $w/fillsweep.txt | cut -c1-150; pack
dec() {  # tree format
  [ $(left) -gt 60 ] || return 1
  [ $1 = new ] && d=$new || d=$old; qa=""; [ $2 = bf16 ] || qa="--quant $2"
  el decode $*; timeout -s ABRT 100 $ft $d bench decode --synthetic qwen3-30b-a3b --layers 8 $qa --expert-budget 1152MiB \
    --moe-policy adaptive,fetch --routing uniform --batch 1,8 --depth 1024 --tokens 64 --repeats 3 \
    --out $w/decode_$2_$1.json > $w/decode_$2_$1.txt 2>&1
  grep "tok/s (\|B_H\|B_P" $w/decode_$2_$1.txt | cut -c1-160; pack
}
dec new int4; dec old int4; dec new bf16; dec old bf16
[ $(left) -gt 50 ] && { el tests; PYTHONPATH=$new timeout -s ABRT 45 python3 -m pytest -q --engine-device cuda tests/test_graphs.py -k "fill or adaptive" > $w/tests.txt 2>&1; tail -2 $w/tests.txt; pack; }
el done
