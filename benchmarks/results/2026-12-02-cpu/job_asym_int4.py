# One thread, jobs of 8 int4 experts (2048 x 768, groups of 128, min / max quantized: zero points per
# block) at one route each, min and 10th percentile of 2 s; `python3 job_asym_int4.py LABEL` from the
# repository root (tests/ on the path for its bank builder).
import sys, time, torch
sys.path.insert(0, "tests")
import test_cpu_executor as T
from kernels.cpu_executor import CPUExecutor
T.E = 16
gu, down = T.make_bank(2048, 768, torch.float32, 0)
w = T.qbank({"gate_up": gu, "down": down}, "int4", 128, symmetric=False)
print("distinct z per row (gate_up row 0):", w["gate_up"].z[0, 0].unique().numel())
ex = CPUExecutor(1)
x, out = torch.randn(1, 2048).bfloat16(), torch.empty(1, 2048)
rw = torch.full((1, 8), 1 / 8)
for rnd in range(3):
    ts = []; i = 0; t0 = time.perf_counter()
    while time.perf_counter() - t0 < 2:
        job = ex.submit(x, w["gate_up"], w["down"], (torch.arange(8) + i).remainder(16)[None].contiguous(), rw, out)
        job.wait(); ts.append(job.seconds); i += 8
    ts.sort()
    print(f"{sys.argv[1]}: 8 experts one route, min {ts[0]*1e3:.3f} ms, p10 {ts[len(ts)//10]*1e3:.3f} ms")
ex.close()
