# executor GB/s probe: gbs.py TAG THREADS FMT:T[,T..][:BACKEND] ...
import sys, statistics
from kernels.cpu_executor import expert_gbps
tag, th = sys.argv[1], int(sys.argv[2])
for spec in sys.argv[3:]:
    f, toks, *be = spec.split(":")
    be = be[0] if be else None
    row = []
    for t in toks.split(","):
        row.append(f"T{t} {statistics.median(expert_gbps(f, th, seconds=0.3, tokens=int(t), backend=be) for _ in range(3)):.1f}")
    print(tag, f"threads {th}", f, be or "default", " | ".join(row), flush=True)
