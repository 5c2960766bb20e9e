#!/usr/bin/env bash
# g30 (prepared, not run; issue 20): the router's linear layer and its top-k in one launch at decode
# (next/fused_router.patch: freetoken_kernels.router_triton.route_linear, each program one expert's logits for every
# token, the last one routing; MoEBlock.route takes it on CUDA for up to 8 tokens). ab.sh: GPU tests, the router alone
# (router_bench.py: GEMM + route kernel against route_linear per block_e x num_warps, in a CUDA graph), decode
# against main. run(command="bash benchmarks/results/2026-12-03-h200-vi/next/g30.sh $OUT"); outputs in g30.tgz
exec bash "$(dirname "$0")/ab.sh" "$1" g30 fused_router.patch router router_bench.py
