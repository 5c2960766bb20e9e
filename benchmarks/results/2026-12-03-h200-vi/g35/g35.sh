#!/usr/bin/env bash
# g35 (issue 20; prepared in the forty-first run, run in the forty-second): a one-token step's qkv GEMV
# and the attention prologue (head norms, rotary embedding, KV writes) in one launch, in place of cuBLAS's GEMV and
# the prologue kernel (8.0 + 1.8 us a layer step in the thirty-eighth run's profile). qkv_fused.patch:
# attention_triton.qkv_linear_rope_write, the last of a head's programs running that head's prologue (a counter a
# head, re-armed by the kernel); the tiles linear_add_rms_norm's (block_n 8, block_k 1024, 8 warps); qkv_bench.py sweeps them.
# Interpreter tests pass (10, bf16 skipped), with the wrong last program, no re-arm and the wrong head caught;
# compiles offline for sm_90 (bar.sync before the atomic). g33-34/ab.sh: the GPU tests (-k qkv, then test_graphs +
# test_parity on CUDA), decode against main, three alternating rounds.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g35/g35.sh $OUT") with the patch not applied; outputs in g35.tgz
exec bash "$(dirname "$0")/../g33-34/ab.sh" "$1" g35 "../g35/qkv_fused.patch" "qkv" "../g35/qkv_bench.py"
