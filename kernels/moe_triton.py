"""Decode-time routed-expert FFN (Triton): the semantics of kernels.ref.moe_experts for small T.

Two memory-bound GEMV kernels read each expert's weights straight from the slot pool (strided
views, never copied): A computes the activated intermediate h[r] = silu(x Wg^T) * (x Wu^T) per
route r = (t, k) into a [T*K, I] fp32 buffer, B computes weights[t, k] * (h[r] Wd^T) per route
into [T*K, H] fp32 partials, summed over k in a fixed order (deterministic, no atomics).
Weights are rounded to x's dtype as the reference does; every product is accumulated in fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import ref


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, slot_ptr, h_ptr, H, I, K, sx_t, sw_s, sw_r,
                    BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr):
    r, ib = tl.program_id(0), tl.program_id(1)           # route r = t*K + k, block of I rows
    s = tl.load(slot_ptr + r).to(tl.int64)
    offs_i = ib * BLOCK_I + tl.arange(0, BLOCK_I)
    mi = offs_i < tl.where(s >= 0, I, 0)                 # slot -1: computed elsewhere -> h = 0
    base = w_ptr + tl.maximum(s, 0) * sw_s               # int64: a pool can exceed 2^31 elements
    g = tl.zeros([BLOCK_I], tl.float32)
    u = tl.zeros([BLOCK_I], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mh = offs_h < H
        xv = tl.load(x_ptr + (r // K) * sx_t + offs_h, mask=mh, other=0.0).to(tl.float32)
        m2 = mi[:, None] & mh[None, :]
        ptrs = base + offs_i[:, None] * sw_r + offs_h[None, :]   # [BLOCK_I, BLOCK_H] gate rows
        wg = tl.load(ptrs, mask=m2, other=0.0).to(x_ptr.dtype.element_ty).to(tl.float32)
        wu = tl.load(ptrs + I * sw_r, mask=m2, other=0.0).to(x_ptr.dtype.element_ty).to(tl.float32)
        g += tl.sum(wg * xv[None, :], axis=1)
        u += tl.sum(wu * xv[None, :], axis=1)
    h = g / (1.0 + tl.exp(-g)) * u                       # silu(gate) * up, [BLOCK_I]
    tl.store(h_ptr + r * I + offs_i, h, mask=offs_i < I)


@triton.jit
def _down_kernel(h_ptr, w_ptr, slot_ptr, rw_ptr, y_ptr, H, I, sw_s, sw_r, XDT: tl.constexpr,
                 BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr):
    r, ob = tl.program_id(0), tl.program_id(1)           # route, block of H output rows
    s = tl.load(slot_ptr + r).to(tl.int64)
    live = s >= 0
    wt = tl.where(live, tl.load(rw_ptr + r).to(tl.float32), 0.0)
    offs_o = ob * BLOCK_O + tl.arange(0, BLOCK_O)
    mo = offs_o < tl.where(live, H, 0)
    base = w_ptr + tl.maximum(s, 0) * sw_s
    acc = tl.zeros([BLOCK_O], tl.float32)
    for i0 in range(0, I, BLOCK_I):
        offs_i = i0 + tl.arange(0, BLOCK_I)
        mi = offs_i < I
        hv = tl.load(h_ptr + r * I + offs_i, mask=mi, other=0.0)       # [BLOCK_I] fp32
        w = tl.load(base + offs_o[:, None] * sw_r + offs_i[None, :],    # [BLOCK_O, BLOCK_I]
                    mask=mo[:, None] & mi[None, :], other=0.0)
        acc += tl.sum(w.to(XDT).to(tl.float32) * hv[None, :], axis=1)
    tl.store(y_ptr + r * H + offs_o, acc * wt, mask=offs_o < H)


_TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def moe_experts(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                slots: torch.Tensor, weights: torch.Tensor, act: str = "silu",
                blocks: tuple[int, int, int, int] = (4, 1024, 8, 512), reduce: bool = True) -> torch.Tensor:
    """x [T, H]; w_gate_up [S, 2I, H], w_down [S, H, I] (slot-strided views, inner dims
    contiguous); slots [T, K] (-1 = elsewhere); weights [T, K] -> [T, H] float32 (without
    reduce: the weighted routes [T, K, H], for a consumer that sums them itself).
    blocks = (BLOCK_I, BLOCK_H) of kernel A, (BLOCK_O, BLOCK_I) of kernel B."""
    if act != "silu":
        raise ValueError(f"unknown expert activation {act!r}")
    T, H = x.shape
    K, I = slots.shape[1], w_down.shape[2]
    if T * K == 0:
        return torch.zeros((T, H) if reduce else (T, K, H), dtype=torch.float32, device=x.device)
    assert w_gate_up.shape[1:] == (2 * I, H) and w_down.shape[1] == H
    assert w_gate_up.stride(2) == 1 and w_down.stride(2) == 1 and x.stride(1) == 1
    slots, weights = slots.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
    h = torch.empty(T * K, I, dtype=torch.float32, device=x.device)     # activated, per route
    y = torch.empty(T * K, H, dtype=torch.float32, device=x.device)     # weighted, per route
    bi, bh, bo, bi2 = blocks
    _gate_up_kernel[(T * K, triton.cdiv(I, bi))](
        x, w_gate_up, slots, h, H, I, K, x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1),
        BLOCK_I=bi, BLOCK_H=bh)
    _down_kernel[(T * K, triton.cdiv(H, bo))](
        h, w_down, slots, weights, y, H, I, w_down.stride(0), w_down.stride(1), XDT=_TL[x.dtype],
        BLOCK_O=bo, BLOCK_I=bi2)
    return y.view(T, K, H).sum(1) if reduce else y.view(T, K, H)


def moe_experts_auto(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                     slots: torch.Tensor, weights: torch.Tensor, act: str = "silu", reduce: bool = True) -> torch.Tensor:
    """The Triton kernel for decode-sized batches on CUDA (T*K <= 64), the reference otherwise
    (which always returns the sum over the routes, whatever reduce asks)."""
    if x.is_cuda and slots.numel() <= 64:
        return moe_experts(x, w_gate_up, w_down, slots, weights, act, reduce=reduce)
    return ref.moe_experts(x, w_gate_up, w_down, slots, weights, act)


def bench_moe(T: int = 1, K: int = 8, H: int = 2048, I: int = 768, S: int = 512,
              dtype: torch.dtype = torch.bfloat16, hbm_gbs: float = 4300.0) -> dict:
    """H200 timing: decode MoE from a pool of S slots; GB/s of expert bytes vs HBM, per config."""
    from triton.testing import do_bench
    slot = (3 * I * H + 127) // 128 * 128                # elements per slot (padded, as a pool)
    pool = torch.randn(S, slot, device="cuda", dtype=dtype) * 0.02
    wgu, wd = pool[:, :2 * I * H].view(S, 2 * I, H), pool[:, 2 * I * H:3 * I * H].view(S, H, I)
    x = torch.randn(T, H, device="cuda", dtype=dtype)
    slots = torch.stack([torch.randperm(S, device="cuda")[:K] for _ in range(T)])
    w = torch.rand(T, K, device="cuda")
    nbytes = T * K * 3 * I * H * pool.element_size()
    res = {"bytes": nbytes}
    for blocks in [(8, 512, 16, 256), (4, 1024, 8, 512), (16, 256, 32, 128), (8, 256, 8, 256)]:
        ms = do_bench(lambda: moe_experts(x, wgu, wd, slots, w, blocks=blocks))
        res[str(blocks)] = {"us": ms * 1e3, "GB/s": nbytes / ms / 1e6,
                            "of_hbm": nbytes / ms / 1e6 / hbm_gbs}
    ms = do_bench(lambda: ref.moe_experts(x, wgu, wd, slots, w))
    res["ref_us"] = ms * 1e3
    return res
