# gbs3.py: T=1 GB/s per format and backend at 1 and 14 threads (1 GiB bank)
import statistics
from kernels.cpu_executor import expert_gbps
for th in (1, 14):
    for f in ("int4", "int8", "fp8", "mxfp4", "bf16"):
        for be in ("avx512_bf16", "avx512", "avx2_fma"):
            if f == "bf16" and be == "avx512":
                continue
            v = statistics.median(expert_gbps(f, th, seconds=0.25, backend=be) for _ in range(3))
            print(th, f, be, round(v, 1), flush=True)
