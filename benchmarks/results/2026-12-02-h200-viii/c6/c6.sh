#!/usr/bin/env bash
# thirty-first run, call 2: bf16 expert GEMVs pipelined two stages (new) against HEAD (.probe/ab/head), all resident, batch 1 and 8; GPU kernel tests.
set -u
out=$1; w=$out/c6; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }
cp $0 $w/; ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new head; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 100 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) & done; wait; el built
n=0; for t in new head head new; do n=$((n+1)); el decode $t $n
  timeout -s ABRT 80 $ft $(tree $t) bench decode --synthetic qwen3-30b-a3b --layers 8 --expert-budget 16GiB --moe-policy fetch \
    --routing uniform --batch 1,8 --tokens 32 --repeats 3 --out $w/decode_${t}_$n.json > $w/decode_${t}_$n.txt 2>&1; grep "│" $w/decode_${t}_$n.txt | cut -c1-220
done
(PYTHONPATH=$PWD timeout -s ABRT 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton_kernels.py -k "moe_experts" > $w/tests.txt 2>&1); tail -n 3 $w/tests.txt
el done
cd $out && tar -czf c6.tgz c6 && rm -rf c6
