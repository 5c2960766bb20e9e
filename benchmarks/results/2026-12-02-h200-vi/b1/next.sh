#!/usr/bin/env bash
# twenty-ninth run, call 1: the executor's tests on the Xeon; int4 rows' chains; executor GB/s HEAD vs t0
# (fbba9f1, before the last session's executor changes); a decode job's latency by experts; decode at defaults.
set -u
out=$1; w=/tmp/b1; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/b1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 560 - ($(date +%s) - t0) )); }
cp $0 .probe/*.py .probe/*.cpp $w/; lscpu > $w/machine.txt; nvidia-smi -L >> $w/machine.txt; free -g >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new t0; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 200 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) & done
g++ -O3 -std=c++17 -pthread -I kernels/csrc -o /tmp/pc .probe/probe_chains.cpp > $w/build_pc.txt 2>&1 &
wait; el built
PYTHONPATH=$PWD timeout -s ABRT 100 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_executor.py > $w/cpu_executor.txt 2>&1; tail -n 3 $w/cpu_executor.txt; el tests
(timeout 40 /tmp/pc 2048; timeout 30 /tmp/pc 768) > $w/chains.txt 2>&1; cat $w/chains.txt; el chains; pack
g() { d=$(tree $1); (cd $d && PYTHONPATH=$d timeout -s ABRT 90 python3 $w/gbs.py $1 $2 ${@:3}) >> $w/gbs.txt 2>&1; }
for t in new t0 new t0; do g $t 14 int4:1,4 int8:1,4 fp8:1,4 mxfp4:1 bf16:1; done
for t in new t0; do g $t 1 int4:1 int8:1 fp8:1; done
cat $w/gbs.txt; el gbs; pack
j() { (PYTHONPATH=$PWD timeout -s ABRT 60 python3 $w/jobfix.py $*) >> $w/jobfix.txt 2>&1; }
for f in int4 int8 bf16; do for th in 1 8 14; do j new $f $th; done; done; j new int4 14 150
cat $w/jobfix.txt; el jobfix; pack
dec() {  # tree format tag
  [ $(left) -gt 40 ] || return 1
  el decode $*; a="--quant $2"; [ $2 = bf16 ] && a=""
  timeout -s ABRT 80 $ft $(tree $1) bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB --moe-policy adaptive \
    --routing uniform --tokens 64 --repeats 3 --out $w/decode_$1_$2_$3.json > $w/decode_$1_$2_$3.txt 2>&1; grep "│\|B_P" $w/decode_$1_$2_$3.txt | cut -c1-200; pack
}
dec new int8 a; dec t0 int8 a; dec new int4 a; dec new bf16 a; dec new int8 b; dec t0 int8 b; dec new int4 b
if [ $(left) -gt 75 ]; then el step_profile; (PYTHONPATH=$PWD:/tmp/site timeout -s ABRT $(( $(left) - 10 )) python3 -m engine.bench.step_profile uniform 8 1152MiB $w/sp qwen3-30b-a3b cuda int4 1024) > $w/step_profile_int4.txt 2>&1; tail -n 40 $w/step_profile_int4.txt; fi
el done; pack
