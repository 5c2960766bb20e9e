import sys, statistics
from kernels import cpu_executor as c
if sys.argv[1] == "old":
    c.CFLAGS = ["-O3"]
from kernels.cpu_executor import expert_gbps
for f in ("int4", "int8", "fp8", "bf16"):
    print(sys.argv[1], f, f"{statistics.median(expert_gbps(f, 1, seconds=0.5, tokens=1) for _ in range(3)):.2f}", flush=True)
