"""bench_quant (the decode expert GEMVs, both kernels, `calls` calls in one CUDA graph over 256 slots, the
fastest of CANDIDATES) at the expert shapes of the models users offload, beside a device-to-device copy's
bandwidth, one row a (shape, format) as it finishes: python3 shapes.py OUT.jsonl SECONDS"""
import json
import sys
import time

import torch

from freetoken_kernels.moe_triton import bench_quant

SHAPES = {  # name: (H, I, top-k, group)
    "qwen3-30b-a3b": (2048, 768, 8, 128),
    "qwen3-235b-a22b": (4096, 1536, 8, 128),
    "deepseek-v3": (7168, 2048, 8, 128),
    "gpt-oss-120b": (2880, 2880, 4, 32),
}


def copy_gbs(nbytes=1 << 30, reps=20):
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        b.copy_(a)
    e.record()
    e.synchronize()
    return 2 * nbytes * reps / (s.elapsed_time(e) / 1e3) / 1e9   # read + write


out = open(sys.argv[1], "a")
cp = copy_gbs()
print(json.dumps({"copy_gbs": round(cp, 1)}), file=out, flush=True)
start, budget = time.time(), float(sys.argv[2])
for fmts in (("int4", "bf16"), ("fp8", "mxfp4", "int8")):
    for name, (H, I, K, g) in SHAPES.items():
        for fmt in fmts:
            if time.time() - start > budget:
                sys.exit(f"stopped at {name} {fmt}: {budget} s spent")
            t0 = time.time()
            r = bench_quant(fmts=(fmt,), K=K, H=H, I=I, group=g, hbm_gbs=cp)[fmt]
            row = {"shape": name, "fmt": fmt, "H": H, "I": I, "K": K, "group": g, "s": round(time.time() - t0, 1), "res": r}
            print(json.dumps(row), file=out, flush=True)
            print(name, fmt, f"{row['s']} s:", " ".join(f"{t}: {v['us']} us {v['GB/s']} GB/s {100 * v['of_hbm']:.0f}%"
                                                       f" ({v['best']})" for t, v in r.items()), flush=True)
            torch.cuda.empty_cache()
