#!/usr/bin/env bash
# thirty-third run, call 7: decode-sized batches through the GEMV kernels against the grouped GEMM (.probe/gemmdec.py).
out=$1; nvidia-smi -L > $out/machine.txt
timeout -s ABRT 60 python3 .probe/gemmdec.py int4 > $out/gemmdec.jsonl 2> $out/gemmdec.err; cat $out/gemmdec.jsonl
