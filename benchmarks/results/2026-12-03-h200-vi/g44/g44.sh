#!/usr/bin/env bash
# g44 (prepared in the forty-third run, not run; issue 20): the int4 rows through the BF16 dot products prefetch 4 KiB
# ahead of the chunk they read; g29 tried 4 / 8 / 16 KiB (within the spread), not none. A decode job's units are
# short (phase 1: 16 row pairs of 1 KiB rows, 32 KiB; phase 2: 16 down rows of 384 B an expert, 6 KiB), so most of a
# unit's prefetches land in rows other threads read, or past the expert. nopf: that prefetch taken out (the
# hardware prefetchers alone). The executor's jobs of 8 experts (g19/rates.py, int4, DRAM, 14 threads), then int4
# adaptive decode of the 8-layer model at 1152 MiB against main, four alternating rounds.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g44/g44.sh $OUT"); outputs in g44.tgz
set -u
out=$1; w=/tmp/g44; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g44.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 540 - ($(date +%s) - t0) )); }
for t in main nopf; do mkdir -p /tmp/$t; cp -r freetoken_kernels engine ftw freetoken_cli pyproject.toml /tmp/$t/; done
sed -i '/_mm_prefetch(reinterpret_cast<const char\*>(q) + 4096, _MM_HINT_T0);  \/\/ see dot_avx2/d' /tmp/nopf/freetoken_kernels/csrc/cpu_moe.cpp
for t in main nopf; do echo "$t: $(grep -c '_mm_prefetch' /tmp/$t/freetoken_kernels/csrc/cpu_moe.cpp) prefetches" >> $w/variants.txt; done
for t in main nopf; do (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout -s ABRT 150 python3 -c "from freetoken_kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1 & done; wait
cat $w/variants.txt; el built
for t in main nopf main nopf; do (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout -s ABRT 60 python3 $d/g19/rates.py 14 2 int4 dram 2>/dev/null | sed "s/^/$t /") | tee -a $w/rates.txt; done
el rates; pack
dec() {  # tree i
  [ $(left) -gt 30 ] || { el skip $1 $2; return 1; }
  el decode $1 $2
  (cd /tmp/$1 && FREETOKEN_CACHE=/tmp/ftc PYTHONPATH=/tmp/$1:/tmp/site timeout -s ABRT 60 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b \
    --layers 8 --quant int4 --expert-budget 1152MiB --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_$1_$2.json) > $w/dec_$1_$2.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$2.json'))
for r in d['rows']: print('$1 int4 $2', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'cpu', round(r['cpu'], 2), 'B_H', round(r.get('b_h_online_gbps') or 0, 1))" | tee -a $w/summary.txt
}
dec main 0  # warm-up: builds the synthetic checkpoint
for i in 1 2 3 4; do dec nopf $i; dec main $i; pack; done
el done; pack
