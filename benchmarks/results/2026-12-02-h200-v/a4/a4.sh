#!/usr/bin/env bash
# quantized rows two at a time for a route alone, four FMA chains whatever the routes (new) against main (m0):
# executor GB/s per format, then decode at defaults (int4 alternating; int8 and bf16 beside).
set -u
out=$1; w=/tmp/a4; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/a4.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 420 - ($(date +%s) - t0) )); }
cp $0 .probe/gbs.py $w/; lscpu > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new m0; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 200 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) & done; wait; el built
g() { d=$(tree $1); (cd $d && PYTHONPATH=$d timeout -s ABRT 90 python3 $w/gbs.py $1 $2 ${@:3}) >> $w/gbs.txt 2>&1; }
for t in new m0 new m0; do g $t 14 int4:1,4,16 int8:1,4,16 fp8:1,4 mxfp4:1,4; done
for t in new m0; do g $t 1 int4:1 int8:1; done
cat $w/gbs.txt; pack
dec() {  # tree format tag
  [ $(left) -gt 40 ] || return 1
  el decode $*; a="--quant $2"; [ $2 = bf16 ] && a=""
  timeout -s ABRT 80 $ft $(tree $1) bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB --moe-policy adaptive \
    --routing uniform --tokens 64 --repeats 3 --out $w/decode_$1_$2_$3.json > $w/decode_$1_$2_$3.txt 2>&1; grep "│\|B_P" $w/decode_$1_$2_$3.txt | cut -c1-200; pack
}
dec new int4 a; dec m0 int4 a; dec new bf16 a; dec new int4 b; dec m0 int4 b; dec new int8 a; dec m0 int8 a
el done; pack
