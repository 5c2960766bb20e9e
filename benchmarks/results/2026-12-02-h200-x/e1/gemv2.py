"""Decode expert GEMVs of the tree on PYTHONPATH: per format, T = 1 and 8, the default BLOCKS entry and
its neighbours (warps 4/8, stages 1/2), bench_quant's method (16 calls in one CUDA graph, 256 slots).
First line: the device and its measured copy bandwidth (read + write of 4 GiB). One JSON line per timing."""
import json, sys, time
import torch
from kernels import moe_triton as m
fmts = sys.argv[1].split(",")
H, I, S, K, group, calls = 2048, 768, 256, 8, 128, 16
a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): b.copy_(a)
e.record(); e.synchronize()
copy = 2 * a.numel() * 10 / (s.elapsed_time(e) * 1e6)
del a, b
print(json.dumps({"device": torch.cuda.get_device_name(), "copy_GBps": round(copy, 1)}), flush=True)
t0 = time.time()
kw = lambda st: {"stages": st} if st else {}
for fmt in fmts:
    (wgu, wd), per_slot = m._bench_weights(fmt, S, H, I, group)
    ent = m.BLOCKS["plain" if fmt == "bf16" else fmt]
    blk, dw, ds = ent if len(ent) == 3 else (*ent, None)
    cfgs = [(blk, dw, ds), (blk, 12 - dw, ds)] + ([(blk, dw, 3 - ds)] if ds else [])
    for T in (1, 8):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        w = torch.rand(T, K, device="cuda")
        sets = [torch.randperm(S, device="cuda")[:T * K].view(T, K) for _ in range(calls)]
        base = m.moe_experts(x, wgu, wd, sets[0], w, blocks=blk, reduce=False, num_warps=dw, **kw(ds))
        for b, nw, st in cfgs:
            out = m.moe_experts(x, wgu, wd, sets[0], w, blocks=b, reduce=False, num_warps=nw, **kw(st))
            us = m._graph_us(lambda i: m.moe_experts(x, wgu, wd, sets[i], w, blocks=b, reduce=False,
                                                      num_warps=nw, **kw(st)), calls)
            gbs = T * K * per_slot / us / 1e3
            print(json.dumps({"fmt": fmt, "T": T, "blocks": b, "warps": nw, "stages": st, "us": round(us, 2),
                              "GBps": round(gbs, 1), "of_copy": round(gbs / copy, 3),
                              "err": float((out - base).abs().max()), "t": round(time.time() - t0)}), flush=True)
    del wgu, wd
