#!/usr/bin/env bash
# thirty-third run, call 3: cuBLAS's first use of a kernel by row count (.probe/mladder.py): a sweep, then warm-up
# ladders checked in fresh processes at 300 random row counts; int4 decode at 1152 MiB, adaptive, the float bits of
# 2**23 as a kernel argument (new = working tree) against dcbc6d9 (.probe/ab/head), alternating.
set -u
out=$1; w=/tmp/e3; mkdir -p $w; cp $0 .probe/mladder.py $w/
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }
nvidia-smi -L > $w/machine.txt
el sweep; timeout -s ABRT 200 python3 .probe/mladder.py sweep 8192 > $w/sweep.json 2> $w/sweep.err
python3 -c "import json; d=json.load(open('$w/sweep.json')); print(d['n'], d['total_ms']); json.dump(sorted({r['m'] for r in d['spikes']}), open('$w/spikes.json','w'))" | tee -a $w/log.txt
for r in none pow2 pow2half step64 file:$w/spikes.json none; do el test $r; timeout -s ABRT 100 python3 .probe/mladder.py test $r 8192 >> $w/tests.jsonl 2>> $w/tests.err; tail -n 1 $w/tests.jsonl | cut -c1-300; done
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftcache; ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new head; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) & done
wait; el built
n=0; for t in head new new head head new; do n=$((n+1)); [ $(( $(date +%s) - t0 )) -gt 520 ] && break; el decode int4 1152MiB $t $n
  timeout -s ABRT 50 $ft $(tree $t) bench decode --synthetic qwen3-30b-a3b --layers 8 --quant int4 --expert-budget 1152MiB --moe-policy adaptive \
    --routing uniform --tokens 32 --repeats 3 --out $w/decode_int4_1152_${t}_$n.json > $w/decode_int4_1152_${t}_$n.txt 2>&1; grep "│" $w/decode_int4_1152_${t}_$n.txt | cut -c100-220
done
el done; tar czf $out/e3.tgz -C $w .
