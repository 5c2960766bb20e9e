#!/usr/bin/env bash
# int4 prefetch distance and in-cache rates; bf16 / int4 decode at defaults alternating (adaptive).
set -u
out=$1; w=/tmp/a2; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/a2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 575 - ($(date +%s) - t0) )); }
cp $0 .probe/gbs2.py $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt; lscpu >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
el builds
for t in new pd0 pd1k pd2k; do
  d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 200 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) &
done; wait; el built
g() { d=$(tree $1); (cd $d && PYTHONPATH=$d timeout -s ABRT 90 python3 $w/gbs2.py $1 $2) >> $w/gbs2.txt 2>&1; }
g new int4,bf16,int8; g pd0 int4; g pd1k int4; g pd2k int4; g new int4; g pd1k int4; g pd2k int4
cat $w/gbs2.txt; pack
dec() {  # format tag
  [ $(left) -gt 60 ] || return 1
  el decode $*; a="--quant $1"; [ $1 = bf16 ] && a=""
  timeout -s ABRT 90 $ft $PWD bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB --moe-policy adaptive \
    --routing uniform --tokens 64 --repeats 3 --out $w/decode_$1_$2.json > $w/decode_$1_$2.txt 2>&1; grep "│\|B_P" $w/decode_$1_$2.txt | cut -c1-200; pack
}
dec bf16 a; dec int4 a; dec bf16 b; dec int4 b; dec bf16 c; dec int4 c
el done; pack
