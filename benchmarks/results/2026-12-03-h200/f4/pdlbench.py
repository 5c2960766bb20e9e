"""Decode expert GEMVs with the down kernel launched early (programmatic dependent launch, its weights prefetched
into L2) against the two kernels in sequence, bench_quant's method (16 calls in one CUDA graph over 256 slots),
alternating; and the outputs of both, which must be the same bits."""
import json, sys
import torch
from kernels import moe_triton as m
H, I, S, K, calls = 2048, 768, 256, 8, 16
for fmt in sys.argv[1].split(","):
    (wgu, wd), per_slot = m._bench_weights(fmt, S, H, I, 128)
    for T in (1, 8):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        w = torch.rand(T, K, device="cuda")
        sets = [torch.randperm(S, device="cuda")[:T * K].view(T, K) for _ in range(calls)]
        same = torch.equal(m.moe_experts(x, wgu, wd, sets[0], w, pdl=False), m.moe_experts(x, wgu, wd, sets[0], w, pdl=True))
        r = {"fmt": fmt, "T": T, "same_bits": same, "off": [], "pdl": []}
        for _ in range(3):
            for p in (False, True):
                r["pdl" if p else "off"].append(round(m._graph_us(lambda i: m.moe_experts(x, wgu, wd, sets[i], w, reduce=False, pdl=p), calls), 2))
        print(json.dumps(r), flush=True)
    del wgu, wd
