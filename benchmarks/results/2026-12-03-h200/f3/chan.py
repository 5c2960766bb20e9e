"""Decode GEMVs (bench_quant's method) with a scale per row (compressed-tensors' channel strategy) against
the blocked scales of `--quant` (fp8: 128 x 128 blocks; int8: groups of 128)."""
import json, torch
from kernels import moe_triton as m
from kernels.quant import QWeight
H, I, S, K, calls = 2048, 768, 256, 8, 16
def chan(fmt, views):
    out = []
    for q in views:
        S_, n, k = q.shape
        if fmt == "fp8":
            s = torch.full((S_, n, 1), 0.01, device="cuda")
            out.append(QWeight("fp8", q.q, s, None, (1, k)))
        else:
            out.append(QWeight("int8", q.q, q.s[:, :, :1].contiguous(), q.z[:, :, :1].contiguous(), (1, k)))
    return out
for fmt in ("fp8", "int8"):
    (wgu, wd), per_slot = m._bench_weights(fmt, S, H, I, 128)
    cgu, cd = chan(fmt, (wgu, wd))
    for T in (1, 8):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        w = torch.rand(T, K, device="cuda")
        sets = [torch.randperm(S, device="cuda")[:T * K].view(T, K) for _ in range(calls)]
        r = {"fmt": fmt, "T": T}
        for name, (a, b) in (("blocks", (wgu, wd)), ("per_row", (cgu, cd))):
            r[name + "_us"] = round(m._graph_us(lambda i: m.moe_experts(x, a, b, sets[i], w, reduce=False), calls), 2)
        print(json.dumps(r), flush=True)
