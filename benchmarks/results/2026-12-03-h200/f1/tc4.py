"""int4 decode expert GEMVs on the tensor cores (probe). Two codes of a word become one bf16x2
register with one LOP3 (code | 0x4300 is the bf16 128 + code, exact), so a register holds the
codes j and j + 4 of one word: the dot's K order is permuted (pairs (j, j+4) of each word) and x
is read in that order. The zero point comes off after the dot: (128 + z) * sum(x) per group.
Routes as in kernels.moe_triton (one program a route and block of rows); x broadcast to 16 columns."""
import torch
import triton
import triton.language as tl

from kernels.moe_gemm_triton import gated

M43 = 0x43004300


@triton.jit
def _group(x_ptr, q_ptr, s_ptr, z_ptr, rows, mr, k0, sq_r, ss_r, sz_r, m43, GK: tl.constexpr, M: tl.constexpr,
           ONE: tl.constexpr, DT: tl.constexpr, OFF: tl.constexpr):
    """[M, 16] fp32: sum over the group of columns k0 + [0, GK) of W[rows, k] x[k] (every column alike).
    ONE: one dot of K = GK over the codes in the order (word, pair j, half) (a register of A is
    one LOP3's bf16x2); else four dots of K = GK / 4, one a pair of planes."""
    G: tl.constexpr = GK // 8
    g = tl.arange(0, G)
    w = tl.load(q_ptr + rows[:, None] * sq_r + (k0 // 8 + g)[None, :], mask=mr[:, None], other=0)   # [M, G] int32
    if ONE:
        t0 = (w & 0x000F000F) | m43
        t1 = ((w >> 4) & 0x000F000F) | m43
        t2 = ((w >> 8) & 0x000F000F) | m43
        t3 = ((w >> 12) & 0x000F000F) | m43
        t = tl.join(tl.join(t0, t2), tl.join(t1, t3))                    # [M, G, 2, 2]: pair j = 2 a + b
        t = tl.reshape(t, [M, G * 4])
        lo = t.to(tl.int16).to(DT, bitcast=True)
        hi = (t >> 16).to(tl.int16).to(DT, bitcast=True)
        a = tl.reshape(tl.join(lo, hi), [M, GK])                          # column 8 g + 2 j + e: code j + 4 e
        e = tl.arange(0, GK)
        col = 8 * (e // 8) + (e % 8) // 2 + 4 * (e % 2)
        xg = tl.load(x_ptr + k0 + col).to(DT)
        xs = tl.sum(xg.to(tl.float32), axis=0)
        part = tl.dot(a, tl.broadcast_to(xg[:, None], [GK, 16]))
    else:
        e = tl.arange(0, 2 * G)
        part = tl.zeros([M, 16], tl.float32)
        xsv = tl.zeros([2 * G], tl.float32)
        for j in tl.static_range(4):
            t = ((w >> (4 * j)) & 0x000F000F) | m43
            lo = t.to(tl.int16).to(DT, bitcast=True)
            hi = (t >> 16).to(tl.int16).to(DT, bitcast=True)
            a = tl.reshape(tl.join(lo, hi), [M, 2 * G])
            xj = tl.load(x_ptr + k0 + 8 * (e // 2) + j + 4 * (e % 2)).to(DT)
            xsv += xj.to(tl.float32)
            part = tl.dot(a, tl.broadcast_to(xj[:, None], [2 * G, 16]), part)
        xs = tl.sum(xsv, axis=0)
    z = tl.load(z_ptr + rows * sz_r + k0 // GK, mask=mr, other=0).to(tl.float32) + OFF
    s = tl.load(s_ptr + rows * ss_r + k0 // GK, mask=mr, other=0).to(tl.float32)
    return (part - (z * xs)[:, None]) * s[:, None]


@triton.jit
def _gate_up_tc(x_ptr, q_ptr, s_ptr, z_ptr, sq_s, sq_r, ss_s, ss_r, sz_s, sz_r, slot_ptr, h_ptr, H, I, K, sx_t,
                alpha, limit, shift, m43, GK: tl.constexpr, BLOCK_I: tl.constexpr, CLAMP: tl.constexpr, OFF: tl.constexpr = 128.0, ONE: tl.constexpr = True):
    r, ib = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    j = tl.arange(0, 2 * BLOCK_I)
    offs_i = ib * BLOCK_I + j // 2
    rows = offs_i + (j % 2) * I
    mi = offs_i < tl.where(slot >= 0, I, 0)
    slot = tl.maximum(slot, 0)
    q_ptr, s_ptr, z_ptr = q_ptr + slot * sq_s, s_ptr + slot * ss_s, z_ptr + slot * sz_s
    x_ptr += (r // K) * sx_t
    acc = tl.zeros([2 * BLOCK_I, 16], tl.float32)
    for k0 in range(0, H, GK):
        acc += _group(x_ptr, q_ptr, s_ptr, z_ptr, rows, mi, k0, sq_r, ss_r, sz_r, m43, GK, 2 * BLOCK_I, ONE, x_ptr.dtype.element_ty, OFF)
    gu = tl.sum(tl.where(tl.arange(0, 16)[None, :] == 0, acc, 0.0), axis=1)
    g, u = tl.split(tl.reshape(gu, [BLOCK_I, 2]))
    h = gated(g, u, alpha, limit, shift, CLAMP)
    offs_i = ib * BLOCK_I + tl.arange(0, BLOCK_I)
    tl.store(h_ptr + r * I + offs_i, h.to(h_ptr.dtype.element_ty), mask=offs_i < I)


@triton.jit
def _down_tc(h_ptr, q_ptr, s_ptr, z_ptr, sq_s, sq_r, ss_s, ss_r, sz_s, sz_r, slot_ptr, rw_ptr, y_ptr, H, I, m43,
             GK: tl.constexpr, BLOCK_O: tl.constexpr, OFF: tl.constexpr = 128.0, ONE: tl.constexpr = True):
    r, ob = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    live = slot >= 0
    wt = tl.where(live, tl.load(rw_ptr + r).to(tl.float32), 0.0)
    offs_o = ob * BLOCK_O + tl.arange(0, BLOCK_O)
    mo = offs_o < tl.where(live, H, 0)
    slot = tl.maximum(slot, 0)
    q_ptr, s_ptr, z_ptr = q_ptr + slot * sq_s, s_ptr + slot * ss_s, z_ptr + slot * sz_s
    acc = tl.zeros([BLOCK_O, 16], tl.float32)
    for k0 in range(0, I, GK):
        acc += _group(h_ptr + r * I, q_ptr, s_ptr, z_ptr, offs_o, mo, k0, sq_r, ss_r, sz_r, m43, GK, BLOCK_O, ONE, h_ptr.dtype.element_ty, OFF)
    y = tl.sum(tl.where(tl.arange(0, 16)[None, :] == 0, acc, 0.0), axis=1)
    tl.store(y_ptr + r * H + offs_o, y * wt, mask=offs_o < H)


def moe_experts_tc(x, w_gate_up, w_down, slots, weights, bi=32, bo=64, num_warps=4, reduce=True, one=True, stages=None):
    """int4 QWeights (group 128), bf16 x, SwiGLU, no bias -> [T, H] fp32 (as kernels.moe_triton.moe_experts)."""
    T, H = x.shape
    K, I = slots.shape[1], w_down.shape[2]
    slots, weights = slots.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
    h = torch.empty(T * K, I, dtype=x.dtype, device=x.device)
    magic, off = (0x43004300, 128.0) if x.dtype == torch.bfloat16 else (0x64006400, 1024.0)
    kw = dict(ONE=one, OFF=off, **({} if stages is None else dict(num_stages=stages)))
    y = torch.empty(T * K, H, dtype=torch.float32, device=x.device)
    gk = w_gate_up.block[1]
    def args(w):
        q = w.q.view(torch.int32)
        return q, w.s, w.z, q.stride(0), q.stride(1), w.s.stride(0), w.s.stride(1), w.z.stride(0), w.z.stride(1)
    _gate_up_tc[(T * K, triton.cdiv(I, bi))](x, *args(w_gate_up), slots, h, H, I, K, x.stride(0), 1.0, 0.0, 0.0,
                                            magic, GK=gk, BLOCK_I=bi, CLAMP=False, num_warps=num_warps, **kw)
    _down_tc[(T * K, triton.cdiv(H, bo))](h, *args(w_down), slots, weights, y, H, I, magic, GK=gk, BLOCK_O=bo,
                                         num_warps=num_warps, **kw)
    return y.view(T, K, H).sum(1) if reduce else y.view(T, K, H)
