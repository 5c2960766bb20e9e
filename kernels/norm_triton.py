"""RMSNorm, and the residual add with the next norm, in one launch each (Triton): the semantics of
engine.layers.norm's plain functions, one program per row. Plain Triton rather than
torch.compile: a kernel comes from Triton's on-disk cache in milliseconds, while a compiled
region is traced again by Dynamo in every new process (and again for prefill-sized inputs)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_kernel(x_ptr, d_ptr, w_ptr, h_ptr, y_ptr, N, sx, sd, sh, eps,
                 ADD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < N
    DT = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * sx + offs, mask=m, other=0.0).to(tl.float32)
    if ADD:  # h + delta, rounded to the input dtype as torch's add is
        x = (x + tl.load(d_ptr + row * sd + offs, mask=m, other=0.0).to(tl.float32)).to(DT).to(tl.float32)
        tl.store(h_ptr + row * sh + offs, x.to(h_ptr.dtype.element_ty), mask=m)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    y = w * (x * r).to(DT).to(tl.float32)                    # normalised, rounded, then scaled
    tl.store(y_ptr + row * N + offs, y.to(y_ptr.dtype.element_ty), mask=m)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, N] with unit stride along N (a view where one exists)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _launch(x, delta, weight, eps):
    N = x.shape[-1]
    x2 = _rows(x)
    d2 = _rows(delta) if delta is not None else x2
    y = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if delta is not None else y
    if x2.shape[0]:
        block = triton.next_power_of_2(N)
        _norm_kernel[(x2.shape[0],)](x2, d2, weight, h, y, N, x2.stride(0), d2.stride(0), N, eps,
                                     ADD=delta is not None, BLOCK=block, num_warps=max(1, min(16, block // 256)))
    return h, y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., N], weight [N] -> the RMSNorm of x's rows, in the promoted dtype of weight and x."""
    return _launch(x, None, weight, eps)[1]


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """-> (h + delta, rms_norm(h + delta)) in one pass."""
    return _launch(h, delta, weight, eps)
