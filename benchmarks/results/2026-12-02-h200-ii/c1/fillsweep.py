"""Fill kernel sweep at the slot sizes of each format: GB/s by programs per expert, BLOCK, warps."""
import sys, json
import torch, triton
from triton.testing import do_bench
from kernels.fill_triton import _fill_kernel

SLOTS = {"int4": 2433024, "int8": 4792320, "bf16": 9437184}
res = []
for fmt, sb in SLOTS.items():
    rows = max(16, (600 << 20) // sb)
    src = torch.randint(0, 255, (rows, sb), dtype=torch.uint8).pin_memory()
    dst = torch.empty(16, sb, dtype=torch.uint8, device="cuda")
    words = sb // 8
    s64, d64 = src.view(torch.int64), dst.view(torch.int64)
    for n in (1, 2, 3, 4, 8):
        vic = torch.full((8,), -1, dtype=torch.int64, device="cuda"); vic[:n] = torch.arange(n)
        fetch = torch.full((8,), -1, dtype=torch.int64, device="cuda"); fetch[:n] = torch.arange(n) * 5 % rows
        pairs = list(zip(range(n), (torch.arange(n) * 5 % rows).tolist()))
        ce = do_bench(lambda: [dst[s].copy_(src[e], non_blocking=True) for s, e in pairs])
        row = {"fmt": fmt, "n": n, "copy_engine": round(n * sb / ce / 1e6, 1)}
        best = None
        for chunk in (2048, 4096, 8192, 16384, 32768, 65536):
            for block in (1024, 2048, 4096):
                if block > chunk:
                    continue
                for w in (4, 8):
                    grid = (8, triton.cdiv(words, chunk))
                    f = lambda: _fill_kernel[grid](s64, d64, vic, fetch, 0, words, vic, vic, 0, CHUNK=chunk,
                                                   BLOCK=block, SIGNAL=False, num_warps=w)
                    ms = do_bench(f, warmup=5, rep=30)
                    gbs = n * sb / ms / 1e6
                    row[f"{chunk}/{block}/{w}"] = round(gbs, 1)
                    if best is None or gbs > best[0]:
                        best = (gbs, f"{chunk}/{block}/{w}")
        row["best"] = best
        print(fmt, n, "copy", row["copy_engine"], "default", row["65536/4096/4"], "best", best, flush=True)
        res.append(row)
json.dump(res, open(sys.argv[1], "w"), indent=1)
