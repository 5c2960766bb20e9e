"""The CPU branch's transfers in a CUDA graph as kernels over UVA (the pinned host buffers are
mapped): staging the CPU routes' inputs into host memory, and merging the CPU's partial sum back.
One launch each, instead of a where and three copies, and a copy, an add and a cast. Semantics
(tested against plain torch): ids_h = where(route < 0, ids, -1), x_h = x, w_h = float(w),
n_h = n; y = (out + out_h).to(y.dtype)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _stage_kernel(x_ptr, ids_ptr, route_ptr, w_ptr, n_ptr, xh_ptr, idsh_ptr, wh_ptr, nh_ptr, H, K,
                  BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    if t == 0:
        tl.store(nh_ptr, tl.load(n_ptr))
    k = tl.arange(0, BLOCK_K)
    mk = k < K
    ids = tl.load(ids_ptr + t * K + k, mask=mk, other=-1)
    route = tl.load(route_ptr + t * K + k, mask=mk, other=0)
    tl.store(idsh_ptr + t * K + k, tl.where(route < 0, ids, -1), mask=mk)
    tl.store(wh_ptr + t * K + k, tl.load(w_ptr + t * K + k, mask=mk, other=0.0).to(tl.float32), mask=mk)
    for h0 in range(0, H, BLOCK_H):
        o = h0 + tl.arange(0, BLOCK_H)
        m = o < H
        v = tl.load(x_ptr + t * H + o, mask=m, other=0.0)
        tl.store(xh_ptr + t * H + o, v.to(xh_ptr.dtype.element_ty), mask=m)


@triton.jit
def _merge_kernel(out_ptr, outh_ptr, y_ptr, done_ptr, N, BLOCK: tl.constexpr):
    p = tl.program_id(0)
    if p == 0:
        tl.store(done_ptr, 0)                            # re-arm the CPU branch's answer flag
    i = p.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    v = tl.load(out_ptr + i, mask=m, other=0.0) + tl.load(outh_ptr + i, mask=m, other=0.0)
    tl.store(y_ptr + i, v.to(y_ptr.dtype.element_ty), mask=m)


def stage_cpu_inputs(x: torch.Tensor, ids: torch.Tensor, route: torch.Tensor, w: torch.Tensor,
                     n: torch.Tensor, x_h: torch.Tensor, ids_h: torch.Tensor, w_h: torch.Tensor,
                     n_h: torch.Tensor) -> None:
    """x [T, H], ids / route / w [T, K], n [1] (experts this step fills) on the device -> rows
    0..T of the host buffers x_h [Tmax, H] (its dtype), ids_h [Tmax, K] int64, w_h [Tmax, K]
    fp32, and n_h [1] int64."""
    T, H = x.shape
    K = ids.shape[1]
    _stage_kernel[(T,)](x.contiguous(), ids.contiguous(), route.contiguous(), w.contiguous(), n, x_h, ids_h,
                        w_h, n_h, H, K, BLOCK_K=triton.next_power_of_2(K), BLOCK_H=min(1024, triton.next_power_of_2(H)))


def merge_cpu_output(out: torch.Tensor, out_h: torch.Tensor, dtype: torch.dtype, done: torch.Tensor) -> torch.Tensor:
    """out [T, H] fp32 on the device + rows 0..T of out_h [Tmax, H] fp32 on the host -> [T, H]
    dtype; done [1] int32 (mapped host memory) is set to 0."""
    y = torch.empty(out.shape, dtype=dtype, device=out.device)
    n, block = out.numel(), 1024
    _merge_kernel[(triton.cdiv(n, block),)](out.contiguous(), out_h, y, done, n, BLOCK=block)
    return y


@triton.jit
def _signal_kernel(flag_ptr, value):
    tl.atomic_xchg(flag_ptr, value, sem="release", scope="sys")  # after all earlier writes


def signal(flag: torch.Tensor, value: int) -> None:
    """On the current stream, once prior work is done: flag [1] int32 (mapped host memory) = value,
    ordered after every earlier write of the stream. A launch costs less than a stream memory
    operation inside a graph."""
    _signal_kernel[(1,)](flag, value, num_warps=1)
