#!/usr/bin/env bash
# g13 (issue 20): why int4's CPU branch reads at 27.7 GB/s in adaptive decode (g12) against 55 GB/s in the cpu policy:
# the executor's job time by experts a job, per format, back to back or a layer step apart, alone or beside fills.
# run(command="bash benchmarks/results/2026-12-03-h200-v/g13/g13.sh $OUT")
set -u
out=$1; w=/tmp/g13; mkdir -p $w; d=$(dirname $0)
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }
cp $0 $d/cpujobs.py $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
el build; (PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
el jobs; PYTHONPATH=$PWD timeout -s ABRT 200 python3 $d/cpujobs.py int4,int8,bf16 > $w/jobs14.jsonl 2>&1; cat $w/jobs14.jsonl
el jobs8; PYTHONPATH=$PWD timeout -s ABRT 100 python3 $d/cpujobs.py int4 8 > $w/jobs8.jsonl 2>&1; cat $w/jobs8.jsonl
el done; tar czf $out/g13.tgz -C $w .
