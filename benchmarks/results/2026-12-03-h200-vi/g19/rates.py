"""Probe: B_H of the executor per thread count with the bank in the CPU caches (8 experts, cycled) and in DRAM
(1 GiB), int4 and bf16, jobs of 8 experts at batch 1: compute-bound or memory-bound, per thread.
python3 rates.py THREADS,... SECONDS [FORMATS] [BANKS]"""
import json, sys
from freetoken_kernels.cpu_executor import expert_bytes, expert_gbps
counts, secs = [int(t) for t in sys.argv[1].split(",")], float(sys.argv[2])
fmts = sys.argv[3].split(",") if len(sys.argv) > 3 else ["int4", "bf16"]
banks = sys.argv[4].split(",") if len(sys.argv) > 4 else ["cache", "dram"]
for fmt in fmts:
    for where, bank in (("cache", 8 * expert_bytes(fmt)), ("dram", 1 << 30)):
        if where not in banks:
            continue
        for t in counts:
            g = expert_gbps(fmt, threads=t, seconds=secs, bank_bytes=bank)
            print(json.dumps({"format": fmt, "bank": where, "bank_mib": bank >> 20, "threads": t, "gbps": round(g, 2),
                              "gbps_per_thread": round(g / t, 2)}), flush=True)
