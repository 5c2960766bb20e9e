#!/usr/bin/env bash
# twenty-ninth run, call 2: the executor's tests with -ffp-contract=off; the device's compiler; the int4 row kernel
# (L1-resident, probe_chains) on one core and on 14 cores at once; bf16 / int4 decode at the defaults, alternating.
set -u
out=$1; w=/tmp/b2; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/b2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 230 - ($(date +%s) - t0) )); }
cp $0 $w/; (c++ --version; cat /etc/os-release) > $w/compiler.txt 2>&1; head -1 $w/compiler.txt
g++ -O3 -ffp-contract=off -std=c++17 -pthread -I kernels/csrc -o /tmp/pc .probe/probe_chains.cpp > $w/build_pc.txt 2>&1 &
PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build.txt 2>&1; wait; el built
PYTHONPATH=$PWD timeout -s ABRT 100 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_executor.py > $w/cpu_executor.txt 2>&1; tail -n 3 $w/cpu_executor.txt; el tests; pack
timeout 40 taskset -c 2 /tmp/pc 2048 > $w/pc_1.txt 2>&1; head -n 4 $w/pc_1.txt; el one core
for c in $(seq 2 15); do timeout 60 taskset -c $c /tmp/pc 2048 > $w/pc_14_$c.txt 2>&1 & done; wait
for c in 2 9 15; do head -n 4 $w/pc_14_$c.txt; done; el fourteen cores; pack
dec() {  # format tag
  [ $(left) -gt 30 ] || return 1
  el decode $*; a="--quant $1"; [ $1 = bf16 ] && a=""
  timeout -s ABRT 60 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB --moe-policy adaptive \
    --routing uniform --tokens 64 --repeats 3 --out $w/decode_$1_$2.json > $w/decode_$1_$2.txt 2>&1; grep "│\|B_P" $w/decode_$1_$2.txt | cut -c1-200; pack
}
dec bf16 a; dec int4 a; dec bf16 b; dec int4 b
el done; pack
