"""B_H per expert format: GB/s of expert bytes (a quantized format's own codes, scales and zero
points) that the CPU executor reads at batch 1, by freetoken_kernels.cpu_executor.expert_gbps (the per-format
B_H probe), the median of several runs. The quantized formats are compute-bound on dequantization,
so one thread's figure tracks the row kernels' speed; --backend compares the executor's paths
(e.g. avx512_bf16 against avx512 for int4 and mxfp4).

    PYTHONPATH=$PWD python benchmarks/cpu_quant.py [--threads 1] [--runs 5] [--backend avx512]
"""
from __future__ import annotations

import argparse
import json
import statistics

from freetoken_kernels.cpu_executor import expert_gbps
from freetoken_kernels.quant import FORMATS

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--formats", default=",".join(("bf16",) + FORMATS))
    ap.add_argument("--backend", default=None, help="a CPUExecutor backend (default: the fastest this CPU has)")
    ap.add_argument("--bank-mib", type=int, default=256, help="experts cycled through (beyond the CPU caches)")
    a = ap.parse_args()
    res = {}
    for fmt in a.formats.split(","):
        runs = [expert_gbps(fmt, a.threads, a.seconds, a.bank_mib << 20, backend=a.backend) for _ in range(a.runs)]
        res[fmt] = {"median_gbps": round(statistics.median(runs), 2), "runs": [round(r, 2) for r in runs]}
        print(fmt, res[fmt], flush=True)
    print(json.dumps({"threads": a.threads, "backend": a.backend, "gbps": res}))
