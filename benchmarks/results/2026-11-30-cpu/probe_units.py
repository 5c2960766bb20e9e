"""Per-job time of the CPU expert executor (2 threads) for batch-1 jobs of k distinct experts of
Qwen3-30B-A3B size (bf16): median over 50 jobs after 10 warm-up jobs."""
import time, torch, statistics
from kernels.cpu_executor import CPUExecutor
H, I, E = 2048, 768, 64
torch.manual_seed(0)
wgu = (torch.randn(E, 2 * I, H) * 0.02).bfloat16()
wd = (torch.randn(E, H, I) * 0.02).bfloat16()
ex = CPUExecutor(2)
x = torch.randn(1, H).bfloat16()
out = torch.empty(1, H)
for k in (1, 2, 4, 8):
    ts = []
    for rep in range(60):
        ids = torch.randperm(E)[:k].view(1, k)
        w = torch.rand(1, k)
        f = ex.submit(x, wgu, wd, ids, w, out); f.wait(); ts.append(f.seconds)
    print(k, f"{statistics.median(ts[10:]) * 1e6:.0f} us", f"{k * 9437184 / statistics.median(ts[10:]) / 1e9:.1f} GB/s")
