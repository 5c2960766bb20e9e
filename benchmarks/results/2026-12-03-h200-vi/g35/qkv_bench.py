"""Probe (with g35/qkv_fused.patch): a decode step's qkv projection and attention prologue as the graph runs
them: 64 calls captured in one CUDA graph, us a call (median of 20 replays), cuBLAS's GEMV + qkv_rope_write (main's)
against qkv_linear_rope_write per (block_n, block_k, num_warps); one token, bf16, head norms and full rotary as
Qwen3's; Qwen3-30B-A3B (H 2048, 32 / 4 heads of 128) and Qwen3-235B-A22B (H 4096, 64 / 4); GB/s of the weight's
bytes. python3 qkv_bench.py"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "g33-34"))
from graph_timing import timed  # noqa: E402
from freetoken_kernels.attention_triton import qkv_linear_rope_write, qkv_rope_write  # noqa: E402

dev = "cuda"
torch.manual_seed(0)
for H, Hq, Hkv, D in ((2048, 32, 4, 128), (4096, 64, 4, 128)):
    N = (Hq + 2 * Hkv) * D
    lw = (torch.randn(N, H) / H ** 0.5).bfloat16().to(dev)
    qw, kw = ((1 + 0.1 * torch.randn(D)).bfloat16().to(dev) for _ in range(2))
    pos = torch.tensor([1000.0])
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2).float() / D))
    ang = torch.cat([pos[:, None] * inv] * 2, dim=-1)
    cos, sin = (f(ang)[:, None, :].bfloat16().to(dev) for f in (torch.cos, torch.sin))
    slots = torch.tensor([5], device=dev)
    kc, vc = (torch.zeros(16, Hkv, D, dtype=torch.bfloat16, device=dev) for _ in range(2))
    x = torch.randn(1, H).bfloat16().to(dev)
    args = (qw, kw, 1e-6, cos, sin, slots, kc, vc, Hq)
    ref = qkv_rope_write(F.linear(x, lw), *args)
    us = timed(lambda: qkv_rope_write(F.linear(x, lw), *args))
    mb = lw.numel() * 2 / 1e6
    print(f"H={H} N={N} GEMV + prologue: {us:.2f} us ({mb / us * 1e3:.0f} GB/s of weights)", flush=True)
    scratch = (torch.empty(N, dtype=x.dtype, device=dev), torch.zeros(Hq + 2 * Hkv, dtype=torch.int32, device=dev))
    for bn in (4, 8, 16):
        for bk in (512, 1024, 2048):
            for w in (4, 8):
                kw_ = dict(scratch=scratch, block_n=bn, block_k=bk, num_warps=w)
                try:
                    q = qkv_linear_rope_write(x, lw, None, *args, **kw_)
                    us = timed(lambda: qkv_linear_rope_write(x, lw, None, *args, **kw_))
                except Exception as e:  # a tile that does not fit: say so, go on
                    print(f"H={H} fused block_n={bn} block_k={bk} warps={w}: {type(e).__name__}", flush=True)
                    continue
                print(f"H={H} N={N} fused block_n={bn} block_k={bk} warps={w}: {us:.2f} us ({mb / us * 1e3:.0f} GB/s);"
                      f" max |dq| {(q.float() - ref.float()).abs().max().item():.1e}", flush=True)
