# One thread, jobs of 8 experts (2048 x 768, groups of 128, symmetric) at one route each, int8 / fp8 on the
# default path, int4 / int8 forced onto AVX2; min and 10th percentile of 1.5 s. `python3 job_generic.py LABEL`.
import sys, time, torch
sys.path.insert(0, "tests")
import test_cpu_executor as T
from kernels.cpu_executor import CPUExecutor
label = sys.argv[1]
T.E = 16
gu, down = T.make_bank(2048, 768, torch.float32, 0)
for fmt, backend in (("int8", None), ("fp8", None), ("int4", "avx2_fma"), ("int8", "avx2_fma")):
    w = T.qbank({"gate_up": gu, "down": down}, fmt, 128)
    ex = CPUExecutor(1, backend)
    x, out = torch.randn(1, 2048).bfloat16(), torch.empty(1, 2048)
    rw = torch.full((1, 8), 1 / 8)
    ts = []; i = 0; t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.5:
        job = ex.submit(x, w["gate_up"], w["down"], (torch.arange(8) + i).remainder(16)[None].contiguous(), rw, out)
        job.wait(); ts.append(job.seconds); i += 8
    ts.sort()
    print(f"{label} {fmt} {backend or 'default'}: jobs of 8 experts, one route: min {ts[0]*1e3:.3f} ms, p10 {ts[len(ts)//10]*1e3:.3f}")
    ex.close()
