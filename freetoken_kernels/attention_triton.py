"""Paged decode attention (Triton): freetoken_kernels.ref.paged_attention for one new token per sequence.

Split-KV ("flash decoding"): program (b, kv head j, split) runs an online softmax over its share
of the sequence's tokens for the G = Hq/Hkv query heads of kv head j together (one tl.dot per
tile), then a combine kernel merges the splits. ctx_lens is read on the device only, so the
launch can be captured in a CUDA graph; the splits share a sequence's tokens evenly in whole
tiles (its length, not the page table's width, so a short context in a wide table still keeps
the splits busy). A sliding window spreads the splits over the window only; attention sinks
start split 0's softmax with the sink as its running maximum and a sum of one.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
_LOG2E = tl.constexpr(LOG2E)


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, pt_ptr, len_ptr, sink_ptr, o_ptr, ml_ptr, qk_scale, D, Hq,
                  window, sq_b, sq_h, sk_p, sk_t, sk_h, sv_p, sv_t, sv_h, spt_b,
                  G: tl.constexpr, PAGE: tl.constexpr, NSPLIT: tl.constexpr, PREC: tl.constexpr,
                  SINK: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    b, j, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ctx = tl.load(len_ptr + b)
    offs_g, offs_d = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D)
    mg, md = offs_g < G, offs_d < D
    head = j * G + offs_g                                                  # [BLOCK_G] q heads
    q = tl.load(q_ptr + b * sq_b + head[:, None] * sq_h + offs_d[None, :],
                mask=mg[:, None] & md[None, :], other=0.0)                 # [BLOCK_G, BLOCK_D]
    m_i = tl.full([BLOCK_G], -1e30, tl.float32)                            # running max (log2)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    if SINK:                                                               # split 0: exp2(sink - m_i) = 1
        sink = tl.load(sink_ptr + head, mask=mg, other=0.0).to(tl.float32) * _LOG2E
        m_i = tl.where(sp == 0, sink, m_i)
        l_i = tl.where(sp == 0, 1.0, l_i)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    first = tl.where(window > 0, tl.maximum(ctx - window, 0), 0)          # the splits share [first, ctx)
    chunk = tl.cdiv(tl.cdiv(ctx - first, BLOCK_N), NSPLIT) * BLOCK_N
    lo = first + sp * chunk
    hi = tl.minimum(lo + chunk, ctx)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)                             # [BLOCK_N] positions
        mn = offs_n < hi
        page = tl.load(pt_ptr + b * spt_b + offs_n // PAGE, mask=mn, other=0).to(tl.int64)
        row = offs_n % PAGE
        m2 = mn[:, None] & md[None, :]
        k = tl.load(k_ptr + (page * sk_p + row * sk_t + j * sk_h)[:, None] + offs_d[None, :],
                    mask=m2, other=0.0)                                    # [BLOCK_N, BLOCK_D]
        v = tl.load(v_ptr + (page * sv_p + row * sv_t + j * sv_h)[:, None] + offs_d[None, :],
                    mask=m2, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale       # [BLOCK_G, BLOCK_N]
        s = tl.where(mn[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    out = (b * Hq + head) * NSPLIT + sp                                    # [BLOCK_G] rows
    if NSPLIT == 1:
        tl.store(o_ptr + out[:, None] * D + offs_d[None, :],
                 (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=mg[:, None] & md[None, :])
    else:
        tl.store(o_ptr + out[:, None] * D + offs_d[None, :], acc, mask=mg[:, None] & md[None, :])
        tl.store(ml_ptr + out * 2, m_i, mask=mg)
        tl.store(ml_ptr + out * 2 + 1, l_i, mask=mg)


@triton.jit
def _combine_kernel(part_ptr, ml_ptr, o_ptr, D, NSPLIT: tl.constexpr, BLOCK_S: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    row = tl.program_id(0)                                                 # b * Hq + h
    offs_s, offs_d = tl.arange(0, BLOCK_S), tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ms, md = offs_s < NSPLIT, offs_d < D
    m = tl.load(ml_ptr + (row * NSPLIT + offs_s) * 2, mask=ms, other=float("-inf"))
    l = tl.load(ml_ptr + (row * NSPLIT + offs_s) * 2 + 1, mask=ms, other=0.0)
    w = tl.exp2(m - tl.max(m, axis=0))                                     # [BLOCK_S]
    part = tl.load(part_ptr + (row * NSPLIT + offs_s)[:, None] * D + offs_d[None, :],
                   mask=ms[:, None] & md[None, :], other=0.0)               # [BLOCK_S, BLOCK_D]
    o = tl.sum(part * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(o_ptr + row * D + offs_d, o.to(o_ptr.dtype.element_ty), mask=md)


def combine_splits(part: torch.Tensor, ml: torch.Tensor, out: torch.Tensor) -> None:
    """out [B, Hq, D] = the softmax-weighted merge of the splits' unnormalised outputs part
    [B, Hq, n_split, D] (fp32) by their (running max in log2, sum) ml [B, Hq, n_split, 2].
    A program merges one head's splits over a slice of D, its tile at most 4096 values."""
    B, Hq, n_split, D = part.shape
    block_s = triton.next_power_of_2(n_split)
    block_d = min(triton.next_power_of_2(D), max(16, 4096 // block_s))
    _combine_kernel[(B * Hq, triton.cdiv(D, block_d))](part, ml, out, D, NSPLIT=n_split, BLOCK_S=block_s,
                                                       BLOCK_D=block_d)


@triton.jit
def _qkv_rope_kernel(qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, slot_ptr, q_ptr, kc_ptr, vc_ptr,
                     Hq, Hkv, D, eps, sx, sc, NORM: tl.constexpr, ROT: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    t, h = tl.program_id(0).to(tl.int64), tl.program_id(1)   # token, head of the fused qkv row
    offs = tl.arange(0, BLOCK_D)
    md = offs < D
    row = qkv_ptr + t * sx + h * D
    x = tl.load(row + offs, mask=md, other=0.0).to(tl.float32)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if h >= Hq + Hkv:                                        # v: into the cache as it is
        tl.store(vc_ptr + (slot * Hkv + h - Hq - Hkv) * D + offs, x.to(vc_ptr.dtype.element_ty), mask=md)
    else:
        half = ROT // 2
        part = tl.where(offs < half, offs + half, offs - half)   # rotate-half partner lane
        mr = offs < ROT
        xp = tl.load(row + part, mask=mr, other=0.0).to(tl.float32)
        DT = qkv_ptr.dtype.element_ty
        if NORM:                                             # rms_norm: round, then scale by w
            r = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
            isq = h < Hq
            w = tl.where(isq, tl.load(qw_ptr + offs, mask=md, other=0.0), tl.load(kw_ptr + offs, mask=md, other=0.0))
            wp = tl.where(isq, tl.load(qw_ptr + part, mask=mr, other=0.0), tl.load(kw_ptr + part, mask=mr, other=0.0))
            x = ((x * r).to(DT).to(tl.float32) * w.to(tl.float32)).to(DT).to(tl.float32)
            xp = ((xp * r).to(DT).to(tl.float32) * wp.to(tl.float32)).to(DT).to(tl.float32)
        c = tl.load(cos_ptr + t * sc + offs, mask=mr, other=1.0).to(tl.float32)
        s = tl.load(sin_ptr + t * sc + offs, mask=mr, other=0.0).to(tl.float32)
        y = tl.where(mr, x * c + tl.where(offs < half, -xp, xp) * s, x)
        if h < Hq:
            tl.store(q_ptr + (t * Hq + h) * D + offs, y.to(q_ptr.dtype.element_ty), mask=md)
        else:
            tl.store(kc_ptr + (slot * Hkv + h - Hq) * D + offs, y.to(kc_ptr.dtype.element_ty), mask=md)


def qkv_rope_write(qkv: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                   eps: float, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, Hq: int) -> torch.Tensor:
    """The attention prologue in one launch: qkv [T, (Hq + 2 Hkv) D] -> q [T, Hq, D] with the
    per-head RMSNorm (weights q_norm, k_norm [D], or None) and the rotary embedding (cos, sin
    [T, 1, rot]) applied; k (normed, rotated) and v are written into k_cache, v_cache
    [slots, Hkv, D] at slots [T]. The unfused path: Attention._qkv, apply_rope, KVPool.write."""
    T = qkv.shape[0]
    _, Hkv, D = k_cache.shape
    assert qkv.shape[1] == (Hq + 2 * Hkv) * D and qkv.stride(1) == 1 and cos.stride(-1) == 1
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and cos.shape[-1] % 2 == 0
    q = torch.empty(T, Hq, D, dtype=qkv.dtype, device=qkv.device)
    if T:
        _qkv_rope_kernel[(T, Hq + 2 * Hkv)](
            qkv, q_norm if q_norm is not None else qkv, k_norm if k_norm is not None else qkv,
            cos, sin, slots, q, k_cache, v_cache, Hq, Hkv, D, eps, qkv.stride(0), cos.stride(0),
            NORM=q_norm is not None, ROT=cos.shape[-1], BLOCK_D=triton.next_power_of_2(D),
            num_warps=1)
    return q


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           page_table: torch.Tensor, ctx_lens: torch.Tensor, scale: float,
                           window: int | None = None, sinks: torch.Tensor | None = None,
                           n_split: int | None = None, block_n: int = 64) -> torch.Tensor:
    """q [B, Hq, D]; k_pool, v_pool [P, page, Hkv, D]; page_table [B, max_pages] int32;
    ctx_lens [B] int32 on q's device (never read on the host); window and sinks [Hq] as
    freetoken_kernels.ref.paged_attention has them -> [B, Hq, D] in q's dtype."""
    B, Hq, D = q.shape
    _, page, Hkv, _ = k_pool.shape
    assert Hq % Hkv == 0 and q.stride(2) == k_pool.stride(3) == v_pool.stride(3) == 1
    assert q.dtype == k_pool.dtype == v_pool.dtype, "q and the KV pools must share a dtype"
    span = min(page_table.shape[1] * page, window or page_table.shape[1] * page)  # tokens read at most
    block_n = max(16, min(block_n, triton.next_power_of_2(span)))
    n_blocks = triton.cdiv(span, block_n)                                  # token tiles at most
    if n_split is None:                                                    # ~2 programs per SM
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        n_split = min(triton.next_power_of_2(triton.cdiv(2 * sms, B * Hkv)), n_blocks)
    out = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
    part = out if n_split == 1 else torch.empty(B, Hq, n_split, D, device=q.device)
    ml = torch.empty(B, Hq, n_split, 2, device=q.device)                   # (max, sum) per split
    G = Hq // Hkv
    _split_kernel[(B, Hkv, n_split)](
        q, k_pool, v_pool, page_table, ctx_lens, q if sinks is None else sinks, part, ml, scale * LOG2E, D, Hq,
        window or 0, q.stride(0), q.stride(1), *k_pool.stride()[:3], *v_pool.stride()[:3],
        page_table.stride(0), G=G, PAGE=page, NSPLIT=n_split, PREC="ieee" if q.dtype == torch.float32 else "tf32",
        SINK=sinks is not None, BLOCK_G=max(16, triton.next_power_of_2(G)), BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_N=block_n)
    if n_split > 1:
        combine_splits(part, ml, out)
    return out


def bench_attention(ctx: int = 4096, Hq: int = 32, Hkv: int = 4, D: int = 128, page: int = 16,
                    dtype: torch.dtype = torch.bfloat16, hbm_gbs: float = 4300.0) -> dict:
    """H200 timing for B = 1, 2, 4, 8 sequences of ctx tokens: GB/s of K+V bytes vs HBM."""
    from triton.testing import do_bench
    res = {}
    for B in (1, 2, 4, 8):
        n_pages = ctx // page
        k = torch.randn(B * n_pages, page, Hkv, D, device="cuda", dtype=dtype)
        v = torch.randn_like(k)
        pt = torch.randperm(B * n_pages, device="cuda", dtype=torch.int32).view(B, n_pages)
        lens = torch.full((B,), ctx, device="cuda", dtype=torch.int32)
        q = torch.randn(B, Hq, D, device="cuda", dtype=dtype)
        ms = do_bench(lambda: paged_decode_attention(q, k, v, pt, lens, D ** -0.5))
        nbytes = 2 * k.numel() * k.element_size()
        res[B] = {"us": ms * 1e3, "GB/s": nbytes / ms / 1e6, "of_hbm": nbytes / ms / 1e6 / hbm_gbs}
    return res
