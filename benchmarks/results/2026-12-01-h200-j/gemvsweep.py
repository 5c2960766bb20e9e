"""Decode expert GEMVs (both kernels, as bench_quant times them) over a wider tile set than
CANDIDATES: larger column blocks per iteration (more bytes in flight per CTA)."""
import itertools, json, sys
import torch
from kernels import moe_triton as m
GU = [(16, 256), (8, 512), (8, 1024), (4, 2048), (8, 2048), (16, 1024), (16, 512), (32, 256), (32, 512)]
DN = [(32, 256), (16, 256), (16, 512), (32, 512), (64, 256), (8, 1024), (16, 1024), (64, 128)]
fmts = sys.argv[1].split(",") if len(sys.argv) > 1 else ["int4", "bf16", "int8"]
K, H, I, S, calls = 8, 2048, 768, 256, 16
res = {}
for fmt in fmts:
    (wgu, wd), per_slot = m._bench_weights(fmt, S, H, I, 128)
    for T in (1, 8):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        w = torch.rand(T, K, device="cuda")
        sets = [torch.randperm(S, device="cuda")[:T * K].view(T, K) for _ in range(calls)]
        tried = {}
        want = m.moe_experts(x, wgu, wd, sets[0], w, reduce=False)
        for gu, dn, nw in itertools.product(GU, DN, (4, 8)):
            b = gu + dn
            try:
                got = m.moe_experts(x, wgu, wd, sets[0], w, blocks=b, reduce=False, num_warps=nw)
                assert torch.allclose(got, want, rtol=1e-3, atol=1e-4), (b, nw, (got - want).abs().max().item())
                tried[f"{b} w{nw}"] = m._graph_us(lambda i: m.moe_experts(x, wgu, wd, sets[i], w, blocks=b, reduce=False, num_warps=nw), calls)
            except Exception as e:
                print("failed", fmt, T, b, nw, repr(e)[:200], flush=True)
                tried[f"{b} w{nw}"] = float("inf")
        best = sorted(tried, key=tried.get)[:5]
        dflt = m.BLOCKS["plain" if fmt == "bf16" else fmt]
        dk = f"{dflt[0]} w{dflt[1]}"
        gbs = T * K * per_slot / tried[best[0]] / 1e3
        res[f"{fmt} T={T}"] = {"best": {k: round(tried[k], 2) for k in best}, "default": [dk, round(tried.get(dk, -1), 2)],
                               "GB/s": round(gbs, 1), "of_hbm": round(gbs / 4300, 3)}
        print(fmt, T, json.dumps(res[f"{fmt} T={T}"]), flush=True)
    del wgu, wd
json.dump(res, open(sys.argv[2] if len(sys.argv) > 2 else "/dev/null", "w"), indent=1)
