"""Decode-time routed-expert FFN (Triton): the semantics of freetoken_kernels.ref.moe_experts for small T.

Two memory-bound GEMV kernels read each expert's weights straight from the slot pool (strided
views, never copied): A computes the activated intermediate h[r] = act(x Wg^T + bg, x Wu^T + bu)
per route r = (t, k) into a [T*K, I] fp32 buffer, B computes weights[t, k] * (h[r] Wd^T + bd) per
route into [T*K, H] fp32 partials, summed over k in a fixed order (deterministic, no atomics).
act is freetoken_kernels.ref.ExpertAct (SwiGLU, or gpt-oss's clamped one); the biases are optional.
A weight is a plain [S, N, K] tensor, rounded to x's dtype as the reference does, or a QWeight
(freetoken_kernels/quant.py) dequantized in registers (not rounded: at least as exact as the reference);
every product is accumulated in fp32.
"""
from __future__ import annotations

import json
import math

import torch
import triton
import triton.language as tl

from freetoken_kernels import ref
from freetoken_kernels.moe_gemm_triton import act_args, bias_args, e2m1, gated, moe_experts_gemm
from freetoken_kernels.quant import FORMATS, QWeight, quantize
from freetoken_kernels.ref import SILU, ExpertAct, ExpertBias

_MX = tl.constexpr(2.0 ** 63)      # mxfp4: x is scaled by it, the block scale by 2**63 / 2**126
_F23 = 0x4B000000                  # the bits of the float 2**23 (_at)


@triton.jit
def _at(src, mask: tl.constexpr, p: tl.constexpr, c, f23):
    """code - z exactly, for the code under `mask` at bit p (< 20) of the int32 src and
    c = 2**(23 - p) + z: the code or-ed into f23, the bits of 2**23 (0x4B000000), is the float
    2**23 + code * 2**p, and one FFMA scales it by 2**-p and subtracts c. f23 comes as a kernel
    argument: as a constant it left the LOP3 two immediates, and ptxas rebuilt each mask in a
    register with a MOV, a code (31 of the int4 loop's 183 instructions)."""
    return ((src & mask) | f23).to(tl.float32, bitcast=True) * (2.0 ** -p) - c


@triton.jit
def _planes(x, PER: tl.constexpr):
    """x [A, B, PER] -> the PER tensors x[:, :, j] (the last dim sits within a thread)."""
    A: tl.constexpr = x.shape[0]
    B: tl.constexpr = x.shape[1]
    e, o = tl.split(tl.reshape(x, [A, B, PER // 2, 2]))            # j even, j odd
    if PER == 4:
        x0, x2 = tl.split(e)
        x1, x3 = tl.split(o)
        out = x0, x1, x2, x3
    else:
        e0, e1 = tl.split(tl.reshape(e, [A, B, 2, 2]))             # j = 0, 4 | 2, 6
        o0, o1 = tl.split(tl.reshape(o, [A, B, 2, 2]))             # j = 1, 5 | 3, 7
        x0, x4 = tl.split(e0)
        x2, x6 = tl.split(e1)
        x1, x5 = tl.split(o0)
        x3, x7 = tl.split(o1)
        out = x0, x1, x2, x3, x4, x5, x6, x7
    return out


@triton.jit
def _word_dots(w, x, z, f23, FMT: tl.constexpr):
    """[R, SG]: sum over the codes of the int32 words w [R, SG, GW] (code j of a word in its j-th
    4 or 8 bits) of (code - z) * x, x [SG, GW, codes per word] fp32, z [R, SG] (int formats).
    Per code: one LOP3 and two FFMA for int4 / int8 (codes stay at their bit positions, so one
    shift serves several); three integer ops and one FFMA for mxfp4 (x scaled by 2**63)."""
    if FMT == "int8":
        x0, x1, x2, x3 = _planes(x, 4)
        zz = z[:, :, None]
        c0, c8 = 8388608.0 + zz, 32768.0 + zz
        u = w >> 16
        t = _at(w, 0xFF, 0, c0, f23) * x0[None]
        t += _at(w, 0xFF00, 8, c8, f23) * x1[None]
        t += _at(u, 0xFF, 0, c0, f23) * x2[None]
        t += _at(u, 0xFF00, 8, c8, f23) * x3[None]
    elif FMT == "int4":
        x0, x1, x2, x3, x4, x5, x6, x7 = _planes(x, 8)
        zz = z[:, :, None]
        c0, c4, c8, c12, c16 = 8388608.0 + zz, 524288.0 + zz, 32768.0 + zz, 2048.0 + zz, 128.0 + zz
        u = w >> 12                                      # codes 5, 6, 7 at bits 8, 12, 16
        t = _at(w, 0xF, 0, c0, f23) * x0[None]
        t += _at(w, 0xF0, 4, c4, f23) * x1[None]
        t += _at(w, 0xF00, 8, c8, f23) * x2[None]
        t += _at(w, 0xF000, 12, c12, f23) * x3[None]
        t += _at(w, 0xF0000, 16, c16, f23) * x4[None]
        t += _at(u, 0xF00, 8, c8, f23) * x5[None]
        t += _at(u, 0xF000, 12, c12, f23) * x6[None]
        t += _at(u, 0xF0000, 16, c16, f23) * x7[None]
    else:
        x0, x1, x2, x3, x4, x5, x6, x7 = _planes(x * _MX, 8)
        t = e2m1(w, 0) * x0[None]
        t += e2m1(w, 1) * x1[None]
        t += e2m1(w, 2) * x2[None]
        t += e2m1(w, 3) * x3[None]
        t += e2m1(w, 4) * x4[None]
        t += e2m1(w, 5) * x5[None]
        t += e2m1(w, 6) * x6[None]
        t += e2m1(w, 7) * x7[None]
    return tl.sum(t, axis=2)


@triton.jit
def _row_dots(x_ptr, q_ptr, s_ptr, z_ptr, rows, mr, k0, Kdim, sq_r, ss_r, sz_r, f23, XDT: tl.constexpr,
              FMT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GK: tl.constexpr,
              BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """[R, BLOCK_K // GK] fp32: sum of W[rows, k] * x[k] over each chunk of GK columns of
    k0 + [0, BLOCK_K) (within a thread; the caller accumulates and reduces once), W dequantized
    in registers from one slot's parts (q_ptr, s_ptr, z_ptr at the slot): a scale per chunk (GK
    divides the quantization block BK), a scale row per BN rows. q of int4 / mxfp4 / int8 comes
    as int32 words. EVEN_K: no column tail (unmasked columns keep the loads vectorized)."""
    PER: tl.constexpr = 8 if FMT == "int4" or FMT == "mxfp4" else 4 if FMT == "int8" else 1
    SG: tl.constexpr = BLOCK_K // GK
    GW: tl.constexpr = GK // PER                         # q columns per chunk
    cq = k0 // PER + (tl.arange(0, SG) * GW)[:, None] + tl.arange(0, GW)[None, :]   # [SG, GW]
    ptrs = q_ptr + rows[:, None, None] * sq_r + cq[None, :, :]
    mr3 = mr[:, None, None]
    if PER == 1:   # x in w's own shape, each thread its own columns: no staging through shared memory
        kx = tl.broadcast_to(cq[None, :, :], ptrs.shape)                            # [R, SG, GK]
    else:          # a word's PER columns together (in w's shape, per code or in lanes: 3-35% slower)
        kx = cq[:, :, None] * PER + tl.arange(0, PER)[None, None, :]              # [SG, GW, PER]
    if EVEN_K:
        w = tl.load(ptrs, mask=mr3, other=0.0)
        x = tl.load(x_ptr + kx).to(tl.float32)
    else:
        w = tl.load(ptrs, mask=mr3 & (cq < Kdim // PER)[None, :, :], other=0.0)
        x = tl.load(x_ptr + kx, mask=kx < Kdim, other=0.0).to(tl.float32)
    kg = k0 + tl.arange(0, SG) * GK                      # first column of each chunk
    mg = mr[:, None] if EVEN_K else mr[:, None] & (kg < Kdim)[None, :]
    if FMT == "plain":                                   # rounded to x's dtype, as the reference
        part = tl.sum(w.to(XDT).to(tl.float32) * x, axis=2)
    elif FMT == "fp8":
        part = tl.sum(w.to(tl.float32) * x, axis=2)
    elif FMT == "mxfp4":
        part = _word_dots(w, x, None, f23, FMT)
    else:
        z = tl.load(z_ptr + rows[:, None] * sz_r + (kg // BK)[None, :], mask=mg, other=0)
        part = _word_dots(w, x, z.to(tl.float32), f23, FMT)
    if FMT != "plain":
        s = tl.load(s_ptr + (rows // BN)[:, None] * ss_r + (kg // BK)[None, :], mask=mg, other=0)
        if FMT == "mxfp4":                               # e8m0 e -> 2**(e - 127) * 2**63
            s = (tl.minimum(s.to(tl.int32) + 63, 254) << 23).to(tl.float32, bitcast=True)
        part = part * s.to(tl.float32)
    return part


@triton.jit
def _gate_up_kernel(x_ptr, q_ptr, s_ptr, z_ptr, sq_s, sq_r, ss_s, ss_r, sz_s, sz_r, slot_ptr,
                    h_ptr, b_ptr, sb_s, H, I, K, sx_t, alpha, limit, shift, f23, FMT: tl.constexpr,
                    BN: tl.constexpr, BK: tl.constexpr, GK: tl.constexpr, BLOCK_I: tl.constexpr,
                    BLOCK_H: tl.constexpr, EVEN_K: tl.constexpr, BIAS: tl.constexpr, CLAMP: tl.constexpr):
    r, ib = tl.program_id(0), tl.program_id(1)           # route r = t*K + k, block of I rows
    slot = tl.load(slot_ptr + r).to(tl.int64)
    j = tl.arange(0, 2 * BLOCK_I)                        # gate and up rows interleaved
    offs_i = ib * BLOCK_I + j // 2
    rows = offs_i + (j % 2) * I
    mi = offs_i < tl.where(slot >= 0, I, 0)              # slot -1: computed elsewhere -> h = 0
    slot = tl.maximum(slot, 0)                           # int64: a pool can exceed 2^31 elements
    q_ptr, s_ptr, z_ptr = q_ptr + slot * sq_s, s_ptr + slot * ss_s, z_ptr + slot * sz_s
    x_ptr += (r // K) * sx_t
    acc = tl.zeros([2 * BLOCK_I, BLOCK_H // GK], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        acc += _row_dots(x_ptr, q_ptr, s_ptr, z_ptr, rows, mi, h0, H, sq_r, ss_r, sz_r, f23,
                         x_ptr.dtype.element_ty, FMT, BN, BK, GK, BLOCK_H, EVEN_K)
    gu = tl.sum(acc, axis=1)
    if BIAS:
        gu += tl.load(b_ptr + slot * sb_s + rows, mask=mi, other=0.0)
    g, u = tl.split(tl.reshape(gu, [BLOCK_I, 2]))
    h = gated(g, u, alpha, limit, shift, CLAMP)          # [BLOCK_I]
    offs_i = ib * BLOCK_I + tl.arange(0, BLOCK_I)
    tl.store(h_ptr + r * I + offs_i, h, mask=offs_i < I)


@triton.jit
def _down_kernel(h_ptr, q_ptr, s_ptr, z_ptr, sq_s, sq_r, ss_s, ss_r, sz_s, sz_r, slot_ptr, rw_ptr,
                 y_ptr, b_ptr, sb_s, H, I, f23, XDT: tl.constexpr, FMT: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, GK: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr,
                 EVEN_K: tl.constexpr, BIAS: tl.constexpr):
    r, ob = tl.program_id(0), tl.program_id(1)           # route, block of H output rows
    slot = tl.load(slot_ptr + r).to(tl.int64)
    live = slot >= 0
    wt = tl.where(live, tl.load(rw_ptr + r).to(tl.float32), 0.0)
    offs_o = ob * BLOCK_O + tl.arange(0, BLOCK_O)
    mo = offs_o < tl.where(live, H, 0)
    slot = tl.maximum(slot, 0)
    q_ptr, s_ptr, z_ptr = q_ptr + slot * sq_s, s_ptr + slot * ss_s, z_ptr + slot * sz_s
    acc = tl.zeros([BLOCK_O, BLOCK_I // GK], tl.float32)
    for i0 in range(0, I, BLOCK_I):                      # h: fp32 [T*K, I]
        acc += _row_dots(h_ptr + r * I, q_ptr, s_ptr, z_ptr, offs_o, mo, i0, I, sq_r, ss_r,
                         sz_r, f23, XDT, FMT, BN, BK, GK, BLOCK_I, EVEN_K)
    y = tl.sum(acc, axis=1)
    if BIAS:
        y += tl.load(b_ptr + slot * sb_s + offs_o, mask=mo, other=0.0)
    tl.store(y_ptr + r * H + offs_o, y * wt, mask=offs_o < H)


_TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
# ((BLOCK_I, BLOCK_H) of kernel A, (BLOCK_O, BLOCK_I) of kernel B), num_warps per weight format:
# the fastest of bench_quant's CANDIDATES at T = 1 on the H200 (H=2048, I=768, group 128, bf16 x;
# plain: 0.2% behind it), each within 6% of the fastest at T = 8 (RESULTS.md; plain and fp8: the
# thirty-second run, with x read unstaged)
BLOCKS = {"plain": ((8, 512, 16, 256), 4), "int4": ((16, 256, 32, 256), 8),
          "int8": ((16, 256, 32, 256), 8), "fp8": ((8, 512, 16, 256), 8),
          "mxfp4": ((16, 256, 32, 256), 8)}


def _fmt(w: torch.Tensor | QWeight) -> str:
    return w.fmt if isinstance(w, QWeight) else "plain"


def _weight_args(w: torch.Tensor | QWeight, block_k: int) -> tuple[tuple, dict]:
    """A weight's kernel arguments: its parts (q of int4 / mxfp4 / int8 as int32 words, a
    stand-in where a part is absent) with their (slot, row) strides, and its format constexprs.
    GK, the columns summed within a thread, is at most the codes of one 16-byte load."""
    if not isinstance(w, QWeight):
        assert w.stride(2) == 1
        return ((w, w, w, w.stride(0), w.stride(1), 0, 0, 0, 0),
                dict(FMT="plain", BN=1, BK=1, GK=min(block_k, 16 // w.element_size())))
    q, s, z = w.q, w.s, w.q if w.z is None else w.z
    assert q.stride(2) == 1 and s.stride(2) == 1 and z.stride(2) == 1
    per16, per_word = {"int4": (32, 8), "mxfp4": (32, 8), "int8": (16, 4), "fp8": (16, 1)}[w.fmt]
    if w.fmt != "fp8":
        q = q.view(torch.int32)                          # the pools keep parts 16-byte aligned
    bn, bk = w.block
    gk = math.gcd(block_k, bk, per16)
    assert gk % per_word == 0, (w.fmt, block_k, bk)
    return ((q, s, z, q.stride(0), q.stride(1), s.stride(0), s.stride(1), z.stride(0), z.stride(1)),
            dict(FMT=w.fmt, BN=bn, BK=bk, GK=gk))


def moe_experts(x: torch.Tensor, w_gate_up: torch.Tensor | QWeight, w_down: torch.Tensor | QWeight,
                slots: torch.Tensor, weights: torch.Tensor, act: ExpertAct = SILU, bias: ExpertBias | None = None,
                blocks: tuple[int, int, int, int] | None = None, reduce: bool = True,
                num_warps: int | None = None) -> torch.Tensor:
    """x [T, H]; w_gate_up [S, 2I, H], w_down [S, H, I]: slot-strided views (inner dims
    contiguous) or QWeights of such views; slots [T, K] (-1 = elsewhere); weights [T, K]; act
    and bias as freetoken_kernels.ref.moe_experts takes them -> [T, H] float32 (without reduce: the
    weighted routes [T, K, H], for a consumer that sums them itself). blocks = (BLOCK_I,
    BLOCK_H) of kernel A, (BLOCK_O, BLOCK_I) of kernel B and num_warps (each by default: BLOCKS
    of the gate_up format)."""
    T, H = x.shape
    K, I = slots.shape[1], w_down.shape[2]
    if T * K == 0:
        return torch.zeros((T, H) if reduce else (T, K, H), dtype=torch.float32, device=x.device)
    assert tuple(w_gate_up.shape[1:]) == (2 * I, H) and w_down.shape[1] == H and x.stride(1) == 1
    slots, weights = slots.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
    h = torch.empty(T * K, I, dtype=torch.float32, device=x.device)     # activated, per route
    y = torch.empty(T * K, H, dtype=torch.float32, device=x.device)     # weighted, per route
    tuned, warps = BLOCKS[_fmt(w_gate_up)]
    bi, bh, bo, bi2 = blocks or tuned
    num_warps = num_warps or warps
    (b_gu, b_d), (a, clamp) = bias_args(bias, x), act_args(act)
    parts, fmt = _weight_args(w_gate_up, bh)
    _gate_up_kernel[(T * K, triton.cdiv(I, bi))](
        x, *parts, slots, h, *b_gu, H, I, K, x.stride(0), *a, _F23, **fmt, BLOCK_I=bi, BLOCK_H=bh,
        EVEN_K=H % bh == 0, BIAS=bias is not None, CLAMP=clamp, num_warps=num_warps)
    parts, fmt = _weight_args(w_down, bi2)
    _down_kernel[(T * K, triton.cdiv(H, bo))](
        h, *parts, slots, weights, y, *b_d, H, I, _F23, XDT=_TL[x.dtype], **fmt, BLOCK_O=bo, BLOCK_I=bi2,
        EVEN_K=I % bi2 == 0, BIAS=bias is not None, num_warps=num_warps)
    return y.view(T, K, H).sum(1) if reduce else y.view(T, K, H)


def moe_experts_auto(x: torch.Tensor, w_gate_up: torch.Tensor | QWeight,
                     w_down: torch.Tensor | QWeight, slots: torch.Tensor, weights: torch.Tensor,
                     act: ExpertAct = SILU, bias: ExpertBias | None = None, reduce: bool = True,
                     experts: int | None = None, routes: torch.Tensor | None = None) -> torch.Tensor:
    """On CUDA the GEMV kernels for decode-sized batches (T*K <= 64, no `routes`; int4 experts that
    freetoken_kernels.moe_mma takes on the tensor cores), the grouped GEMMs for more routes (experts: at
    most that many distinct slots among them, moe_experts_gemm); the reference elsewhere. reduce and
    routes as ref.moe_experts takes them."""
    if x.is_cuda and slots.numel() <= 64 and routes is None:
        if isinstance(w_gate_up, QWeight) and w_gate_up.fmt == "int4":
            from freetoken_kernels import moe_mma  # Gluon: imported only by models that may use it
            if moe_mma.usable(x, w_gate_up, w_down, act, bias):
                return moe_mma.moe_experts(x, w_gate_up, w_down, slots, weights, reduce)
        return moe_experts(x, w_gate_up, w_down, slots, weights, act, bias, reduce=reduce)
    if x.is_cuda:
        return moe_experts_gemm(x, w_gate_up, w_down, slots, weights, act, bias, experts=experts, reduce=reduce,
                                routes=routes)
    return ref.moe_experts(x, w_gate_up, w_down, slots, weights, act, bias, reduce, routes)


def _slot_views(S: int, parts: list[tuple[tuple[int, ...], torch.dtype]], device,
               align: int = 256) -> list[torch.Tensor]:
    """Views [S, *shape] of each (shape, dtype) part into one uint8 pool of S slot rows, each
    part `align`-byte aligned and every row padded by `align` bytes: the slot cache's byte-row
    layout (engine.moe.layout, which freetoken_kernels/ does not import), for the benchmarks."""
    sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in parts]
    offs = [sum(-(-n // align) * align for n in sizes[:i]) for i in range(len(parts) + 1)]
    pool = torch.zeros(S, offs[-1] + align, dtype=torch.uint8, device=device)
    return [pool[:, o:o + n].view(dtype).view(S, *shape)
            for o, n, (shape, dtype) in zip(offs, sizes, parts)]


def _bench_weights(fmt: str, S: int, H: int, I: int, group: int):
    """gate_up and down of S slots of one CUDA byte-row pool (one random expert, quantized to fmt
    or bf16, copied into every slot), and the bytes of one slot."""
    ws = [torch.randn(n, k, device="cuda") * 0.02 for n, k in ((2 * I, H), (H, I))]
    if fmt == "bf16":
        views = _slot_views(S, [(tuple(w.shape), torch.bfloat16) for w in ws], "cuda")
        for v, w in zip(views, ws):
            v.copy_(w)
        return views, 3 * I * H * 2
    quant = [quantize(fmt, w, group) for w in ws]
    parts = [[t for t in qt[:3] if t is not None] for qt in quant]
    views = iter(_slot_views(S, [(tuple(t.shape), t.dtype) for p in parts for t in p], "cuda"))
    out = []
    for p, (_, _, z, block) in zip(parts, quant):
        vs = [next(views).copy_(t) for t in p]
        out.append(QWeight(fmt, vs[0], vs[1], vs[2] if z is not None else None, block))
    return out, sum(w.nbytes_per_slot for w in out)


def _graph_us(fn, calls: int, reps: int = 20) -> float:
    """Mean us of fn(i) over i < calls, replayed as one CUDA graph (as graph decode runs it)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                        # compile and warm up outside the capture
        for i in range(calls):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * calls)


# (blocks, num_warps) tried by bench_quant
CANDIDATES = [(b, nw) for b in [(4, 1024, 8, 512), (8, 512, 16, 256), (8, 512, 32, 256),
                                (8, 1024, 16, 256), (16, 256, 32, 256), (16, 512, 32, 256)]
              for nw in (4, 8)]


def bench_quant(fmts: tuple[str, ...] = ("bf16",) + FORMATS, batches: tuple[int, ...] = (1, 8),
                K: int = 8, H: int = 2048, I: int = 768, S: int = 256, group: int = 128,
                calls: int = 16, hbm_gbs: float = 4300.0) -> dict:
    """H200 timing of the decode expert GEMVs (both kernels, routes not summed, as graph decode
    runs them) per weight format and batch T: `calls` calls replayed in one CUDA graph, each on
    T*K distinct random slots, so L2 holds next to none of a call's weights. Per (fmt, T): us,
    GB/s of the weight bytes read (quantized: codes, scales, zero points) and the share of HBM
    bandwidth, for the fastest of CANDIDATES and, for int4, the tensor-core path (every candidate's us beside)."""
    from freetoken_kernels import moe_mma
    res = {}
    for fmt in fmts:
        (wgu, wd), per_slot = _bench_weights(fmt, S, H, I, group)
        res[fmt] = {}
        for T in batches:
            x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
            w = torch.rand(T, K, device="cuda")
            sets = [torch.randperm(S, device="cuda")[:T * K].view(T, K) for _ in range(calls)]
            tried = {f"{b} w{nw}": _graph_us(lambda i: moe_experts(
                x, wgu, wd, sets[i], w, blocks=b, reduce=False, num_warps=nw), calls)
                for b, nw in CANDIDATES}
            if moe_mma.usable(x, wgu, wd, SILU, None):
                tried["tensor cores"] = _graph_us(lambda i: moe_mma.moe_experts(x, wgu, wd, sets[i], w, reduce=False),
                                                  calls)
            best = min(tried, key=tried.get)
            gbs = T * K * per_slot / tried[best] / 1e3
            res[fmt][f"T={T}"] = {"us": round(tried[best], 2), "GB/s": round(gbs, 1),
                                  "of_hbm": round(gbs / hbm_gbs, 3), "best": best,
                                  "tried_us": {k: round(v, 2) for k, v in tried.items()}}
        del wgu, wd
    return res


def bench_prefill(T: int = 2048, K: int = 8, H: int = 2048, I: int = 768, E: int = 128,
                  group: int = 128) -> dict:
    """H200 timing of one prefill chunk's routed experts (uniform top-K routing over E resident
    slots) per weight format, bf16 too: the grouped GEMMs and the reference they replace (one
    expert at a time, dequantized by plain torch; for bf16, cuBLAS). ms and TFLOP/s of the expert
    FLOPs."""
    from triton.testing import do_bench
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    slots = torch.rand(T, E, device="cuda").argsort(dim=1)[:, :K]
    w = torch.rand(T, K, device="cuda")
    flops = 2 * T * K * 3 * I * H
    res = {}
    for fmt in ("bf16",) + FORMATS:
        (wgu, wd), _ = _bench_weights(fmt, E, H, I, group)
        runs = {"ref": lambda: ref.moe_experts(x, wgu, wd, slots, w),
                "gemm": lambda: moe_experts_gemm(x, wgu, wd, slots, w)}
        res[fmt] = {}
        for name, fn in runs.items():
            ms = do_bench(fn)
            res[fmt][name] = {"ms": round(ms, 3), "TFLOP/s": round(flops / ms / 1e9, 1)}
        del wgu, wd
    return res


if __name__ == "__main__":
    print(json.dumps({"decode": bench_quant(), "prefill": bench_prefill()}, indent=1))
