"""Prefill routed-expert FFN over the slots (Triton): freetoken_kernels.ref.moe_experts for many routes,
as grouped GEMMs over the routes sorted by slot, for quantized and plain experts alike.

A program takes up to BLOCK_M routes of one slot and a block of output rows, dequantizes the
weight tiles in registers exactly as QWeight.dequant does, rounds them to x's dtype (the
reference's W) and multiplies on the tensor cores (tl.dot, fp32 accumulation). A computes
h = act(x Wg^T + bg, x Wu^T + bu) per route in x's dtype, B weights[t, k] * (h Wd^T + bd) per
route in fp32, summed over k in a fixed order (deterministic, no atomics). Routes of slot -1
contribute 0. act is freetoken_kernels.ref.ExpertAct; the biases are optional.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from freetoken_kernels.quant import QWeight
from freetoken_kernels.ref import SILU, ExpertAct, ExpertBias


@triton.jit
def e2m1(c, P: tl.constexpr):
    """E2M1 of the nibble at bits 4P..4P+3 of the int32 c, times 2**-126: the nibble shifted to
    the top (sign at bit 31), then arithmetically right by 6 (exponent and mantissa at bits
    22-24, the sign copied down to bit 25) and masked: a float32's bits (exponent 0 is the
    subnormal 0.5 * 2**-126, as E2M1's is 0.5). Three integer ops; -0x7E400000 is 0x81C00000."""
    return (((c << (28 - 4 * P)) >> 6) & -0x7E400000).to(tl.float32, bitcast=True)


@triton.jit
def gated(g, u, alpha, limit, shift, CLAMP: tl.constexpr):
    """freetoken_kernels.ref.ExpertAct in fp32: g * sigmoid(alpha g) * (u + shift), g and u clamped at
    limit first when CLAMP (alpha 1, shift 0, no CLAMP: silu(g) * u)."""
    if CLAMP:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    return g / (1.0 + tl.exp(-alpha * g)) * (u + shift)


@triton.jit
def _w_tile(q_ptr, s_ptr, z_ptr, rows, mr, k0, Kdim, sq_r, ss_r, sz_r, FMT: tl.constexpr,
            BN: tl.constexpr, BK: tl.constexpr, GK: tl.constexpr, BLOCK_K: tl.constexpr,
            EVEN_K: tl.constexpr):
    """W[rows, k0:k0 + BLOCK_K] float32, as QWeight.dequant computes it, from one slot's parts
    (uint8 codes; GK divides the quantization block BK; a scale row per BN rows); FMT "plain":
    q is the weight itself (bf16, fp16 or fp32)."""
    R: tl.constexpr = rows.shape[0]
    if FMT == "plain":
        offs = k0 + tl.arange(0, BLOCK_K)
        m = mr[:, None] if EVEN_K else mr[:, None] & (offs < Kdim)[None, :]
        return tl.load(q_ptr + rows[:, None] * sq_r + offs[None, :], mask=m, other=0.0).to(tl.float32)
    PACK: tl.constexpr = 2 if FMT == "int4" or FMT == "mxfp4" else 1
    offs = k0 // PACK + tl.arange(0, BLOCK_K // PACK)
    m = mr[:, None] if EVEN_K else mr[:, None] & (offs < Kdim // PACK)[None, :]
    c = tl.load(q_ptr + rows[:, None] * sq_r + offs[None, :], mask=m, other=0.0)
    if FMT == "fp8":
        v = c.to(tl.float32)
    else:
        c = c.to(tl.int32)
        if PACK == 2:                                    # even k in the low nibble
            c = tl.reshape(tl.join(c & 15, c >> 4), [R, BLOCK_K])
        if FMT == "mxfp4":
            v = e2m1(c, 0) * (2.0 ** 126)
        else:                                            # float bits of 2**23 + code
            v = (c | 0x4B000000).to(tl.float32, bitcast=True)
    SG: tl.constexpr = BLOCK_K // GK
    kg = k0 + tl.arange(0, SG) * GK                      # first column of each chunk
    mg = mr[:, None] if EVEN_K else mr[:, None] & (kg < Kdim)[None, :]
    v = tl.reshape(v, [R, SG, GK])
    if FMT == "int4" or FMT == "int8":
        z = tl.load(z_ptr + rows[:, None] * sz_r + (kg // BK)[None, :], mask=mg, other=0)
        v = v - (z.to(tl.float32) + 8388608.0)[:, :, None]
    s = tl.load(s_ptr + (rows // BN)[:, None] * ss_r + (kg // BK)[None, :], mask=mg, other=0)
    if FMT == "mxfp4":                                   # e8m0 e -> 2**(e - 127), e = 0 subnormal
        e = s.to(tl.int32)
        s = tl.where(e > 0, e << 23, 0x400000).to(tl.float32, bitcast=True)
    return tl.reshape(v * s.to(tl.float32)[:, :, None], [R, BLOCK_K])


@triton.jit
def _tile_routes(tile_ptr, order_ptr, BLOCK_M: tl.constexpr):
    """The program's tile (slot, first, end) of the sorted routes: positions, their mask, the
    routes (t * K + k) and the slot (int64)."""
    t = tl.program_id(0)
    slot = tl.load(tile_ptr + 3 * t).to(tl.int64)
    pos = tl.load(tile_ptr + 3 * t + 1) + tl.arange(0, BLOCK_M)
    mp = pos < tl.load(tile_ptr + 3 * t + 2)                 # all false in an empty tile
    return pos, mp, tl.load(order_ptr + pos, mask=mp, other=0), slot


@triton.jit
def _gate_up_gemm(x_ptr, q_ptr, s_ptr, z_ptr, sq_s, sq_r, ss_s, ss_r, sz_s, sz_r, tile_ptr,
                  order_ptr, h_ptr, b_ptr, sb_s, H, I, K, sx_t, alpha, limit, shift,
                  FMT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GK: tl.constexpr,
                  PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, BIAS: tl.constexpr,
                  CLAMP: tl.constexpr):
    if tl.load(tile_ptr + 3 * tl.program_id(0) + 1) >= tl.load(tile_ptr + 3 * tl.program_id(0) + 2):
        return  # an empty tile (past the last)
    pos, mp, route, slot = _tile_routes(tile_ptr, order_ptr, BLOCK_M)
    j = tl.arange(0, 2 * BLOCK_N)                        # gate and up rows interleaved
    offs_n = tl.program_id(1) * BLOCK_N + j // 2
    rows, mn = offs_n + (j % 2) * I, offs_n < I
    q_ptr, s_ptr, z_ptr = q_ptr + slot * sq_s, s_ptr + slot * ss_s, z_ptr + slot * sz_s
    x_rows = x_ptr + (route // K)[:, None] * sx_t
    acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mx = mp[:, None] if EVEN_K else mp[:, None] & (offs_k < H)[None, :]
        xt = tl.load(x_rows + offs_k[None, :], mask=mx, other=0.0)
        wt = _w_tile(q_ptr, s_ptr, z_ptr, rows, mn, k0, H, sq_r, ss_r, sz_r, FMT, BN, BK, GK,
                     BLOCK_K, EVEN_K).to(x_ptr.dtype.element_ty)
        acc = tl.dot(xt, tl.trans(wt), acc, input_precision=PREC)
    if BIAS:
        acc += tl.load(b_ptr + slot * sb_s + rows, mask=mn, other=0.0)[None, :]
    g, u = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))
    h = gated(g, u, alpha, limit, shift, CLAMP)          # [BLOCK_M, BLOCK_N]
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(h_ptr + pos[:, None] * I + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
             mask=mp[:, None] & (offs_n < I)[None, :])


@triton.jit
def _down_gemm(h_ptr, q_ptr, s_ptr, z_ptr, sq_s, sq_r, ss_s, ss_r, sz_s, sz_r, tile_ptr,
               order_ptr, rw_ptr, y_ptr, b_ptr, sb_s, H, I, FMT: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, GK: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, BIAS: tl.constexpr):
    if tl.load(tile_ptr + 3 * tl.program_id(0) + 1) >= tl.load(tile_ptr + 3 * tl.program_id(0) + 2):
        return  # an empty tile (past the last)
    pos, mp, route, slot = _tile_routes(tile_ptr, order_ptr, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = offs_n < H
    q_ptr, s_ptr, z_ptr = q_ptr + slot * sq_s, s_ptr + slot * ss_s, z_ptr + slot * sz_s
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, I, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mh = mp[:, None] if EVEN_K else mp[:, None] & (offs_k < I)[None, :]
        ht = tl.load(h_ptr + pos[:, None] * I + offs_k[None, :], mask=mh, other=0.0)
        wt = _w_tile(q_ptr, s_ptr, z_ptr, offs_n, mn, k0, I, sq_r, ss_r, sz_r, FMT, BN, BK, GK,
                     BLOCK_K, EVEN_K).to(h_ptr.dtype.element_ty)
        acc = tl.dot(ht, tl.trans(wt), acc, input_precision=PREC)
    if BIAS:
        acc += tl.load(b_ptr + slot * sb_s + offs_n, mask=mn, other=0.0)[None, :]
    wt_r = tl.load(rw_ptr + route, mask=mp, other=0.0).to(tl.float32)
    tl.store(y_ptr + route[:, None] * H + offs_n[None, :], acc * wt_r[:, None],
             mask=mp[:, None] & mn[None, :])


def act_args(act: ExpertAct) -> tuple[tuple[float, float, float], bool]:
    """(alpha, limit, shift) kernel arguments and the CLAMP constexpr of an activation."""
    return (float(act.alpha), 0.0 if act.limit is None else float(act.limit), float(act.shift)), act.limit is not None


def bias_args(bias: ExpertBias | None, x: torch.Tensor) -> tuple[tuple, tuple]:
    """(pointer, slot stride) of the gate_up and of the down bias (x as a stand-in without)."""
    if bias is None:
        return (x, 0), (x, 0)
    assert all(b.dtype == torch.float32 and b.stride(1) == 1 for b in bias)
    return tuple((b, b.stride(0)) for b in bias)


def _parts(w: QWeight | torch.Tensor, block_k: int) -> tuple[tuple, dict]:
    """A QWeight's kernel arguments: parts (q as a stand-in for an absent z) with their (slot,
    row) strides, and its format constexprs; a plain weight stands in for all three parts."""
    if not isinstance(w, QWeight):
        assert w.stride(2) == 1
        return (w, w, w, w.stride(0), w.stride(1), 0, 0, 0, 0), dict(FMT="plain", BN=1, BK=block_k, GK=block_k)
    q, s, z = w.q, w.s, w.q if w.z is None else w.z
    assert q.stride(2) == 1 and s.stride(2) == 1 and z.stride(2) == 1
    bn, bk = w.block
    return ((q, s, z, q.stride(0), q.stride(1), s.stride(0), s.stride(1), z.stride(0), z.stride(1)),
            dict(FMT=w.fmt, BN=bn, BK=bk, GK=math.gcd(block_k, bk)))


def _tiles(slots: torch.Tensor, block_m: int, distinct: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Routes sorted by slot, and int32 [n, 3] tiles (slot, first, end) of at most block_m of them,
    one slot each, skipping slot -1, built on the device without waiting for it: n =
    cdiv(routes, block_m) + distinct bounds their number from the shapes alone (distinct: at most
    that many slots among the routes), and the tiles past the last are empty (first = end = 0)."""
    flat = slots.reshape(-1)
    R, dev = flat.numel(), flat.device
    order = torch.argsort(flat, stable=True)
    s, i = flat[order], torch.arange(R, device=dev)
    new = torch.ones(R, dtype=torch.bool, device=dev)   # the first route of each slot's run
    new[1:] = s[1:] != s[:-1]
    last = torch.ones_like(new)
    last[:-1] = new[1:]
    first = torch.cummax(torch.where(new, i, 0), 0).values
    end = torch.cummin(torch.where(last, i + 1, R).flip(0), 0).values.flip(0)
    head = ((i - first) % block_m == 0) & (s >= 0)      # a tile starts here
    n = -(-R // block_m) + min(distinct, R)
    tiles = torch.zeros(n + 1, 3, dtype=torch.int32, device=dev)  # row n: where the other routes go
    at = torch.where(head, torch.cumsum(head, 0) - 1, n)
    tiles.index_put_((at,), torch.stack([s, i, torch.minimum(i + block_m, end)], 1).to(torch.int32))
    return order, tiles[:n]


def moe_experts_gemm(x: torch.Tensor, w_gate_up: QWeight | torch.Tensor, w_down: QWeight | torch.Tensor,
                     slots: torch.Tensor, weights: torch.Tensor, act: ExpertAct = SILU, bias: ExpertBias | None = None,
                     blocks: tuple[int, int, int, int, int] = (64, 64, 64, 64, 64),
                     experts: int | None = None, reduce: bool = True, routes: torch.Tensor | None = None) -> torch.Tensor:
    """ref.moe_experts: x [T, H]; w_gate_up [S, 2I, H], w_down [S, H, I] (QWeights or tensors);
    slots [T, K] (-1 = elsewhere); weights [T, K]; act, bias, reduce and routes as the reference
    takes them -> [T, H] float32 (without reduce [T, K, H]). blocks = (BLOCK_M, BLOCK_N, BLOCK_K
    of A, BLOCK_N, BLOCK_K of B). experts: at most that many distinct slots among the routes (a
    layer's experts; default S), which bounds the programs launched: nothing here waits for the
    device."""
    T, H = x.shape
    K, I = slots.shape[1], w_down.shape[2]
    assert tuple(w_gate_up.shape[1:]) == (2 * I, H) and w_down.shape[1] == H and x.stride(1) == 1
    bm, bn, bk, bn2, bk2 = blocks
    order, tiles = _tiles(slots, bm, min(experts or w_gate_up.shape[0], w_gate_up.shape[0]))
    y = torch.zeros(T * K, H, dtype=torch.float32, device=x.device) if routes is None \
        else routes.view(T * K, H)                                      # weighted, per route
    if len(tiles):
        prec = "ieee" if x.dtype == torch.float32 else "tf32"            # fp32: no TF32 rounding
        h = torch.empty(T * K, I, dtype=x.dtype, device=x.device)      # by sorted position
        (b_gu, b_d), (a, clamp) = bias_args(bias, x), act_args(act)
        parts, fmt = _parts(w_gate_up, bk)
        _gate_up_gemm[(len(tiles), triton.cdiv(I, bn))](
            x, *parts, tiles, order, h, *b_gu, H, I, K, x.stride(0), *a, **fmt, PREC=prec, BLOCK_M=bm,
            BLOCK_N=bn, BLOCK_K=bk, EVEN_K=H % bk == 0, BIAS=bias is not None, CLAMP=clamp)
        parts, fmt = _parts(w_down, bk2)
        _down_gemm[(len(tiles), triton.cdiv(H, bn2))](
            h, *parts, tiles, order, weights.reshape(-1).contiguous(), y, *b_d, H, I, **fmt, PREC=prec,
            BLOCK_M=bm, BLOCK_N=bn2, BLOCK_K=bk2, EVEN_K=I % bk2 == 0, BIAS=bias is not None)
    return y.view(T, K, H).sum(1) if reduce else y.view(T, K, H)
