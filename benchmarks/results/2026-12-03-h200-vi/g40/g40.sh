#!/usr/bin/env bash
# g40 (prepared in the forty-second run, not run; issue 20): the tensor-core int4 decode path, built
# (g40/mma.patch: freetoken_kernels/moe_mma.py, taken by moe_experts_auto for int4 experts in groups of 128 with
# bf16 x and SiLU; x's words paired by PRMT and the group sums by a ones-MMA inside the kernels, h rounded to
# bf16 for the down projection). CPU: tests/test_moe_mma.py interprets the kernels' PTX for a warp (five mutations
# caught); the kernels compile for sm_90. Here: the patched tree's GPU tests, g36's shapes.py in it (int4 and bf16
# at the four shapes: bench_quant times the tensor-core path beside the GEMV candidates), then decode against main,
# int4 with every expert resident (16GiB, fetch: the GPU's compute alone) and int4 adaptive at 1152 MiB, uniform
# routing, three alternating rounds. Run g39 first: if the in-kernel pairing and sums lose to g39's outside
# variants, change the patch before running this.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g40/g40.sh $OUT") with the patch not applied; outputs in g40.tgz
set -u
out=$1; n=mma; w=/tmp/g40; mkdir -p $w; d=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/g40.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 540 - ($(date +%s) - t0) )); }
for t in main $n; do mkdir -p /tmp/$t; cp -r freetoken_kernels engine ftw freetoken_cli tests pyproject.toml /tmp/$t/; done
(cd /tmp/$n && patch -p1 < $d/mma.patch) > $w/patch.txt 2>&1
(cd /tmp/$n && timeout -s ABRT 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_moe_mma.py tests/test_triton_kernels.py \
   -k "moe_mma or quantized or moe_experts or tile_asm" -rf --tb=short 2>&1 | tail -30
 timeout -s ABRT 150 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda tests/test_graphs.py tests/test_parity.py 2>&1 | tail -5) > $w/tests.txt
cat $w/tests.txt; el tested; pack
(cd /tmp/$n && PYTHONPATH=/tmp/$n timeout -s ABRT 100 python3 $d/../g36/shapes.py $w/shapes.jsonl 50 2>&1 | grep -v "arn" | tee $w/shapes.txt); el shapes; pack
dec() {  # tree budget policy i
  [ $(left) -gt 35 ] || { el skip $1 $2 $3 $4; return 1; }
  el decode $1 $2 $3 $4
  (cd /tmp/$1 && FREETOKEN_CACHE=/tmp/ftc PYTHONPATH=/tmp/$1:/tmp/site timeout -s ABRT 60 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b \
    --layers 8 --quant int4 --expert-budget $2 --moe-policy $3 --routing uniform --tokens 64 --repeats 3 --out $w/dec_$1_$2_$4.json) > $w/dec_$1_$2_$4.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$2_$4.json'))
for r in d['rows']: print('$1 int4 $2 $4', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1))" | tee -a $w/summary.txt
}
dec main 1152MiB adaptive 0  # warm-up: builds the synthetic checkpoint
for i in 1 2 3; do dec main 16GiB fetch $i; dec $n 16GiB fetch $i; dec $n 1152MiB adaptive $i; dec main 1152MiB adaptive $i; pack; done
el done; pack
