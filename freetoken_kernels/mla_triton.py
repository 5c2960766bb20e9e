"""MLA decode attention (Triton): freetoken_kernels.ref.latent_attention for one new token per sequence.

With the up-projections absorbed, every query head attends over the same cached latent rows
(kv_lora_rank latent dims C, then the rope key's R dims), and the latents are also the values.
Split-KV ("flash decoding"): program (head block, split, b) runs an online softmax over its span
of the sequence's tokens for BLOCK_H heads together: scores are two tl.dot (latent and rope parts,
so neither is padded to C + R), and the output accumulates the latent tiles already loaded for
the scores, so each cached row is read once per head block. The head blocks of one span are
neighbours in launch order, so their reads of the same rows meet in L2. The GQA kernel's
combine_splits merges the splits. ctx_lens is read on the device only, and the grid depends on
the batch, the page table's width and the SM count only, so the launch can be captured in a
CUDA graph."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken_kernels.attention_triton import LOG2E, combine_splits


@triton.jit
def _mla_split_kernel(q_ptr, kv_ptr, pt_ptr, len_ptr, o_ptr, ml_ptr, qk_scale, Hq, chunk,
                      sq_b, sq_h, skv_p, skv_t, spt_b,
                      C: tl.constexpr, R: tl.constexpr, PAGE: tl.constexpr, NSPLIT: tl.constexpr,
                      PREC: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    hb, sp, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ctx = tl.load(len_ptr + b)
    head = hb * BLOCK_H + tl.arange(0, BLOCK_H)                           # [BLOCK_H] q heads
    offs_c, offs_r = tl.arange(0, BLOCK_C), tl.arange(0, BLOCK_R)
    mh, mc, mr = head < Hq, offs_c < C, offs_r < R
    q_row = q_ptr + b * sq_b + head[:, None] * sq_h
    q_c = tl.load(q_row + offs_c[None, :], mask=mh[:, None] & mc[None, :], other=0.0)      # [BLOCK_H, BLOCK_C]
    q_r = tl.load(q_row + C + offs_r[None, :], mask=mh[:, None] & mr[None, :], other=0.0)  # [BLOCK_H, BLOCK_R]
    m_i = tl.full([BLOCK_H], -1e30, tl.float32)                           # running max (log2)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, ctx)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)                            # [BLOCK_N] positions
        mn = offs_n < hi
        page = tl.load(pt_ptr + b * spt_b + offs_n // PAGE, mask=mn, other=0).to(tl.int64)
        row = kv_ptr + page * skv_p + (offs_n % PAGE) * skv_t              # [BLOCK_N] row starts
        c = tl.load(row[:, None] + offs_c[None, :], mask=mn[:, None] & mc[None, :], other=0.0)      # [BLOCK_N, BLOCK_C]
        r = tl.load(row[:, None] + C + offs_r[None, :], mask=mn[:, None] & mr[None, :], other=0.0)  # [BLOCK_N, BLOCK_R]
        s = tl.dot(q_c, tl.trans(c), input_precision=PREC)
        s = (s + tl.dot(q_r, tl.trans(r), input_precision=PREC)) * qk_scale  # [BLOCK_H, BLOCK_N]
        s = tl.where(mn[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision=PREC)
        m_i = m_new
    out = (b * Hq + head) * NSPLIT + sp                                   # [BLOCK_H] rows
    mo = mh[:, None] & mc[None, :]
    if NSPLIT == 1:
        tl.store(o_ptr + out[:, None] * C + offs_c[None, :], (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=mo)
    else:
        tl.store(o_ptr + out[:, None] * C + offs_c[None, :], acc, mask=mo)
        tl.store(ml_ptr + out * 2, m_i, mask=mh)
        tl.store(ml_ptr + out * 2 + 1, l_i, mask=mh)


def mla_decode_attention(q: torch.Tensor, kv_pool: torch.Tensor, page_table: torch.Tensor,
                         ctx_lens: torch.Tensor, scale: float, v_dim: int, n_split: int | None = None,
                         block_n: int = 32, block_h: int = 32) -> torch.Tensor:
    """q [B, Hq, C + R] (latent-space queries, then rotary parts); kv_pool [P, page, 1, C + R] with
    C = v_dim; page_table [B, max_pages] int32; ctx_lens [B] int32 on q's device -> [B, Hq, C].

    A program holds its heads' [block_h, C] fp32 accumulator in registers, so one 8-warp program
    fits an SM at DeepSeek's C = 512; by default the splits fill one wave, a program per SM."""
    B, Hq, W = q.shape
    _, page, one, _ = kv_pool.shape
    C, R = v_dim, W - v_dim
    assert one == 1 and kv_pool.shape[-1] == W and q.stride(2) == kv_pool.stride(3) == 1
    assert q.dtype == kv_pool.dtype, "q and the latent pool must share a dtype"
    block_n = max(16, min(block_n, triton.next_power_of_2(page_table.shape[1] * page)))
    n_blocks = triton.cdiv(page_table.shape[1] * page, block_n)            # token tiles at most
    block_h = max(16, min(block_h, triton.next_power_of_2(Hq)))            # tl.dot's smallest M is 16
    n_heads = triton.cdiv(Hq, block_h)
    if n_split is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        n_split = max(1, sms // (B * n_heads))
    n_split = min(n_split, n_blocks)
    chunk = triton.cdiv(n_blocks, n_split) * block_n                       # tokens per split
    out = torch.empty(B, Hq, C, dtype=q.dtype, device=q.device)
    part = out if n_split == 1 else torch.empty(B, Hq, n_split, C, device=q.device)
    ml = torch.empty(B, Hq, n_split, 2, device=q.device)                   # (max, sum) per split
    _mla_split_kernel[(n_heads, n_split, B)](
        q, kv_pool, page_table, ctx_lens, part, ml, scale * LOG2E, Hq, chunk,
        q.stride(0), q.stride(1), kv_pool.stride(0), kv_pool.stride(1), page_table.stride(0),
        C=C, R=R, PAGE=page, NSPLIT=n_split, PREC="ieee" if q.dtype == torch.float32 else "tf32",
        BLOCK_H=block_h, BLOCK_C=max(16, triton.next_power_of_2(C)),
        BLOCK_R=max(16, triton.next_power_of_2(R)), BLOCK_N=block_n, num_warps=4 if C <= 256 else 8)
    if n_split > 1:
        combine_splits(part, ml, out)
    return out


# (block_h, block_n) tried by bench_mla; the first is mla_decode_attention's default
TILES = [(32, 32), (16, 16), (16, 32), (16, 64), (32, 16)]


def bench_mla(ctx: int = 4096, Hq: int = 128, C: int = 512, R: int = 64, page: int = 16,
              dtype: torch.dtype = torch.bfloat16, hbm_gbs: float = 4300.0) -> dict:
    """H200 timing for B = 1, 2, 4, 8 sequences of ctx tokens (DeepSeek-V3's 128 heads and 576-wide
    latent rows): us, GB/s of latent bytes read and the share of HBM bandwidth at the default
    tiles, and the us of every (block_h, block_n) in TILES beside."""
    from triton.testing import do_bench
    res = {}
    for B in (1, 2, 4, 8):
        n_pages = ctx // page
        kv = torch.randn(B * n_pages, page, 1, C + R, device="cuda", dtype=dtype)
        pt = torch.randperm(B * n_pages, device="cuda", dtype=torch.int32).view(B, n_pages)
        lens = torch.full((B,), ctx, device="cuda", dtype=torch.int32)
        q = torch.randn(B, Hq, C + R, device="cuda", dtype=dtype)
        tried = {f"h{bh} n{bn}": do_bench(lambda: mla_decode_attention(q, kv, pt, lens, (192 ** -0.5), C,
                                                                       block_n=bn, block_h=bh)) * 1e3
                 for bh, bn in TILES}
        us = tried[f"h{TILES[0][0]} n{TILES[0][1]}"]
        nbytes = kv.numel() * kv.element_size()
        res[B] = {"us": us, "GB/s": nbytes / us / 1e3, "of_hbm": nbytes / us / 1e3 / hbm_gbs,
                  "tried_us": {k: round(v, 1) for k, v in tried.items()}}
    return res
