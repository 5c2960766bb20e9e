#!/usr/bin/env bash
set -u
out=$1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
pt="python3 -m pytest -q -p no:cacheprovider --engine-device cuda"
timeout 100 $pt -x tests/test_parity.py -k "deepseek_v3 and per-expert" > $out/ds.txt 2>&1; grep -E "Error|error:|passed|failed" $out/ds.txt | head -8
timeout 200 $pt tests/test_triton_kernels.py -k "moe or quant or gemm" tests/test_quant_checkpoints.py tests/test_quant_layout.py tests/test_quant_convert.py > $out/qt.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $out/qt.txt | tail -25
timeout 170 python3 -c "
import json
from kernels.moe_triton import bench_quant
for f in ('bf16', 'int8', 'int4', 'fp8', 'mxfp4'):
    r = bench_quant(fmts=(f,))
    for fmt, per in r.items():
        for T, v in per.items():
            print(json.dumps({'fmt': fmt, 'T': T, **{k: v[k] for k in v if k != 'all'}}), flush=True)
" > $out/kq.txt 2>&1; tail -12 $out/kq.txt
for q in none int8 int4 fp8; do
  qa=""; [ $q = none ] || qa="--quant $q"
  echo "== $q" >> $out/dec.txt
  timeout 75 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --layers 8 $qa --expert-budget 1152MiB \
    --moe-policy adaptive,fetch,cpu --routing uniform --cpu-threads 8 --tokens 32 --repeats 3 --json 2>>$out/dec.err | \
    python3 -c "import json,sys; d=json.load(sys.stdin); [print(json.dumps({k: r[k] for k in ('policy','tok_s','hit_rate','q_star','bound_tok_s','ratio','bytes_filled','bytes_cpu') if k in r})) for r in d['rows']]; print(json.dumps({'profile': {k: d['profile'].get(k) for k in ('format','h2d_concurrent_gbps','cpu_expert_concurrent_gbps')}}))" >> $out/dec.txt 2>&1
done
cat $out/dec.txt; tail -3 $out/dec.err
