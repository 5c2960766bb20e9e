"""Decode-time int4 routed experts on the tensor cores (Gluon + inline PTX, sm_80 on): the semantics of
freetoken_kernels.ref.moe_experts for int4 experts in groups of 128 with bf16 activations and SiLU.

A warp runs mma.sync m16n8k16 from registers: two weight rows as the MMA's 16 A rows (gate row g and up row g of a
block of 8 intermediate rows; rows g and g + 8 of a block of 16 down rows), x (or h) as its B column. The dot's K
order is permuted so that a slot's own row-major codes serve: lane (g, t) loads the 16 bytes of columns 32t .. 32t
+ 31 of a group of 128 of each of its rows, and (w >> 4s) & 0x000F000F | 0x43004300 makes one bf16x2 register of
codes s and s + 4 of a word w (128 + code, exact); x's words are paired to match by two PRMTs a tile. The zero point
comes out after the dot, sum (c - z) x = sum (128 + c) x - (128 + z) sum x, the group's sum of x from a second MMA
(A all ones). Products are exact, accumulated in fp32; h is rounded to bf16 for the down projection, as the bf16
model (and the reference) round it.
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from freetoken_kernels.quant import QWeight
from freetoken_kernels.ref import SILU, ExpertAct, ExpertBias

TILES = [(m, s0) for m in range(4) for s0 in (0, 2)]      # tile j: word m of each row, codes s0, s0 + 1 (and + 4)


def tile_asm() -> str:
    """One group of 128 columns. $0 $1: sum over the group of (128 + c) x of rows g and g + 8, $2: the group's sum of
    x; $3-$6 row g's four code words, $7-$10 row g + 8's; $11-$26 x's words of the lane's 32 columns."""
    lines = ["{", ".reg .b32 a0, a1, a2, a3, s, b0, b1, one;", ".reg .f32 d0, d1, d2, d3, e0, e1, e2, e3;",
             "mov.b32 one, 0x3F803F80;"] + [f"mov.f32 {r}, 0f00000000;" for r in ("d0", "d1", "d2", "d3", "e0", "e1", "e2", "e3")]
    for m, s0 in TILES:
        for k, (w, sh) in enumerate([(3 + m, s0), (7 + m, s0), (3 + m, s0 + 1), (7 + m, s0 + 1)]):
            if sh:
                lines += [f"shr.u32 s, ${w}, {4 * sh};", f"lop3.b32 a{k}, s, 0x000F000F, 0x43004300, 0xEA;"]
            else:
                lines.append(f"lop3.b32 a{k}, ${w}, 0x000F000F, 0x43004300, 0xEA;")
        i = 11 + 4 * m + s0 // 2       # x words i, i + 2 hold x[8m + s0 (+1)] and x[8m + s0 + 4 (+1)]
        lines += [f"prmt.b32 b0, ${i}, ${i + 2}, 0x5410;", f"prmt.b32 b1, ${i}, ${i + 2}, 0x7632;"]
        for d, a in (("d", "a0, a1, a2, a3"), ("e", "one, one, one, one")):
            lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d}0, {d}1, {d}2, {d}3}}, {{{a}}}, "
                         f"{{b0, b1}}, {{{d}0, {d}1, {d}2, {d}3}};")
    lines += ["mov.f32 $0, d0;", "mov.f32 $1, d2;", "mov.f32 $2, e0;", "}"]
    return "\n".join(lines)


ASM = tile_asm()
CONS = "=r,=r,=r," + ",".join(["r"] * 24)


@gluon.jit
def _split4(v):  # [A, B, 4] -> v[:, :, 0], ..., v[:, :, 3]
    a, b = gl.split(gl.reshape(v, [v.shape[0], v.shape[1], 2, 2]))
    a0, a2 = gl.split(a)
    a1, a3 = gl.split(b)
    return a0, a1, a2, a3


@gluon.jit
def _split8(v):  # [A, B, 8] -> v[:, :, 0], ..., v[:, :, 7]
    a, b = gl.split(gl.reshape(v, [v.shape[0], v.shape[1], 4, 2]))
    a0, a1, a2, a3 = _split4(a)
    b0, b1, b2, b3 = _split4(b)
    return a0, b0, a1, b1, a2, b2, a3, b3


@gluon.jit
def _group(q0, q8, xp, NW: gl.constexpr, S4: gl.constexpr, asm: gl.constexpr, cons: gl.constexpr):
    """One group's MMAs for a warp: the code words at q0 and q8 (rows g and g + 8, [NW, 32, 4] pointers) and x's
    words at xp ([NW, 32, 16]) -> the raw sums of rows g and g + 8 and the group's sum of x ([NW, 32] each)."""
    w0, w1, w2, w3 = _split4(gl.load(q0))
    w4, w5, w6, w7 = _split4(gl.load(q8))
    e, o = gl.split(gl.reshape(gl.load(xp), [NW, 32, 8, 2]))
    e0, e1, e2, e3, e4, e5, e6, e7 = _split8(e)
    o0, o1, o2, o3, o4, o5, o6, o7 = _split8(o)
    ops = [gl.convert_layout(t, S4) for t in (w0, w1, w2, w3, w4, w5, w6, w7, e0, o0, e1, o1, e2, o2, e3, o3,
                                              e4, o4, e5, o5, e6, o6, e7, o7)]
    return gl.inline_asm_elementwise(asm, cons, ops, dtype=(gl.float32, gl.float32, gl.float32), is_pure=True, pack=1)


@gluon.jit
def _dequant(d, sx, s_ptr, z_ptr):
    """A group's raw sums d = sum (128 + c) x and its sum of x -> the dot with the weights: s (d - (128 + z) sum x),
    s and z at the row's and group's s_ptr and z_ptr."""
    z = gl.load(z_ptr).to(gl.float32)
    return gl.load(s_ptr).to(gl.float32) * (d - (128.0 + z) * sx)


@gluon.constexpr_function
def _blocked(nw, per):  # a lane's `per` values of [nw, 32, per] in its registers, a warp a row
    return gl.BlockedLayout([1, 1, per], [1, 32, 1], [nw, 1, 1], [2, 1, 0])


@gluon.constexpr_function
def _sums(nw):  # the layout of a warp's per-lane sums [nw, 32]
    return gl.SliceLayout(2, _blocked(nw, 4))


@gluon.jit
def _lanes(NW: gl.constexpr):
    """A program's index vectors: warp [NW, 1] and lane [1, 32] (in _sums' layout), the code words' [1, 32, 4]
    offsets of lane (g, t) within a group (4t + i), warp [NW, 1, 1] and x's word offsets [1, 32, 16] (16t + i)."""
    L4: gl.constexpr = _blocked(NW, 4)
    L16: gl.constexpr = _blocked(NW, 16)
    S4: gl.constexpr = _sums(NW)
    warp = gl.arange(0, NW, layout=gl.SliceLayout(1, S4))[:, None]
    lane = gl.arange(0, 32, layout=gl.SliceLayout(0, S4))[None, :]
    j4 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L4)))[None, None, :]
    warp16 = gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, L16)))[:, None, None]
    lane16 = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, L16)))[None, :, None]
    j16 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, L16)))[None, None, :]
    return warp, lane, (lane[:, :, None] % 4) * 4 + j4, warp16, (lane16 % 4) * 16 + j16


@gluon.jit
def _gate_up_kernel(q_ptr, sq_s, sq_r, s_ptr, ss_s, ss_r, z_ptr, sz_s, sz_r, slot_ptr, x_ptr, sx_t, h_ptr, I, K,
                    H: gl.constexpr, NW: gl.constexpr, asm: gl.constexpr, cons: gl.constexpr):
    """A program: route r = t*K + k and 8 intermediate rows (gate rows as the MMA's rows 0-7, up rows as 8-15), its
    warps NG / NW groups each, summed across warps; h = silu(gate) * up, bf16. q, s, z at the slot; x, h as int32
    words (bf16 pairs)."""
    r, rb = gl.program_id(0), gl.program_id(1)
    S4: gl.constexpr = _sums(NW)
    warp, lane, qoff, warp16, xoff = _lanes(NW)
    slot = gl.load(slot_ptr + r).to(gl.int64)
    live = slot >= 0                                     # -1: computed elsewhere -> h = 0
    slot = gl.maximum(slot, 0)
    NG: gl.constexpr = H // 128
    GW: gl.constexpr = NG // NW
    row = rb * 8 + lane // 4                             # [1, 32]: gate row; up row I + row
    qg = q_ptr + slot * sq_s + row[:, :, None] * sq_r + qoff
    qu = qg + I * sq_r
    xb = x_ptr + (r // K) * sx_t + xoff
    acc_g = gl.zeros([NW, 32], gl.float32, S4)
    acc_u = gl.zeros([NW, 32], gl.float32, S4)
    for gi in gl.static_range(GW):                       # unrolled: every group's loads may issue before the MMAs
        grp = warp * GW + gi                             # [NW, 1]
        dg, du, sx = _group(qg + grp[:, :, None] * 16, qu + grp[:, :, None] * 16,
                            xb + (warp16 * GW + gi) * 64, NW, S4, asm, cons)
        acc_g += _dequant(dg, sx, s_ptr + slot * ss_s + row * ss_r + grp, z_ptr + slot * sz_s + row * sz_r + grp)
        acc_u += _dequant(du, sx, s_ptr + slot * ss_s + (I + row) * ss_r + grp,
                          z_ptr + slot * sz_s + (I + row) * sz_r + grp)
    g = gl.sum(acc_g, axis=0)                            # [32]: lanes 4i .. 4i + 3 hold row i's sums
    u = gl.sum(acc_u, axis=0)
    hv = gl.where(live, g / (1.0 + gl.exp(-g)) * u, 0.0)
    ln = gl.arange(0, 32, layout=gl.SliceLayout(0, S4))
    gl.store(h_ptr + r * I + rb * 8 + ln // 4, hv.to(gl.bfloat16), mask=ln % 4 == 0)


@gluon.jit
def _down_kernel(q_ptr, sq_s, sq_r, s_ptr, ss_s, ss_r, z_ptr, sz_s, sz_r, slot_ptr, h_ptr, rw_ptr, y_ptr, H,
                 I: gl.constexpr, NW: gl.constexpr, asm: gl.constexpr, cons: gl.constexpr):
    """A program: a route and NW blocks of 16 output rows, a warp a block over every group; y = weight * (W h)."""
    r, ob = gl.program_id(0), gl.program_id(1)
    S4: gl.constexpr = _sums(NW)
    warp, lane, qoff, warp16, xoff = _lanes(NW)
    slot = gl.load(slot_ptr + r).to(gl.int64)
    wt = gl.where(slot >= 0, gl.load(rw_ptr + r).to(gl.float32), 0.0)
    slot = gl.maximum(slot, 0)
    NG: gl.constexpr = I // 128
    row = (ob * NW + warp) * 16 + lane // 4              # [NW, 32]: rows g and g + 8 of the warp's block
    q0 = q_ptr + slot * sq_s + row[:, :, None] * sq_r + qoff
    hb = h_ptr + r * (I // 2) + xoff + warp16 * 0
    acc0 = gl.zeros([NW, 32], gl.float32, S4)
    acc8 = gl.zeros([NW, 32], gl.float32, S4)
    for gi in gl.static_range(NG):
        d0, d8, sh = _group(q0 + gi * 16, q0 + 8 * sq_r + gi * 16, hb + gi * 64, NW, S4, asm, cons)
        acc0 += _dequant(d0, sh, s_ptr + slot * ss_s + row * ss_r + gi, z_ptr + slot * sz_s + row * sz_r + gi)
        acc8 += _dequant(d8, sh, s_ptr + slot * ss_s + (row + 8) * ss_r + gi,
                         z_ptr + slot * sz_s + (row + 8) * sz_r + gi)
    first = lane % 4 == 0
    gl.store(y_ptr + r * H + row, wt * acc0, mask=first)
    gl.store(y_ptr + r * H + row + 8, wt * acc8, mask=first)


def _warps(n: int) -> int:
    return next(w for w in (4, 2, 1) if n % w == 0)


def usable(x: torch.Tensor, w_gate_up, w_down, act: ExpertAct, bias: ExpertBias | None) -> bool:
    """Whether these experts run here: int4 in groups of 128 on both weights, bf16 x on an sm_80+ GPU, SiLU, no
    biases, H and I multiples of 128."""
    ws = (w_gate_up, w_down)
    return (x.is_cuda and x.dtype == torch.bfloat16 and act == SILU and bias is None
            and all(isinstance(w, QWeight) and w.fmt == "int4" and tuple(w.block) == (1, 128) and w.z is not None for w in ws)
            and x.shape[1] % 128 == 0 and w_down.shape[2] % 128 == 0
            and torch.cuda.get_device_capability(x.device) >= (8, 0))


def _parts(w: QWeight) -> tuple:
    q = w.q.view(torch.int32)                            # the pools keep parts 16-byte aligned
    return q, q.stride(0), q.stride(1), w.s, w.s.stride(0), w.s.stride(1), w.z, w.z.stride(0), w.z.stride(1)


def moe_experts(x: torch.Tensor, w_gate_up: QWeight, w_down: QWeight, slots: torch.Tensor, weights: torch.Tensor,
                reduce: bool = True) -> torch.Tensor:
    """moe_triton.moe_experts for experts that `usable` accepts: x [T, H] bf16; slots, weights [T, K] -> [T, H]
    float32 (without reduce: the weighted routes [T, K, H])."""
    T, H = x.shape
    K, I = slots.shape[1], w_down.shape[2]
    if T * K == 0:
        return torch.zeros((T, H) if reduce else (T, K, H), dtype=torch.float32, device=x.device)
    xw = x.contiguous().view(torch.int32)
    slots, weights = slots.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
    h = torch.empty(T * K, I, dtype=torch.bfloat16, device=x.device)
    y = torch.empty(T * K, H, dtype=torch.float32, device=x.device)
    nw = _warps(H // 128)
    _gate_up_kernel[(T * K, I // 8)](*_parts(w_gate_up), slots, xw, xw.stride(0), h, I, K, H=H,
                                     NW=nw, asm=ASM, cons=CONS, num_warps=nw)
    nw = _warps(H // 16)
    _down_kernel[(T * K, H // (16 * nw))](*_parts(w_down), slots, h.view(torch.int32), weights, y, H, I=I, NW=nw,
                                          asm=ASM, cons=CONS, num_warps=nw)
    return y.view(T, K, H).sum(1) if reduce else y.view(T, K, H)
