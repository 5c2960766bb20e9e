# a decode-sized executor job's latency by its experts: jobfix.py TAG FMT THREADS [GAP_US]
# T = 1, K = 8 routes of which E go to distinct experts (the rest -1, computed elsewhere), cycling
# through a 1 GiB bank; job.seconds (submit to retire, the executor's clock), median and min over 0.5 s.
import statistics, sys, time
import torch
from kernels.cpu_executor import CPUExecutor, _constant_bank, expert_bytes
tag, fmt, th = sys.argv[1], sys.argv[2], int(sys.argv[3])
gap = float(sys.argv[4]) * 1e-6 if len(sys.argv) > 4 else 0.0
per = expert_bytes(fmt)
n = max(16, (1 << 30) // per)
gu, dn = _constant_bank(fmt, n, 2048, 768)
ex = CPUExecutor(th)
x, out, w = torch.randn(1, 2048).bfloat16(), torch.empty(1, 2048), torch.full((1, 8), 1 / 8)
row = []
for E in (1, 2, 3, 4, 8):
    secs, i, t0 = [], 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        ids = torch.full((1, 8), -1, dtype=torch.int64)
        ids[0, :E] = (torch.arange(E) + i) % n
        j = ex.submit(x, gu, dn, ids, w, out); j.wait(); secs.append(j.seconds); i += E
        if gap:
            t1 = time.perf_counter()
            while time.perf_counter() - t1 < gap: pass
    med = statistics.median(secs)
    row.append(f"E{E} {med * 1e6:.0f} us (min {min(secs) * 1e6:.0f}) {E * per / med / 1e9:.1f} GB/s")
ex.close()
print(tag, fmt, f"threads {th}", f"gap {gap * 1e6:.0f} us", " | ".join(row), flush=True)
