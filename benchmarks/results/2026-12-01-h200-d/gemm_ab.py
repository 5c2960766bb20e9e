"""Prefill MoE on CUDA: the per-expert reference loop against the grouped GEMMs, bf16, real shapes."""
import torch
from triton.testing import do_bench
from kernels import ref
from kernels.moe_gemm_triton import moe_experts_gemm
torch.manual_seed(0)
for name, H, I, S in [("qwen3-30b-a3b", 2048, 768, 128), ("qwen3.5-35b-a3b", 2048, 512, 256), ("glm-4.5-air", 4096, 1408, 128)]:
    pool = torch.randn(S, 3 * I * H, device="cuda", dtype=torch.bfloat16) * 0.02
    wgu, wd = pool[:, :2 * I * H].view(S, 2 * I, H), pool[:, 2 * I * H:].view(S, H, I)
    for T in (64, 300, 600, 2048, 8192, 16384):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        slots = torch.randint(0, S, (T, 8), device="cuda"); w = torch.rand(T, 8, device="cuda")
        a = do_bench(lambda: ref.moe_experts(x, wgu, wd, slots, w), rep=200)
        b = do_bench(lambda: moe_experts_gemm(x, wgu, wd, slots, w), rep=200)
        flops = 2 * T * 8 * 3 * I * H
        err = (moe_experts_gemm(x, wgu, wd, slots, w) - ref.moe_experts(x, wgu, wd, slots, w)).abs().max().item()
        print(f"{name} T={T}: ref {a:.3f} ms, gemm {b:.3f} ms ({flops / b / 1e9:.0f} TFLOP/s), ratio {a / b:.2f}x, max diff {err:.2e}", flush=True)
