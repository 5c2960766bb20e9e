"""The CPU executor's compute with several routes per expert: GFLOP/s (6 * hidden * inter per
route) of jobs whose T tokens all route to the same 8 experts (T routes each), cycling through 48
experts (beyond the caches), per weight format and thread count; the median of three 0.5 s runs
of freetoken_kernels.cpu_executor.expert_gbps. Batch decode with several streams and short prefill chunks
give the executor such jobs.

    PYTHONPATH=$PWD python benchmarks/cpu_routes.py [--threads 1,2] [--formats bf16,int4] [--backend avx2_fma]
"""
from __future__ import annotations

import argparse
import json
import statistics

from freetoken_kernels.cpu_executor import expert_bytes, expert_gbps

HIDDEN, INTER, N_EXPERTS = 2048, 768, 48

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1")
    ap.add_argument("--formats", default="bf16,int4")
    ap.add_argument("--tokens", default="1,4,8,16,32,64")
    ap.add_argument("--backend", default=None, help="a CPUExecutor backend (default: the fastest this CPU has)")
    a = ap.parse_args()
    res = {}
    for fmt in a.formats.split(","):
        per_expert = expert_bytes(fmt, (HIDDEN, INTER))
        for threads in map(int, a.threads.split(",")):
            for t in map(int, a.tokens.split(",")):
                gbps = statistics.median(expert_gbps(fmt, threads, 0.5, N_EXPERTS * per_expert, (HIDDEN, INTER),
                                                     backend=a.backend, tokens=t) for _ in range(3))
                key = f"{fmt} threads={threads} T={t}"
                res[key] = round(gbps * 1e9 / per_expert * t * 6 * HIDDEN * INTER / 1e9, 1)
                print(f"{key}: {res[key]} GFLOP/s", flush=True)
    print(json.dumps(res))
