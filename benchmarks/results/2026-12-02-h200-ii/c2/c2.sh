#!/usr/bin/env bash
# call 2: the working tree (a chunk's first layer may stream, so the second layer's loads overlap its compute; a
# 512-token warm-up prefill beside the scan-length one) against main (.probe/ab/head) in bench prefill int8 and fp8
# at 1152 MiB (16k, +200, 3 repeats) and bench startup --synthetic (first / second 500-token prefill), alternating.
# needs, beside the tracked files: .probe/c2.sh .probe/ft.sh .probe/ab/head
set -u
out=$1; w=/tmp/c2; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 560 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; new=$PWD; old=$PWD/.probe/ab/head
for t in $new $old; do
  el executor $t; (cd $t && PYTHONPATH=$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
pre() {  # tree format tag
  [ $(left) -gt 70 ] || return 1
  [ $1 = new ] && d=$new || d=$old
  el prefill $*; timeout -s ABRT 80 $ft $d bench prefill --synthetic qwen3-30b-a3b --layers 8 --quant $2 \
    --expert-budget 1152MiB,16GiB --lengths 16384 --follow-up 200 --mode adaptive --repeats 3 \
    --out $w/prefill_$2_$1_$3.json > $w/prefill_$2_$1_$3.txt 2>&1
  grep "│ adaptive" $w/prefill_$2_$1_$3.txt | cut -c4-140; pack
}
sta() {  # tree tag
  [ $(left) -gt 40 ] || return 1
  [ $1 = new ] && d=$new || d=$old
  el startup $*; timeout -s ABRT 60 $ft $d bench startup --synthetic qwen3-30b-a3b --layers 8 --out $w/startup_$1_$2.json > $w/startup_$1_$2.txt 2>&1
  grep -o '"first_prefill_s": [0-9.]*\|"second_prefill_s": [0-9.]*\|"first_request_ratio": [0-9.]*' $w/startup_$1_$2.json | tr '\n' ' '; echo; pack
}
pre new int8 1; pre old int8 1
sta new 1; sta old 1
pre new fp8 1; pre old fp8 1
sta new 2; sta old 2; sta new 3; sta old 3
pre new int8 2; pre old int8 2
el done
