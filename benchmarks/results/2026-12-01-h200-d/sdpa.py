"""Masked prefill SDPA on CUDA: first and second call per shape, default backends vs without cuDNN."""
import time, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
def call(T, ctx, H=32, D=128):
    q = torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16); k = torch.randn(1, H, ctx, D, device="cuda", dtype=torch.bfloat16)
    qpos = torch.arange(ctx - T, ctx, device="cuda")[:, None]; kpos = torch.arange(ctx, device="cuda")[None, :]
    mask = kpos <= qpos
    torch.cuda.synchronize(); t = time.perf_counter()
    F.scaled_dot_product_attention(q, k, k, attn_mask=mask); torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3
for label, backends in [("default", None), ("no cudnn", [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]),
                        ("cudnn only", [SDPBackend.CUDNN_ATTENTION])]:
    for T, ctx in [(500, 500), (501, 501), (300, 2469), (2048, 16384), (2048, 16384)]:
        try:
            if backends is None:
                a, b = call(T, ctx), call(T, ctx)
            else:
                with sdpa_kernel(backends):
                    a, b = call(T, ctx), call(T, ctx)
            print(f"{label:10s} T={T} ctx={ctx}: first {a:.1f} ms, second {b:.1f} ms", flush=True)
        except Exception as e:
            print(label, T, ctx, "error", str(e)[:100])
