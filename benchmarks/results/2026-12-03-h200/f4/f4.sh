#!/usr/bin/env bash
# call 4: the down GEMV launched early (PDL) against the two GEMVs in sequence: kernel timings, GPU kernel and graph
# tests, then all-resident decode rows, the working tree (new) against 0be02d0 (.probe/ab/head), alternating
set -u
out=$1; w=/tmp/f4; mkdir -p $w
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftcache TRITON_DEFAULT_FP_FUSION=1
pack() { tar czf $out/f4.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }
cp $0 .probe/pdlbench.py $w/; nvidia-smi -L > $w/machine.txt; nvidia-smi | grep -i "driver\|cuda" >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new head; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) & done
PYTHONPATH=$PWD timeout -s ABRT 120 python3 .probe/pdlbench.py int4,bf16,int8,fp8,mxfp4 2>&1 | tee $w/pdlbench.jsonl
wait; el built; pack
PYTHONPATH=$PWD timeout -s ABRT 200 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py tests/test_graphs.py -k "moe_experts or graph" 2>&1 | tail -5 | tee $w/tests.txt
el tested; pack
n=0; for q in int4 bf16; do for t in new head head new; do n=$((n+1)); el decode $q $t $n
  timeout -s ABRT 60 $ft $(tree $t) bench decode --synthetic qwen3-30b-a3b --layers 8 $([ $q = bf16 ] || echo --quant $q) --expert-budget 16GiB --moe-policy fetch \
    --routing uniform --batch 1,8 --tokens 32 --repeats 3 --out $w/decode_${q}_${t}_$n.json > $w/decode_${q}_${t}_$n.txt 2>&1; grep "│" $w/decode_${q}_${t}_$n.txt | cut -c100-220
  pack
done; done
el done; pack
