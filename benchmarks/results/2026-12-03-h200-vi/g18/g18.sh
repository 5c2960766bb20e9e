#!/usr/bin/env bash
# g18 (issue 20): the split that charges a CPU job's fixed cost (the profile's cpu_job_us) to the CPU side. GPU tests of
# the plan kernel and the policies first; then int4 and bf16 adaptive decode at 1152 MiB, alternating with main
# (.probe/ab/main = git archive e6555ae without engine/demo/model), each tree its own profile cache; then g17's probe.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g18/g18.sh $OUT", carry=[".probe"])
set -u
out=$1; w=$out
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 580 - ($(date +%s) - t0) )); }
nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; T=$PWD/benchmarks/traces/qwen3-30b-a3b-proxy.npy; A=$PWD/.probe/ab/main; B=$PWD
el build; (PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
el tests; PYTHONPATH=$PWD timeout -s ABRT 200 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py \
  tests/test_graphs.py tests/test_policies.py -k "plan or merge or graph or adaptive or poller or branch or job" > $w/tests.txt 2>&1; tail -n 3 $w/tests.txt | tee -a $w/log.txt
summ() { python3 -c "
import json; d=json.load(open('$w/$1.json')); p=d['profile']
for r in d['rows']: print('$1', r['routing'][:7], r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'fetched', round(r['fetched'], 2), 'cpu', round(r['cpu'], 2), 'q', round(r['q_star'], 3), 'B_H', round(r.get('b_h_online_gbps') or 0, 1), 'job_us', p.get('cpu_job_us'))" | tee -a $w/summary.txt; }
dec() {  # tree name fmt i
  [ $(left) -gt 60 ] || { el skip $2 $3 $4; return 1; }
  el decode $2 $3 $4; a="--quant $3"; [ $3 = bf16 ] && a=""
  FREETOKEN_CACHE=/tmp/ftc_$2 timeout -s ABRT 100 $ft $1 bench decode --synthetic qwen3-30b-a3b --layers 8 $a --expert-budget 1152MiB \
    --moe-policy adaptive --routing uniform,trace:$T --tokens 64 --repeats 3 --out $w/dec_$2_$3_$4.json > $w/dec_$2_$3_$4.txt 2>&1
  summ dec_$2_$3_$4
}
for i in 1 2 3; do dec $A main int4 $i; dec $B job int4 $i; done
for i in 1 2; do dec $A main bf16 $i; dec $B job bf16 $i; done
if [ $(left) -gt 100 ]; then el jobtimes; PYTHONPATH=$PWD timeout -s ABRT $(( $(left) - 10 )) python3 benchmarks/results/2026-12-03-h200-vi/g17/jobtimes.py int4,bfloat16 14 2>&1 | grep -v "leaked\|nanobind" > $w/jobtimes.jsonl; fi
el done
