"""Probe (with g33-34/fused_router.patch): the router of a decode step, Qwen3-30B-A3B's shape (H 2048, E 128, top-8,
softmax, renormalised), as the graph runs it: 64 calls captured in one CUDA graph, us a call (median of 20
replays), the GEMM + route kernel (main's) against route_linear at each (block_e, num_warps); T = 1 and 8.
python3 router_bench.py"""
import torch
import torch.nn.functional as F
from graph_timing import timed
from freetoken_kernels.router_triton import FUSED_MAX_T, route, route_linear

H, E, K = 2048, 128, 8
dev = "cuda"


torch.manual_seed(0)
w = (torch.randn(E, H) / H ** 0.5).bfloat16().to(dev)
for T in (1, 8):
    x = torch.randn(T, H).bfloat16().to(dev)
    scratch = (torch.empty(FUSED_MAX_T, E, dtype=x.dtype, device=dev), torch.zeros(1, dtype=torch.int32, device=dev))
    args = (K, "softmax", True, 1.0)
    ref_w, ref_ids = route(F.linear(x, w), *args)
    print(f"T={T} GEMM + route kernel: {timed(lambda: route(F.linear(x, w), *args)):.2f} us", flush=True)
    for be in (1, 2, 4):
        for nw in (1, 2, 4):
            fw, fids = route_linear(x, w, None, *args, scratch=scratch, block_e=be, num_warps=nw)
            same = torch.equal(fids, ref_ids)
            us = timed(lambda: route_linear(x, w, None, *args, scratch=scratch, block_e=be, num_warps=nw))
            print(f"T={T} route_linear block_e={be} num_warps={nw}: {us:.2f} us; ids as the GEMM's: {same}; "
                  f"max |dw| {(fw.float() - ref_w.float()).abs().max().item():.2e}", flush=True)
