"""A decode step's routes summed into the layer's output as one kernel, instead of a sum over the
routes and a cast (two kernels), and with the CPU branch: its partial sum merged back in a CUDA
graph over UVA (the pinned host buffer is mapped), instead of a copy and an add too. Semantics
(tested against plain torch): y = (out summed over its routes [+ out_h]).to(y.dtype)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _merge_kernel(out_ptr, outh_ptr, y_ptr, done_ptr, counts_ptr, go, N, H, K: tl.constexpr, BLOCK: tl.constexpr,
                  HOST: tl.constexpr):
    p = tl.program_id(0)
    i = p.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    row = (i // H) * K * H + i % H                      # out [T, K, H]: the routes of token i // H
    v = tl.zeros([BLOCK], tl.float32)
    if HOST:
        if tl.load(counts_ptr + 1) > tl.load(counts_ptr + 2):  # a miss left to the CPU: wait for its answer
            while tl.load(done_ptr, volatile=True) != go:
                pass
            v = tl.load(outh_ptr + i, mask=m, other=0.0, volatile=True)
    for k in range(K):
        v += tl.load(out_ptr + row + k * H, mask=m, other=0.0)
    tl.store(y_ptr + i, v.to(y_ptr.dtype.element_ty), mask=m)


def merge_routes(out: torch.Tensor, dtype: torch.dtype, out_h: torch.Tensor | None = None,
                 done: torch.Tensor | None = None, counts: torch.Tensor | None = None, go: int = 0) -> torch.Tensor:
    """out [T, H] (or [T, K, H], summed over K in order here) fp32 on the device [+ rows 0..T of
    out_h [Tmax, H] fp32 on the host, the CPU branch's, when the plan's counts [>= 3] (hits,
    misses, fills) left a miss to the CPU: read once done [1] int32 (mapped host memory), the
    poller's answer, equals go] -> [T, H] dtype."""
    T, H, K = out.shape[0], out.shape[-1], out.shape[1] if out.dim() == 3 else 1
    y = torch.empty(T, H, dtype=dtype, device=out.device)
    n, block, host = T * H, 1024, out_h is not None
    _merge_kernel[(triton.cdiv(n, block),)](out.contiguous(), out_h if host else out, y, done if host else out,
                                            counts if host else out, go, n, H, K=K, BLOCK=block, HOST=host)
    return y
