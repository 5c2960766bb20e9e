#!/usr/bin/env bash
# g34 (issue 20, the forty-first run): g33's router and o_proj/add/norm fusions for one token only (g33: at 8 tokens
# both lost, the router 25.6 us against 8.2 for GEMM + route, the o_proj fusion 27-48 us against 8.0), each kernel
# written for one token, the o_proj tiles g33's probe found fastest at T 1 (block_n 8, block_k 1024, 8 warps), a
# barrier before the last-program atomic; g33's plan change dropped (slower at batch 8). ab.sh: the GPU tests, then
# decode against main (main = 0a3ecb5; decode_fused.patch landed after the run, so later trees need that commit).
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g33-34/g34.sh $OUT"); outputs in g34.tgz (unpacked in out34/)
exec bash "$(dirname "$0")/ab.sh" "$1" g34 "decode_fused.patch" "fused_router or linear_add or norm" ""
