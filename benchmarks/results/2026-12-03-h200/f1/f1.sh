#!/usr/bin/env bash
# call 1: build nothing; tensor-core int4 decode experts against the GEMVs, then the GEMM at decode sizes
out=$1; nvidia-smi -L > $out/machine.txt; mkdir -p $out/f1
export TRITON_DEFAULT_FP_FUSION=1 PYTHONPATH=$PWD
timeout -s ABRT 240 python3 .probe/tcbench.py > $out/f1/tcbench.jsonl 2> $out/f1/tcbench.err; tail -3 $out/f1/tcbench.err
cat $out/f1/tcbench.jsonl
timeout -s ABRT 90 python3 .probe/gemmdec.py int4 > $out/f1/gemmdec.jsonl 2> $out/f1/gemmdec.err; cat $out/f1/gemmdec.jsonl
cp .probe/tc4.py .probe/tcbench.py .probe/f1.sh $out/f1/
