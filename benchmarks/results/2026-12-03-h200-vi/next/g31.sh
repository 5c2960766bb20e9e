#!/usr/bin/env bash
# g31 (prepared, not run; issue 20): o_proj, the residual add and the next norm in one launch at decode
# (next/linear_norm.patch: freetoken_kernels.norm_triton.linear_add_rms_norm, each program BLOCK_N of o_proj's outputs
# for every token, the last one adding them to the residual and normalising; DecoderLayer takes it on CUDA for up to
# 8 tokens through RMSNorm.add_linear). It replaces cuBLAS's split-K GEMM, its reduce kernel and the add-norm kernel
# (8.4 + 1.7 + 1.6 us a layer step in the thirty-eighth run's step profile). ab.sh: GPU tests, the three alone
# (linear_norm_bench.py: per block_n x block_k x num_warps, in a CUDA graph), decode against main. With
# fused_router.patch landed first, the two patches apply together (`bash ab.sh $OUT g31 "fused_router.patch
# linear_norm.patch" ...` measures both against main).
# run(command="bash benchmarks/results/2026-12-03-h200-vi/next/g31.sh $OUT"); outputs in g31.tgz
exec bash "$(dirname "$0")/ab.sh" "$1" g31 linear_norm.patch "linear_add or norm" linear_norm_bench.py
