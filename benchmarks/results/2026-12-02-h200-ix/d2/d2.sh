#!/usr/bin/env bash
# thirty-second run, call 2: plain / fp8 GEMVs read x in w's shape, packed formats as before, no pipelined stages (new = working tree)
# against HEAD (.probe/ab/head); GPU kernel and graph tests of the new tree; bf16 and fp8 all-resident decode, batch 1 and 8, alternating.
set -u
out=$1; w=$out/d2; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }
P=$PWD; cp $0 .probe/gemv2.py $w/; ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $w/machine.txt 2>&1; nproc >> $w/machine.txt
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new head; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 100 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) & done
F=bf16,fp8,int4
for t in head new; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 100 python3 $P/.probe/gemv2.py $F > $w/gemv_$t.jsonl 2> $w/gemv_$t.err); el gemv $t $(wc -l < $w/gemv_$t.jsonl) rows; done
wait; el built
(PYTHONPATH=$PWD timeout -s ABRT 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_kernels.py -k "moe_experts" > $w/tests.txt 2>&1); tail -n 1 $w/tests.txt; el tests
(PYTHONPATH=$PWD timeout -s ABRT 90 python3 -m pytest -q -p no:cacheprovider tests/test_graphs.py > $w/tests_graphs.txt 2>&1); tail -n 1 $w/tests_graphs.txt; el graphs
n=0; for q in bf16 fp8; do for t in new head head new; do n=$((n+1)); [ $(( $(date +%s) - t0 )) -gt 540 ] && break; el decode $q $t $n
  qa=""; [ $q = fp8 ] && qa="--quant fp8"
  timeout -s ABRT 50 $ft $(tree $t) bench decode --synthetic qwen3-30b-a3b --layers 8 $qa --expert-budget 16GiB --moe-policy fetch \
    --routing uniform --batch 1,8 --tokens 32 --repeats 3 --out $w/decode_${q}_${t}_$n.json > $w/decode_${q}_${t}_$n.txt 2>&1; grep "│" $w/decode_${q}_${t}_$n.txt | cut -c100-220
done; done
el done
cd $out && tar -czf d2.tgz d2 && rm -rf d2
