#!/usr/bin/env bash
# thirtieth run, call 4: 62f56d0 (graph decode without a CPU branch sums its routes in the merge kernel) and 3b0fc9b
# (the bench's uniform ids drawn once a step) against a1045b8 (.probe/ab/old): GPU tests, decode side by side.
set -u
out=$1; w=/tmp/c4; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c4.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 370 - ($(date +%s) - t0) )); }
cp $0 $w/; lscpu > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new old; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 200 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) & done; wait; el built
(PYTHONPATH=$PWD timeout -s ABRT 150 python3 -m pytest -q -p no:cacheprovider tests/test_graphs.py tests/test_triton_kernels.py -k "graph or merge or uniform or plan" > $w/tests.txt 2>&1); tail -n 3 $w/tests.txt; el tests
dec() {  # tree tag layers budget policies [quant]
  [ $(left) -gt 45 ] || { el skip $*; return 1; }
  el decode $*; q=""; [ $# -ge 6 ] && q="--quant $6"
  timeout -s ABRT $(( $(left) - 5 )) $ft $(tree $1) bench decode --synthetic qwen3-30b-a3b --layers $3 $q --expert-budget $4 \
    --moe-policy $5 --routing uniform --tokens 32 --repeats 3 --out $w/decode_$1_$2.json > $w/decode_$1_$2.txt 2>&1
  grep "│" $w/decode_$1_$2.txt | cut -c1-200; pack
}
for t in new old; do dec $t res_a 8 16GiB adaptive,fetch; done
for t in old new; do dec $t i4_a 8 1152MiB adaptive int4; done
for t in old new; do dec $t res_b 8 16GiB adaptive,fetch; done
for t in new old; do dec $t i4_b 8 1152MiB adaptive int4; done
if [ $(left) -gt 60 ]; then el step_profile; mkdir -p /tmp/c4sp; (PYTHONPATH=$PWD timeout -s ABRT $(( $(left) - 3 )) python3 -m engine.bench.step_profile uniform 8 1152MiB /tmp/c4sp qwen3-30b-a3b cuda int4 1024) > $w/step_profile_int4.txt 2>&1; grep -v "^ERROR" $w/step_profile_int4.txt | tail -n 60 | cut -c1-120; fi
el done; pack
