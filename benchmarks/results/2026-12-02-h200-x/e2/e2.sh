#!/usr/bin/env bash
# thirty-third run, call 2: int4 decode with the float bits of 2**23 as a kernel argument (new = working tree) against
# dcbc6d9 (.probe/ab/head), alternating; then cold starts of the 8-layer checkpoint on disk, dcbc6d9 against the same
# with one more warm-up prefill one token shorter than the 512 one (.probe/ab/warm), at 500- and 1500-token prompts.
set -u
out=$1; w=/tmp/e2; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/e2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 560 - ($(date +%s) - t0) )); }
cp $0 .probe/firstreq.py $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new head warm; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) & done
wait; el built
n=0; for t in new head head new; do n=$((n+1)); el decode int4 $t $n
  timeout -s ABRT 50 $ft $(tree $t) bench decode --synthetic qwen3-30b-a3b --layers 8 --quant int4 --expert-budget 16GiB --moe-policy fetch \
    --routing uniform --batch 1,8 --tokens 32 --repeats 3 --out $w/decode_int4_${t}_$n.json > $w/decode_int4_${t}_$n.txt 2>&1; grep "│" $w/decode_int4_${t}_$n.txt | cut -c100-220
done
for t in new head; do n=$((n+1)); el decode int4 1152MiB $t $n
  timeout -s ABRT 50 $ft $(tree $t) bench decode --synthetic qwen3-30b-a3b --layers 8 --quant int4 --expert-budget 1152MiB --moe-policy adaptive \
    --routing uniform --tokens 32 --repeats 3 --out $w/decode_int4_1152_${t}_$n.json > $w/decode_int4_1152_${t}_$n.txt 2>&1; grep "│" $w/decode_int4_1152_${t}_$n.txt | cut -c100-220
done
pack
el checkpoint; { PYTHONPATH=$PWD timeout -s ABRT 120 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$PWD timeout -s ABRT 100 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1
el converted; rm -rf /tmp/q30b8/hf
sta() {  # tree tag prompt-tokens
  [ -d /tmp/q30b8/ftw ] && [ $(left) -gt 25 ] || return 1
  el startup $*; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc timeout -s ABRT 40 $ft $(tree $1) bench startup /tmp/q30b8/ftw \
    --prompt-tokens $3 --out $w/startup_$1_$2_$3.json > $w/startup_$1_$2_$3.txt 2>&1
  grep -o '"ready_s": [0-9.]*\|"first_prefill_s": [0-9.]*\|"second_prefill_s": [0-9.]*\|"first_request_ratio": [0-9.]*' $w/startup_$1_$2_$3.json | tr '\n' ' ' | tee -a $w/log.txt; echo; pack
}
sta head 0 500; sta warm 0 500
( d=$A/head; cd $d && el cprof; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc PYTHONPATH=$d timeout -s ABRT 40 python3 $w/firstreq.py cprof $w head /tmp/q30b8/ftw > $w/cprof_head.txt 2>&1 )
for i in 1 2 3; do sta warm $i 500; sta head $i 500; done
for i in 1 2; do sta head $i 1500; sta warm $i 1500; done
el done; pack
