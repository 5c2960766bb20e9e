#!/usr/bin/env bash
# thirty-first run, call 5: the gate_up GEMV with its columns split over 1, 2, 4 programs.
set -u
out=$1; w=$out/c9; mkdir -p $w; cp $0 .probe/splitk.py $w/
export PYTHONUNBUFFERED=1
(PYTHONPATH=$PWD timeout -s ABRT 300 python3 .probe/splitk.py int4,int8,bf16 > $w/splitk.jsonl 2> $w/splitk.err); tail -3 $w/splitk.err
python3 -c "
import json
for l in open('$w/splitk.jsonl'):
    r=json.loads(l); print(r['fmt'], r['T'], r['variant'], r.get('blocks',''), 'w%d'%r['warps'], r['us'], r['GBps'], r.get('err',''))
"
cd $out && tar -czf c9.tgz c9 && rm -rf c9
