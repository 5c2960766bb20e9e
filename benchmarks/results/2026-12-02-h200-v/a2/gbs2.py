# gbs2.py TAG: int4 / bf16 / int8 T=1 at 1 and 14 threads, from DRAM (1 GiB bank) and from L3 (16 MiB)
import sys, statistics
from kernels.cpu_executor import expert_gbps
tag = sys.argv[1]
for th in (1, 14):
    for f in sys.argv[2].split(","):
        for bank, name in ((1 << 30, "dram"), (1 << 24, "l3")):
            v = statistics.median(expert_gbps(f, th, seconds=0.25, bank_bytes=bank) for _ in range(3))
            print(tag, th, f, name, round(v, 1), flush=True)
