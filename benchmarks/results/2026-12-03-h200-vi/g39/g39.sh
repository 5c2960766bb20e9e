#!/usr/bin/env bash
# g39 (prepared in the forty-second run, not run; issue 20, a probe): g36's tensor-core int4 GEMVs took 1.4-1.5x
# off the tree's at large expert shapes, reading codes shuffled at convert time. g39/mma4k.py reads the tree's own
# int4 slots instead (the dot's K order permuted to the row-major codes, x read permuted to match): if it runs as
# fast as g16/mma4.py, a tensor-core decode path needs no second slot layout. Both probes, and the tree's GEMVs, at
# the expert shapes of Qwen3-30B-A3B, Qwen3-235B-A22B and DeepSeek-V3; each with x's permuted words and group sums
# made outside (as g16's) or in the kernel (PRMT; a ones-MMA), and the outside prep's time. `python3 g39/mma4k.py --emulate` interprets the
# generated PTX for a warp on the CPU (four mutations caught); the kernels compile for sm_90 (16-byte code loads
# with the runtime's divisibility specialization).
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g39/g39.sh $OUT"); outputs in g39.tgz
set -u
out=$1; w=/tmp/g39; mkdir -p $w; d=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1
for hi in "2048 768" "4096 1536" "7168 2048"; do
  PYTHONPATH=$PWD timeout -s ABRT 160 python3 $d/mma4k.py 4,8 $hi 2>&1 | grep -v "leaked\|nanobind\|^ -\|^See\|arn" | sed "s|^|mma4k $hi: |" | tee -a $w/probe.txt
  tar czf $out/g39.tgz -C $w .
done
for hi in "4096 1536" "7168 2048"; do  # g16's shuffled codes on the same machine (the 30B shape: g36b, twice)
  PYTHONPATH=$PWD timeout -s ABRT 55 python3 $d/../g16/mma4.py 4,8 $hi 2>&1 | grep -v "leaked\|nanobind\|^ -\|^See\|arn" | sed "s|^|mma4 $hi: |" | tee -a $w/probe.txt
  tar czf $out/g39.tgz -C $w .
done
