import sys
from kernels.cpu_executor import expert_gbps
for fmt in sys.argv[1].split(","):
    for bank in (1 << 30, 20 << 20):
        r = sorted(expert_gbps(fmt, 1, seconds=0.6, bank_bytes=bank) for _ in range(3))
        print(f"{fmt} bank {bank >> 20} MiB: {r[1]:.2f} GB/s (min {r[0]:.2f}, max {r[2]:.2f})", flush=True)
