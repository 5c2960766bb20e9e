"""One int4 decode GEMV call (T = 1, K = 8, H 2048, I 768), for ncu."""
import torch
from kernels import moe_triton as m
(wgu, wd), _ = m._bench_weights("int4", 256, 2048, 768, 128)
x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
w = torch.rand(1, 8, device="cuda")
for i in range(3):
    s = torch.randperm(256, device="cuda")[:8].view(1, 8)
    m.moe_experts(x, wgu, wd, s, w, reduce=False)
torch.cuda.synchronize()
