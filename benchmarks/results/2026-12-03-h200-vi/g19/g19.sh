#!/usr/bin/env bash
# g19 (issue 20, probes): the executor's int4 and bf16 rate per thread with the bank in the caches and in DRAM
# (rates.py); the int4 row kernel alone (mb.cpp: the tree's qrow at batch 1, two table-free variants, two rows at once), one
# process in L2 and from DRAM, then 8 and 14 processes at once from DRAM; then g17's per-job times (executor alone, the poller's own time) alone and beside a busy link.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g19/g19.sh $OUT"); everything comes back in g19.tgz
set -u
out=$1; w=/tmp/g19; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g19.tgz -C $w . ; }
nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt; lscpu > $w/lscpu.txt
(PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
PYTHONPATH=$PWD timeout -s ABRT 150 python3 $d/g19/rates.py 1,2,4,8,14 1 > $w/rates.jsonl 2> $w/rates.err; pack
g++ -O3 -o /tmp/mb $d/g19/mb.cpp > $w/mb_build.txt 2>&1
for K in 2048 768; do /tmp/mb 1 $K 2000; /tmp/mb 512 $K 4; done > $w/mb1.txt 2>&1
for n in 8 14; do for i in $(seq $n); do timeout 60 /tmp/mb 256 2048 6 > $w/mbp_${n}_$i.txt 2>&1 & done; wait; done
for n in 8 14; do echo "$n processes: $(cat $w/mbp_${n}_*.txt | awk '/^v0/ {a+=$(NF-5)} /^v1/ {b+=$(NF-5)} /^v3/ {c+=$(NF-5)} /^v2/ {e+=$(NF-5)} END {print "v0", a, "v1", b, "v3", c, "v2", e, "GB/s summed"}')"; done > $w/mbp.txt; pack
PYTHONPATH=$PWD timeout -s ABRT 200 python3 $d/g17/jobtimes.py int4,bfloat16 14 > $w/jobtimes.jsonl 2> $w/jobtimes.err; pack
cat $w/rates.jsonl $w/mb1.txt $w/mbp.txt $w/jobtimes.jsonl; tail -n 5 $w/rates.err $w/jobtimes.err
