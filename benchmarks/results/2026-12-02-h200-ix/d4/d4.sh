#!/usr/bin/env bash
# thirty-second run, call 4: bench_quant's tiles for bf16 and fp8 with x read unstaged (HEAD), T = 1 and 8.
set -u
out=$1; w=$out/d4; mkdir -p $w; cp $0 $w/
PYTHONPATH=$PWD timeout -s ABRT 300 python3 -c "
import json; from kernels.moe_triton import bench_quant
print(json.dumps(bench_quant(('bf16', 'fp8'), hbm_gbs=4280.0), indent=1))" > $w/bench_quant.json 2> $w/err.txt
python3 -c "
import json; r = json.load(open('$w/bench_quant.json'))
for f, v in r.items():
    for T, e in v.items(): print(f, T, e['best'], e['us'], e['of_hbm'], sorted(e['tried_us'].items(), key=lambda kv: kv[1])[:4])"
cd $out && tar -czf d4.tgz d4 && rm -rf d4
