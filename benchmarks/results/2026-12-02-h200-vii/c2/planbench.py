"""The plan kernel's time per MoE layer step in a CUDA graph (as decode runs it): python3 planbench.py TAG [BLOCK_S...]
from the tree on PYTHONPATH; 48 layers, 128 experts, top-8, batch 1 and 8, q 0.5 and 1, a warm full cache of S slots."""
import sys
import torch
try:
    from freetoken_kernels.plan_triton import plan
except ImportError:  # a tree from before the package's rename
    from kernels.plan_triton import plan

tag, blocks = sys.argv[1], [int(b) for b in sys.argv[2:]] or [None]
L, E, K, dev = 48, 128, 8, "cuda"
for T in (1, 8):
    for S in (489, 1000, 3478, 7000):
        for q in (0.5, 1.0):
            for bs in blocks:
                g = torch.Generator(device=dev).manual_seed(0)
                slot_of, seen = (torch.full((L * E,), -1, dtype=torch.int64, device=dev) for _ in range(2))
                owner_of, last_use = (torch.full((S,), -1, dtype=torch.int64, device=dev) for _ in range(2))
                clock = torch.zeros(1, dtype=torch.int64, device=dev)
                qt = torch.tensor([q], dtype=torch.float64, device=dev)
                ids = [torch.rand(T, E, device=dev, generator=g).topk(K, dim=1).indices for _ in range(4 * L)]
                route = torch.empty(T, K, dtype=torch.int64, device=dev)
                vic, fetch = (torch.empty(T * K, dtype=torch.int64, device=dev) for _ in range(2))
                counts = torch.zeros(6, dtype=torch.int64, device=dev)
                step = lambda i: plan(ids[i % len(ids)], i % L, E, slot_of, owner_of, last_use, seen, clock, qt,
                                      route, vic, fetch, counts, block_s=bs)
                for i in range(40 * L):  # warm: the cache fills and recency spreads
                    step(i)
                torch.cuda.synchronize()
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr):
                    for i in range(L):
                        step(i)
                gr.replay(); torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                res = []
                for _ in range(5):
                    a.record()
                    for _ in range(10):
                        gr.replay()
                    b.record(); b.synchronize()
                    res.append(a.elapsed_time(b) * 1e3 / (10 * L))
                res.sort()
                print(f"{tag} T={T} S={S} q={q} block_s={bs}: {res[2]:.2f} us a step (min {res[0]:.2f})", flush=True)
