#!/usr/bin/env bash
# thirty-first run, call 1: GEMV loop forms sweep; the all-resident decode without a CPU branch (HEAD) against 3b0fc9b (.probe/ab/old); GPU tests.
set -u
out=$1; w=$out/c5; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }
cp $0 .probe/gemv.py $w/; ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $w/machine.txt 2>&1; lscpu | head -20 >> $w/machine.txt
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new old; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 100 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) & done
(PYTHONPATH=$PWD timeout -s ABRT 300 python3 .probe/gemv.py int4,bf16,int8,fp8,mxfp4 > $w/gemv.jsonl 2> $w/gemv.err); el gemv $(wc -l < $w/gemv.jsonl) rows
wait; el built
n=0; for t in new old old new; do n=$((n+1)); el decode $t $n
  timeout -s ABRT 40 $ft $(tree $t) bench decode --synthetic qwen3-30b-a3b --layers 8 --expert-budget 16GiB --moe-policy adaptive \
    --routing uniform --tokens 32 --repeats 3 --out $w/decode_${t}_$n.json > $w/decode_${t}_$n.txt 2>&1; grep "│" $w/decode_${t}_$n.txt | cut -c1-200
done
(PYTHONPATH=$PWD timeout -s ABRT 90 python3 -m pytest -q -p no:cacheprovider tests/test_graphs.py > $w/tests_graphs.txt 2>&1); tail -n 3 $w/tests_graphs.txt
el done
