"""Probe (with g33-34/linear_norm.patch): o_proj, the residual add and the next norm of a decode step as the
graph runs them: 64 calls captured in one CUDA graph, us a call (median of 20 replays), cuBLAS's GEMM + the
add-norm kernel (main's) against linear_add_rms_norm per (block_n, block_k, num_warps); T = 1 and 8; o_proj of
Qwen3-30B-A3B (4096 -> 2048) and Qwen3-235B-A22B (8192 -> 4096), bf16; GB/s of the weight's bytes beside a
device copy's. python3 linear_norm_bench.py"""
import torch
import torch.nn.functional as F
from graph_timing import timed
from freetoken_kernels.norm_triton import FUSED_MAX_T, add_rms_norm, linear_add_rms_norm

dev = "cuda"


src = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
dst = torch.empty_like(src)
copy_us = timed(lambda: dst.copy_(src), n=8)
print(f"device copy of 64 MiB: {copy_us:.1f} us, {2 * src.numel() / copy_us / 1e3:.0f} GB/s (read + write)", flush=True)
torch.manual_seed(0)
for K, N in ((4096, 2048), (8192, 4096)):
    lw = (torch.randn(N, K) / K ** 0.5).bfloat16().to(dev)
    nw = (1 + 0.1 * torch.randn(N)).bfloat16().to(dev)
    mb = lw.numel() * 2 / 1e6
    for T in (1, 8):
        x = torch.randn(T, N).bfloat16().to(dev)
        a = torch.randn(T, K).bfloat16().to(dev)
        scratch = (torch.empty(FUSED_MAX_T, N, dtype=x.dtype, device=dev), torch.zeros(1, dtype=torch.int32, device=dev))
        ref_h, ref_y = add_rms_norm(x, F.linear(a, lw), nw, 1e-6)
        us = timed(lambda: add_rms_norm(x, F.linear(a, lw), nw, 1e-6))
        print(f"K={K} N={N} T={T} GEMM + add-norm: {us:.2f} us ({mb / us * 1e3:.0f} GB/s of weights)", flush=True)
        for bn in (4, 8, 16, 32):
            for bk in (256, 512, 1024):
                for w in (4, 8):
                    kw = dict(scratch=scratch, block_n=bn, block_k=bk, num_warps=w)
                    try:
                        h, y = linear_add_rms_norm(x, a, lw, None, nw, 1e-6, **kw)
                        us = timed(lambda: linear_add_rms_norm(x, a, lw, None, nw, 1e-6, **kw))
                    except Exception as e:  # a tile that does not fit: say so, go on
                        print(f"K={K} N={N} T={T} fused block_n={bn} block_k={bk} warps={w}: {type(e).__name__}", flush=True)
                        continue
                    print(f"K={K} N={N} T={T} fused block_n={bn} block_k={bk} warps={w}: {us:.2f} us "
                          f"({mb / us * 1e3:.0f} GB/s); max |dh| {(h.float() - ref_h.float()).abs().max().item():.1e} "
                          f"|dy| {(y.float() - ref_y.float()).abs().max().item():.1e}", flush=True)
