"""Probe (next/plan_regs.patch against main; run in each tree): one plan launch per MoE layer step as decode's graph
runs them, 64 calls (layers in turn, random top-8 routing of 128 experts, q = 0.5) captured in one CUDA graph, us a
call (median of 20 replays, after 50 replays that fill the cache); 8 layers at 470 slots (int4 at 1152 MiB) and 48
layers at 3300 (int4 at 8 GiB). python3 plan_bench.py"""
import statistics
import torch
from freetoken_kernels.plan_triton import plan

dev, E, K = "cuda", 128, 8
for L, S in ((8, 470), (48, 3300)):
    torch.manual_seed(0)
    slot_of, seen = (torch.full((L * E,), -1, dtype=torch.int64, device=dev) for _ in range(2))
    owner_of, last_use = (torch.full((S,), -1, dtype=torch.int64, device=dev) for _ in range(2))
    clock = torch.zeros(1, dtype=torch.int64, device=dev)
    q = torch.tensor([0.5], dtype=torch.float64, device=dev)
    n = 64
    ids = [torch.randperm(E, device=dev)[:K].view(1, K) for _ in range(n)]
    route = torch.empty(1, K, dtype=torch.int64, device=dev)
    vic, fetch = (torch.empty(K, dtype=torch.int64, device=dev) for _ in range(2))
    counts = torch.zeros(6, dtype=torch.int64, device=dev)

    def step(i):
        plan(ids[i], i % L, E, slot_of, owner_of, last_use, seen, clock, q, route, vic, fetch, counts)
    for i in range(n):
        step(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            step(i)
    for _ in range(50):
        g.replay()
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / n)
    c = counts.tolist()
    print(f"{L} layers, {S} slots: plan {statistics.median(ts):.2f} us a call (min {min(ts):.2f}); "
          f"hits {c[3]}, misses {c[4]}, fetched {c[5]} so far", flush=True)
