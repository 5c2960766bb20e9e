#!/usr/bin/env bash
# thirty-third run, call 1: the float bits of 2**23 as a kernel argument (new = working tree) against dcbc6d9
# (.probe/ab/head); GPU kernel tests and test_graphs; int4 decode, every expert resident and at 1152 MiB, alternating.
set -u
out=$1; w=$out/e1; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }
P=$PWD; cp $0 .probe/gemv2.py $w/; ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $w/machine.txt 2>&1; nproc >> $w/machine.txt
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new head; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 100 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) & done
F=int4,int8,mxfp4
for t in head new; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 100 python3 $P/.probe/gemv2.py $F > $w/gemv_$t.jsonl 2> $w/gemv_$t.err); el gemv $t $(wc -l < $w/gemv_$t.jsonl) rows; done
wait; el built
(PYTHONPATH=$PWD timeout -s ABRT 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_kernels.py tests/test_graphs.py -k "moe_experts or graph" > $w/tests.txt 2>&1); tail -n 1 $w/tests.txt; el tests
n=0; for t in new head head new; do n=$((n+1)); el decode int4 $t $n
  timeout -s ABRT 50 $ft $(tree $t) bench decode --synthetic qwen3-30b-a3b --layers 8 --quant int4 --expert-budget 16GiB --moe-policy fetch \
    --routing uniform --batch 1,8 --tokens 32 --repeats 3 --out $w/decode_int4_${t}_$n.json > $w/decode_int4_${t}_$n.txt 2>&1; grep "│" $w/decode_int4_${t}_$n.txt | cut -c100-220
done
for t in new head; do n=$((n+1)); [ $(( $(date +%s) - t0 )) -gt 500 ] && break; el decode int4 1152MiB $t $n
  timeout -s ABRT 50 $ft $(tree $t) bench decode --synthetic qwen3-30b-a3b --layers 8 --quant int4 --expert-budget 1152MiB --moe-policy adaptive \
    --routing uniform --tokens 32 --repeats 3 --out $w/decode_int4_1152_${t}_$n.json > $w/decode_int4_1152_${t}_$n.txt 2>&1; grep "│" $w/decode_int4_1152_${t}_$n.txt | cut -c100-220
done
el done
cd $out && tar -czf e1.tgz e1 && rm -rf e1
