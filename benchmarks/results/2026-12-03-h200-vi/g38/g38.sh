#!/usr/bin/env bash
# g38 (prepared in the forty-second run, not run; issue 20): g29 and g37 found a decode job's workers joining 10-20 us
# after the submit, almost none within 5 us, later with more workers. The workers spin for new work, then all take
# the pool's mutex at once while the submitter still holds it: each blocks in the kernel and is woken by the one
# before it (a chain of futex wake-ups). g38/lock_spin.patch: a worker that saw new work while spinning takes the
# lock with try_lock and pause (at most 4096 tries, then blocking as before). int4 and bf16 adaptive decode of the
# 8-layer model at 1152 MiB, uniform routing, three rounds alternating main and the patch; then both trees with
# g29/trace2.patch (FT_TRACE=1: the joins' histogram), int4.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g38/g38.sh $OUT") with the patch not applied; outputs in g38.tgz
set -u
out=$1; w=/tmp/g38; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g38.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 540 - ($(date +%s) - t0) )); }
for t in main ls tmain tls; do
  mkdir -p /tmp/$t; cp -r freetoken_kernels engine ftw freetoken_cli pyproject.toml /tmp/$t/
  case $t in *ls) (cd /tmp/$t && patch -s -p1 < $d/g38/lock_spin.patch) ;; esac
  case $t in t*) (cd /tmp/$t && patch -s -p1 < $d/g29/trace2.patch) ;; esac
  echo "$t: $(grep -c try_lock /tmp/$t/freetoken_kernels/csrc/cpu_moe.cpp) try_lock, $(grep -c FT_TRACE /tmp/$t/freetoken_kernels/csrc/cpu_moe.cpp) FT_TRACE" >> $w/variants.txt
done
for t in main ls tmain tls; do (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout -s ABRT 150 python3 -c "from freetoken_kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1 & done; wait
cat $w/variants.txt; el built
dec() {  # tree fmt i
  [ $(left) -gt 35 ] || { el skip $1 $2 $3; return 1; }
  el decode $1 $2 $3; a="--quant $2"; [ $2 = bf16 ] && a=""
  (cd /tmp/$1 && FT_TRACE=1 FREETOKEN_CACHE=/tmp/ftc PYTHONPATH=/tmp/$1:/tmp/site timeout -s ABRT 60 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b \
    --layers 8 $a --expert-budget 1152MiB --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_$1_$2_$3.json) > $w/dec_$1_$2_$3.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$2_$3.json'))
for r in d['rows']: print('$1 $2 $3', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1), 'cpu', round(r['cpu'], 2), 'B_H', round(r.get('b_h_online_gbps') or 0, 1))" | tee -a $w/summary.txt
  grep -a "trace:" $w/dec_$1_$2_$3.txt | tail -2 | sed "s/^/$1 $2 $3 /" | tee -a $w/summary.txt
}
dec main int4 0  # warm-up: builds the synthetic checkpoint (a machine's first decode ran ~15% slow in g28)
for i in 1 2 3; do dec main int4 $i; dec ls int4 $i; dec ls bf16 $i; dec main bf16 $i; pack; done
dec tmain int4 1; dec tls int4 1
el done; pack
