"""Probe: bf16 expert FFNs on the CPU through torch's matmul (oneDNN; AMX where the CPU has it) beside
the executor's kernel, jobs of T tokens routed to the same 8 experts, weights cycling through a bank
beyond the caches. GFLOP/s (6*H*I per route) and GB/s of expert bytes."""
import json, sys, time, statistics
import torch
import torch.nn.functional as F
from kernels.cpu_executor import expert_gbps, expert_bytes

H, I = 2048, 512
print("capability", torch.backends.cpu.get_cpu_capability(), "mkldnn", torch.backends.mkldnn.is_available(), flush=True)
per = 3 * H * I * 2
n = (2 << 30) // per
gu = torch.randn(n, 2 * I, H).bfloat16() * 0.02
down = torch.randn(n, H, I).bfloat16() * 0.02
res = {}
def torch_run(T, threads, seconds=0.6):
    torch.set_num_threads(threads)
    x = torch.randn(T, H).bfloat16()
    i, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        out = torch.zeros(T, H)
        for k in range(8):
            e = (i + k) % n
            h = F.linear(x, gu[e])
            a = F.silu(h[:, :I]) * h[:, I:]
            out += F.linear(a, down[e]).float()
        i += 8
    dt = time.perf_counter() - t0
    return i * per / dt / 1e9
threads_list = [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else [2]
for th in threads_list:
    for T in (1, 8, 16, 32, 64):
        a = statistics.median(torch_run(T, th) for _ in range(3))
        b = statistics.median(expert_gbps("bf16", th, 0.5, 1 << 30, (H, I), tokens=T) for _ in range(3))
        fl = lambda g: round(g * 1e9 / per * T * 6 * H * I / 1e9, 1)
        res[f"threads={th} T={T}"] = dict(torch_gbps=round(a, 1), torch_gflops=fl(a), exec_gbps=round(b, 1), exec_gflops=fl(b))
        print(th, T, res[f"threads={th} T={T}"], flush=True)
print(json.dumps(res))
