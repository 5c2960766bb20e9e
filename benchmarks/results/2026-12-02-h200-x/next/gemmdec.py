"""Decode-sized expert batches: the GEMV kernels (moe_experts) against the grouped GEMM (moe_experts_gemm, tensor
cores, routes padded to its row tile) at T = 1, 2, 4, 8 per format, bench_quant's method (16 calls in one CUDA graph,
256 slots). One JSON line per timing, written as it goes."""
import json, sys, time
import torch
from kernels import moe_triton as m
H, I, S, K, group, calls = 2048, 768, 256, 8, 128, 16
t0 = time.time()
for fmt in sys.argv[1].split(","):
    (wgu, wd), per_slot = m._bench_weights(fmt, S, H, I, group)
    for T in (1, 2, 4, 8):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        w = torch.rand(T, K, device="cuda")
        sets = [torch.randperm(S, device="cuda")[:T * K].view(T, K) for _ in range(calls)]
        row = {"fmt": fmt, "T": T}
        ref = m.moe_experts(x, wgu, wd, sets[0], w)
        g = lambda b: lambda *a: m.moe_experts_gemm(*a, blocks=b)  # noqa: E731
        for name, fn in (("gemv", m.moe_experts), ("gemm64", m.moe_experts_gemm), ("gemm16", g((16, 64, 64, 64, 64))),
                         ("gemm16w", g((16, 128, 128, 128, 128)))):
            try:
                row[name + "_err"] = float((fn(x, wgu, wd, sets[0], w) - ref).abs().max())
                row[name + "_us"] = round(m._graph_us(lambda i: fn(x, wgu, wd, sets[i], w), calls), 2)
            except Exception as e:  # noqa: BLE001
                row[name + "_error"] = repr(e)[:200]
        row["t"] = round(time.time() - t0)
        print(json.dumps(row), flush=True)
    del wgu, wd
