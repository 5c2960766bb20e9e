"""RMSNorm, the residual add with the next norm, and Gated DeltaNet's gated output norm, in one
launch each (Triton): the semantics of engine.layers.norm's plain functions, one program per row,
with the zero-centered (1 + w) scale of Qwen3-Next/3.5 as a variant. Plain Triton rather than
torch.compile: a kernel comes from Triton's on-disk cache in milliseconds, while a compiled
region is traced again by Dynamo in every new process (and again for prefill-sized inputs)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken_kernels.gemv_triton import counter, last_program, linear_rows


@triton.jit
def _norm_row(row, x_ptr, d_ptr, w_ptr, h_ptr, y_ptr, N, sx, sd, sh, eps,
              ADD: tl.constexpr, GATE: tl.constexpr, CENTERED: tl.constexpr, ROUND: tl.constexpr,
              BLOCK: tl.constexpr):
    """One row. d_ptr: the residual delta (ADD) or the output gate (GATE), read past L1 (.cg): in
    linear_add_rms_norm other programs wrote it just before."""
    offs = tl.arange(0, BLOCK)
    m = offs < N
    DT = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * sx + offs, mask=m, other=0.0).to(tl.float32)
    if ADD:  # h + delta, rounded to the input dtype as torch's add is
        d = tl.load(d_ptr + row * sd + offs, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
        x = (x + d).to(DT).to(tl.float32)
        tl.store(h_ptr + row * sh + offs, x.to(h_ptr.dtype.element_ty), mask=m)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    if CENTERED:                                             # (1 + w) in fp32, rounded once at the store
        y = (x * r) * (1.0 + w)
    else:
        y = w * (x * r).to(DT).to(tl.float32)                # normalised, rounded, then scaled
    if GATE:  # * silu(gate) in fp32, after the scaled norm is rounded to its dtype (w's and x's)
        if ROUND:
            y = y.to(DT).to(tl.float32)
        g = tl.load(d_ptr + row * sd + offs, mask=m, other=0.0).to(tl.float32)
        y = y * (g * tl.sigmoid(g))
    tl.store(y_ptr + row * N + offs, y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _norm_kernel(x_ptr, d_ptr, w_ptr, h_ptr, y_ptr, N, sx, sd, sh, eps,
                 ADD: tl.constexpr, GATE: tl.constexpr, CENTERED: tl.constexpr, ROUND: tl.constexpr,
                 BLOCK: tl.constexpr):
    _norm_row(tl.program_id(0).to(tl.int64), x_ptr, d_ptr, w_ptr, h_ptr, y_ptr, N, sx, sd, sh, eps,
              ADD, GATE, CENTERED, ROUND, BLOCK)


@triton.jit
def _linear_norm_kernel(a_ptr, lw_ptr, lb_ptr, x_ptr, w_ptr, mix_ptr, cnt_ptr, h_ptr, y_ptr, K, N, eps,
                        BIAS: tl.constexpr, CENTERED: tl.constexpr, ROUND: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, BLOCK: tl.constexpr):
    """One token: mix = a @ lw.T (+ lb) (linear_rows); the last program to finish adds mix to x and
    normalises it (_norm_row)."""
    linear_rows(a_ptr, lw_ptr, lb_ptr, mix_ptr, N, K, BIAS, BLOCK_N, BLOCK_K)
    if last_program(cnt_ptr, tl.num_programs(0)):
        _norm_row(0, x_ptr, mix_ptr, w_ptr, h_ptr, y_ptr, N, 0, 0, 0, eps, True, False, CENTERED, ROUND, BLOCK)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, N] with unit stride along N (a view where one exists)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _launch(x, other, weight, eps, add=False, gate=False, centered=False):
    N = x.shape[-1]
    x2 = _rows(x)
    d2 = _rows(other) if other is not None else x2
    # torch's dtypes: the plain norm promotes with the weight; centered and gated ones give x's
    out = x.dtype if centered or gate else torch.promote_types(weight.dtype, x.dtype)
    y = torch.empty(x.shape, dtype=out, device=x.device)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if add else y
    if x2.shape[0]:
        block = triton.next_power_of_2(N)
        _norm_kernel[(x2.shape[0],)](x2, d2, weight, h, y, N, x2.stride(0), d2.stride(0), N, eps,
                                     ADD=add, GATE=gate, CENTERED=centered, ROUND=weight.dtype == x.dtype,
                                     BLOCK=block, num_warps=max(1, min(16, block // 256)))
    return h, y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, centered: bool = False) -> torch.Tensor:
    """x [..., N], weight [N] -> the RMSNorm of x's rows, in the promoted dtype of weight and x
    (centered: scaled by 1 + weight, in x's dtype)."""
    return _launch(x, None, weight, eps, centered=centered)[1]


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, centered: bool = False):
    """-> (h + delta, rms_norm(h + delta)) in one pass."""
    return _launch(h, delta, weight, eps, add=True, centered=centered)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x, gate [..., N] -> rms_norm(x) * silu(gate), the gate applied in fp32, in x's dtype."""
    return _launch(x, gate, weight, eps, gate=True)[1]


def linear_add_rms_norm(x: torch.Tensor, a: torch.Tensor, lin_w: torch.Tensor, lin_b: torch.Tensor | None,
                        weight: torch.Tensor, eps: float, centered: bool = False, scratch: tuple | None = None,
                        block_n: int = 8, block_k: int = 1024, num_warps: int = 8):
    """add_rms_norm(x, F.linear(a, lin_w, lin_b), weight, eps, centered) in one launch for one
    token (decode at batch 1): x [1, N], a [1, K], lin_w [N, K]. The linear layer's sums are fp32
    in another order than a GEMM's, so its output (and from it the rest) may differ from the
    unfused path's by a rounding. scratch = (mix [N] in x's dtype, counter [1] int32, zero, kept
    zero by the kernel), both on x's device; None: a new mix and the device's counter. The default
    tiles were the fastest at T 1 for 4096 -> 2048 and 8192 -> 4096 on an H200
    (benchmarks/RESULTS.md); at more tokens the GEMM and add_rms_norm are faster."""
    (T, N), K = x.shape, a.shape[1]
    assert T == a.shape[0] == 1 and lin_w.shape == (N, K) and lin_w.is_contiguous() and a.stride(1) == x.stride(1) == 1
    mix, cnt = scratch or (torch.empty(N, dtype=x.dtype, device=x.device), counter(x.device))
    out = x.dtype if centered else torch.promote_types(weight.dtype, x.dtype)
    h, y = torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty(x.shape, dtype=out, device=x.device)
    _linear_norm_kernel[(triton.cdiv(N, block_n),)](
        a, lin_w, lin_b if lin_b is not None else lin_w, x, weight, mix, cnt, h, y, K, N, eps,
        BIAS=lin_b is not None, CENTERED=centered, ROUND=weight.dtype == x.dtype, BLOCK_N=block_n,
        BLOCK_K=min(block_k, triton.next_power_of_2(K)), BLOCK=triton.next_power_of_2(N), num_warps=num_warps)
    return h, y
