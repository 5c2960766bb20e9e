#!/usr/bin/env bash
# g30 (prepared, not run; issue 20): the router's linear layer and its top-k in one launch at decode
# (next/fused_router.patch: freetoken_kernels.router_triton.route_linear, each program one expert's logits for every token, the
# last one routing; MoEBlock.route takes it on CUDA for up to 8 tokens). GPU tests of the patched tree, the router
# alone (router_bench.py: GEMM + route kernel against route_linear per block_e x num_warps, in a CUDA graph), then
# decode against main, alternating: every expert resident (bf16, 16 GiB) and int4 adaptive at 1152 MiB, uniform.
# Builds its trees from the working tree: /tmp/main = as it is, /tmp/fr = patched.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/next/g30.sh $OUT"); outputs in g30.tgz
set -u
out=$1; w=/tmp/g30; mkdir -p $w; d=$PWD/benchmarks/results/2026-12-03-h200-vi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g30.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 540 - ($(date +%s) - t0) )); }
for t in main fr; do mkdir -p /tmp/$t; cp -r freetoken_kernels engine ftw freetoken_cli tests pyproject.toml /tmp/$t/; done
(cd /tmp/fr && patch -p1 < $d/next/fused_router.patch) > $w/patch.txt 2>&1
(cd /tmp/fr && timeout -s ABRT 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_kernels.py -k router 2>&1 | tail -3
 timeout -s ABRT 150 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda tests/test_graphs.py tests/test_parity.py 2>&1 | tail -5) > $w/tests.txt
cat $w/tests.txt; el tested; pack
(cd /tmp/fr && PYTHONPATH=/tmp/fr timeout -s ABRT 120 python3 $d/next/router_bench.py) 2>&1 | grep -v "Warn\|warn" | tee $w/router_bench.txt; el bench; pack
dec() {  # tree fmt budget i
  [ $(left) -gt 35 ] || { el skip $1 $2 $3 $4; return 1; }
  el decode $1 $2 $3 $4; a="--quant $2"; [ $2 = bf16 ] && a=""
  (cd /tmp/$1 && FREETOKEN_CACHE=/tmp/ftc PYTHONPATH=/tmp/$1:/tmp/site timeout -s ABRT 60 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b \
    --layers 8 $a --expert-budget $3 --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_$1_$2_$3_$4.json) > $w/dec_$1_$2_$3_$4.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$2_$3_$4.json'))
for r in d['rows']: print('$1 $2 $3 $4', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1))" | tee -a $w/summary.txt
}
dec main int4 1152MiB 0  # warm-up: builds the synthetic checkpoint
for i in 1 2 3; do dec main bf16 16GiB $i; dec fr bf16 16GiB $i; dec fr int4 1152MiB $i; dec main int4 1152MiB $i; pack; done
el done; pack
