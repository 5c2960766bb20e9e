#!/usr/bin/env bash
# g43 (prepared in the forty-third run, not run; issue 20): (1) g42 found the int4 row kernel alone summing 87 GB/s at
# 14 threads, per-thread rates up to 1.8x apart across vCPUs and T: g42/freq.cpp on each vCPU alone, then 14 and 16
# at once, twice (which vCPUs are slow, and whether they stay so). (2) g43/unit2_rows.patch: phase-2 units grow
# like phase 1's (R2 = 16 down rows doubled while a unit stays within 128 KiB and the job keeps four units a
# thread): adaptive decode's jobs of ~2 experts get 32-row units (12 -> 24 KiB of int4 a unit; 64 units, not 128).
# The twenty-ninth run measured a phase-2 unit at ~2.9 us besides its rows; g29's trace of decode: phase 2 849 of
# 1839 thread-us a job for 1/3 of the bytes. u2b: the same patch keeping two phase-2 units a thread (64 rows, 32 units). CPU: tests/test_cpu_executor.py passes
# with it (301); a mutation dropping a row of every longer unit fails 30. Int4 and bf16 adaptive decode of the
# 8-layer model at 1152 MiB against main, three alternating rounds; the executor's jobs of 8 experts (g19/rates.py).
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g43/g43.sh $OUT") with the patch not applied; outputs in g43.tgz
set -u
out=$1; w=/tmp/g43; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g43.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 540 - ($(date +%s) - t0) )); }
g++ -O2 -pthread -o /tmp/freq $d/g42/freq.cpp > $w/freq_build.txt 2>&1
for c in $(seq 0 15); do timeout 20 /tmp/freq 1 0.2 $c; done > $w/freq_each.txt 2>&1
for i in 1 2; do timeout 40 /tmp/freq 14,16 0.5; done > $w/freq_all.txt 2>&1
grep -A1 "regs\|l2 " $w/freq_each.txt | grep vCPU | tr '\n' ' ' | sed 's/ *vCPU:rate/ /g' > $w/freq_each_summary.txt; cat $w/freq_each_summary.txt; echo
grep -A1 "T=14\|T=16" $w/freq_all.txt | grep -v "^--"; el probed; pack
for t in main u2 u2b; do mkdir -p /tmp/$t; cp -r freetoken_kernels engine ftw freetoken_cli pyproject.toml /tmp/$t/; done
for t in u2 u2b; do (cd /tmp/$t && patch -s -p1 < $d/g43/unit2_rows.patch); done
sed -i 's/J->r2 = unit_rows(R2, G \* Rows(\*dn, 0, I).qb, H, 1, threads);/J->r2 = unit_rows(R2, G * Rows(*dn, 0, I).qb, H, 1, (threads + 1) \/ 2);/' /tmp/u2b/freetoken_kernels/csrc/cpu_moe.cpp
for t in main u2 u2b; do echo "$t: $(grep -c 'J.r2' /tmp/$t/freetoken_kernels/csrc/cpu_moe.cpp) J.r2, $(grep -c '(threads + 1) / 2' /tmp/$t/freetoken_kernels/csrc/cpu_moe.cpp) halved" >> $w/variants.txt; done
for t in main u2 u2b; do (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout -s ABRT 150 python3 -c "from freetoken_kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1 & done; wait
cat $w/variants.txt; el built
for t in main u2 u2b; do (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout -s ABRT 60 python3 $d/g19/rates.py 14 2 int4,bf16 dram 2>/dev/null | sed "s/^/$t /") | tee -a $w/rates.txt; done
el rates; pack
dec() {  # tree fmt i
  [ $(left) -gt 30 ] || { el skip $1 $2 $3; return 1; }
  el decode $1 $2 $3; a="--quant $2"; [ $2 = bf16 ] && a=""
  (cd /tmp/$1 && FREETOKEN_CACHE=/tmp/ftc PYTHONPATH=/tmp/$1:/tmp/site timeout -s ABRT 60 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b \
    --layers 8 $a --expert-budget 1152MiB --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_$1_$2_$3.json) > $w/dec_$1_$2_$3.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$2_$3.json'))
for r in d['rows']: print('$1 $2 $3', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'cpu', round(r['cpu'], 2), 'B_H', round(r.get('b_h_online_gbps') or 0, 1))" | tee -a $w/summary.txt
}
dec main int4 0; dec main bf16 0  # warm-up: builds both synthetic checkpoints
for i in 1 2 3; do dec u2 int4 $i; dec main int4 $i; dec u2b int4 $i; dec main bf16 $i; dec u2 bf16 $i; dec u2b bf16 $i; pack; done
el done; pack
