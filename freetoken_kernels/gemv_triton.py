"""One token's linear layer as the fused one-token kernels compute it (router_triton.route_linear,
norm_triton.linear_add_rms_norm): BLOCK_N rows of the weight a program, fp32 sums stored in the
output's dtype; then the handshake by which the last program to finish runs the rest. At batch 1 a
layer step is launch-bound, and this puts a small kernel's work behind the GEMV in one launch."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_COUNTERS: dict[torch.device, torch.Tensor] = {}


def counter(device: torch.device) -> torch.Tensor:
    """The int32 counter [1] for last_program on device, zero, shared by every fused one-token
    kernel: each leaves it zero, and a device's forward launches its kernels one after another on
    one stream. Made at the first call (a forward's warm-up, before any CUDA graph is captured)."""
    c = _COUNTERS.get(device)
    if c is None:
        c = _COUNTERS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return c


@triton.jit
def linear_rows(x_ptr, w_ptr, b_ptr, out_ptr, N, K, BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """out[n] = x . w[n] (+ b[n]) for this program's BLOCK_N rows n of w [N, K] (x [K])."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = n < N
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        mk = k < K
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * K + k[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
        x = tl.load(x_ptr + k, mask=mk, other=0.0)
        acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    if BIAS:
        acc += tl.load(b_ptr + n, mask=mn, other=0.0).to(tl.float32)
    tl.store(out_ptr + n, acc.to(out_ptr.dtype.element_ty), mask=mn)


@triton.jit
def last_program(cnt_ptr, count):
    """True in the last of count programs to arrive at the counter cnt_ptr (zero before; re-armed
    here): every program's stores before the call are visible to it (a CTA barrier, then one
    thread's release; the last one's acquire). It reads them past L1 (.cg)."""
    tl.debug_barrier()
    last = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == count - 1
    if last:
        tl.store(cnt_ptr, 0)
    return last
