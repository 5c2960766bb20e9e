#!/usr/bin/env bash
# thirtieth run, call 2: the plan kernel's scan (hits protected through last_use, blocks up to 4096 slots) against
# the tree before (.probe/ab/old = cf77d86): its time per layer step in a CUDA graph, GPU tests, decode side by side.
set -u
out=$1; w=/tmp/c2; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 .probe/planbench.py $w/; lscpu > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new old; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 200 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) & done; wait; el built
(PYTHONPATH=$PWD timeout -s ABRT 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton_kernels.py -k "plan" > $w/tests.txt 2>&1); tail -n 2 $w/tests.txt; el tests
pb() { d=$(tree $1); (cd $d && PYTHONPATH=$d timeout -s ABRT 100 python3 $w/planbench.py $*) >> $w/plan.txt 2>&1; }
pb old; pb new; pb new 1024 2048; grep -v Warn $w/plan.txt; el plan; pack
dec() {  # tree layers budget tag
  [ $(left) -gt 50 ] || { el skip $*; return 1; }
  el decode $*
  timeout -s ABRT $(( $(left) - 5 )) $ft $(tree $1) bench decode --synthetic qwen3-30b-a3b --layers $2 --quant int4 --expert-budget $3 \
    --moe-policy adaptive --routing uniform --tokens 32 --repeats 3 --out $w/decode_$1_$2_$4.json > $w/decode_$1_$2_$4.txt 2>&1
  grep "│" $w/decode_$1_$2_$4.txt | cut -c1-220; pack
}
dec new 48 8GiB a; dec old 48 8GiB a; dec new 8 1152MiB a; dec old 8 1152MiB a; dec old 48 8GiB b; dec new 48 8GiB b; dec old 8 1152MiB b; dec new 8 1152MiB b
(PYTHONPATH=$PWD timeout -s ABRT $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider tests/test_graphs.py > $w/tests_graphs.txt 2>&1); tail -n 2 $w/tests_graphs.txt
el done; pack
