"""int4 decode experts: the GEMV kernels (kernels.moe_triton.moe_experts) against tc4's tensor-core kernels,
bench_quant's method (16 calls in one CUDA graph over 256 slots, H 2048, I 768, group 128). One JSON line a row."""
import json, sys, time
import torch
sys.path.insert(0, ".probe")
from tc4 import moe_experts_tc
from kernels import moe_triton as m, ref
H, I, S, K, group, calls = 2048, 768, 256, 8, 128, 16
t0 = time.time()
(wgu, wd), per_slot = m._bench_weights("int4", S, H, I, group)
def row(**r):
    r["t"] = round(time.time() - t0, 1); print(json.dumps(r), flush=True)
cfgs = [(bi, nw, st, True) for bi in (16, 32, 64) for nw in (4, 8) for st in (2, 3, 4)] + [(32, 4, 3, False), (64, 8, 3, False)]
best = {}
for T in (1, 2, 4, 8):
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(T, K, device="cuda")
    sets = [torch.randperm(S, device="cuda")[:T * K].view(T, K) for _ in range(calls)]
    r32 = ref.moe_experts(x.float(), wgu, wd, sets[0], w)
    g = m.moe_experts(x, wgu, wd, sets[0], w)
    us = m._graph_us(lambda i: m.moe_experts(x, wgu, wd, sets[i], w, reduce=False), calls)
    row(T=T, kind="gemv", us=round(us, 2), of_copy=round(T * K * per_slot / us / 1e3 / 4280, 3), err=float((g - r32).abs().max()),
        scale=float(r32.abs().max()))
    for bi, nw, st, one in (cfgs if T == 1 else best_cfgs):
        try:
            y = moe_experts_tc(x, wgu, wd, sets[0], w, bi=bi, bo=2 * bi, num_warps=nw, stages=st, one=one)
            us = m._graph_us(lambda i: moe_experts_tc(x, wgu, wd, sets[i], w, bi=bi, bo=2 * bi, num_warps=nw, stages=st,
                                                      one=one, reduce=False), calls)
            best[(bi, nw, st, one)] = us
            row(T=T, kind="tc", cfg=[bi, nw, st, one], us=round(us, 2), of_copy=round(T * K * per_slot / us / 1e3 / 4280, 3),
                err=float((y - r32).abs().max()), err_gemv=float((y - g).abs().max()))
        except Exception as e:  # noqa: BLE001
            row(T=T, kind="tc", cfg=[bi, nw, st, one], error=repr(e)[:300])
    if T == 1:
        best_cfgs = sorted(best, key=best.get)[:4]
