"""The CPU executor's compute with several routes per expert: GFLOP/s (6 * hidden * inter per
route) of jobs whose T tokens all route to the same 8 experts (T routes each), cycling through 48
experts (beyond the caches), per weight format and thread count; the median of three 0.5 s runs.
Batch decode with several streams and short prefill chunks give the executor such jobs.

    PYTHONPATH=$PWD python benchmarks/cpu_routes.py [--threads 1,2] [--formats bf16,int4] [--backend avx2_fma]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from kernels.cpu_executor import CPUExecutor, _constant_bank

HIDDEN, INTER, N_EXPERTS = 2048, 768, 48


def gflops(ex: CPUExecutor, gu, down, tokens: int, seconds: float = 0.5) -> float:
    x, out, w = torch.randn(tokens, HIDDEN).bfloat16().float(), torch.empty(tokens, HIDDEN), torch.full((tokens, 8), 1 / 8)
    i, busy, t0 = 0, 0.0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ids = (torch.arange(8) + i).remainder(N_EXPERTS).view(1, 8).expand(tokens, 8).contiguous()
        job = ex.submit(x, gu, down, ids, w, out)
        job.wait()
        busy, i = busy + job.seconds, i + 8
    return i * tokens * 6 * HIDDEN * INTER / busy / 1e9


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1")
    ap.add_argument("--formats", default="bf16,int4")
    ap.add_argument("--tokens", default="1,4,8,16,32,64")
    ap.add_argument("--backend", default=None, help="a CPUExecutor backend (default: the fastest this CPU has)")
    a = ap.parse_args()
    res = {}
    for fmt in a.formats.split(","):
        gu, down = _constant_bank(fmt, N_EXPERTS, HIDDEN, INTER, 128)
        for threads in map(int, a.threads.split(",")):
            ex = CPUExecutor(threads, a.backend)
            try:
                for t in map(int, a.tokens.split(",")):
                    res[f"{fmt} threads={threads} T={t}"] = round(statistics.median(gflops(ex, gu, down, t) for _ in range(3)), 1)
                    print(f"{fmt} threads={threads} T={t}: {res[f'{fmt} threads={threads} T={t}']} GFLOP/s", flush=True)
            finally:
                ex.close()
    print(json.dumps(res))
