#!/usr/bin/env bash
# g29 (issue 20; prepared in the fortieth run, run in the forty-second): g28 found a decode job's units 1.6-1.9x slower than with the link idle, the GPU's
# fills reading host memory beside them. Do the row kernels ask for their rows far enough ahead under that load? The
# tree's kernels prefetch 4 KiB ahead of the row they read (dot_avx2, the BF16 rows, the int4/mxfp4 BF16 rows); here
# 8 and 16 KiB too, built from the working tree (d4 = as it is). int4 adaptive decode of the 8-layer model at 1152 MiB,
# uniform routing, three rounds alternating; then each variant's trace inside decode (g29/trace2.patch = g23/trace.patch + a histogram of the joins, FT_TRACE=1).
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g29/g29.sh $OUT"); outputs in g29.tgz
set -u
out=$1; w=/tmp/g29; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g29.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 540 - ($(date +%s) - t0) )); }
V="d4 d8 d16"
for v in $V; do for tr in "" t; do
  t=/tmp/$tr$v; mkdir -p $t; cp -r freetoken_kernels engine ftw freetoken_cli pyproject.toml $t/
  sed -i "s/ + 4096/ + $(( ${v#d} * 1024 ))/" $t/freetoken_kernels/csrc/cpu_moe.cpp
  [ -n "$tr" ] && (cd $t && patch -s -p1 < $d/g29/trace2.patch)
done; done
for t in /tmp/d4 /tmp/d8 /tmp/d16 /tmp/td4 /tmp/td8 /tmp/td16; do echo "$t: $(grep -c ' + 4096' $t/freetoken_kernels/csrc/cpu_moe.cpp) at 4096, $(grep -c ' + 8192' $t/freetoken_kernels/csrc/cpu_moe.cpp) at 8192, $(grep -c ' + 16384' $t/freetoken_kernels/csrc/cpu_moe.cpp) at 16384"; done | tee $w/variants.txt
for t in d4 d8 d16 td4 td8 td16; do (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout -s ABRT 150 python3 -c "from freetoken_kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1 & done; wait; el built
dec() {  # tree i
  [ $(left) -gt 35 ] || { el skip $1 $2; return 1; }
  el decode $1 $2
  (cd /tmp/$1 && FT_TRACE=1 FREETOKEN_CACHE=/tmp/ftc PYTHONPATH=/tmp/$1:/tmp/site timeout -s ABRT 60 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b \
    --layers 8 --quant int4 --expert-budget 1152MiB --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_$1_$2.json) > $w/dec_$1_$2.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$2.json'))
for r in d['rows']: print('$1 $2', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'cpu', round(r['cpu'], 2), 'B_H', round(r.get('b_h_online_gbps') or 0, 1))" | tee -a $w/summary.txt
  grep -a "trace:" $w/dec_$1_$2.txt | tail -2 | sed "s/^/$1 $2 /" >> $w/summary.txt
}
dec d4 0  # warm-up: builds the synthetic checkpoint (a machine's first decode ran ~15% slow in g28)
for i in 1 2 3; do for v in $V; do dec $v $i; done; pack; done
for v in $V; do dec t$v 1; done
el done; pack
