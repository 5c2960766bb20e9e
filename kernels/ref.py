"""Plain-torch references. Each function defines the semantics of one kernel; the Triton and
C++ versions are tested against it, and it is also the path used where no kernel applies."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.quant import QWeight


def act_and_mul(gate_up: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """[N, 2I] with gate columns first, then up -> [N, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    if act == "silu":
        return F.silu(gate) * up
    raise ValueError(f"unknown expert activation {act!r}")


def expert_weight(w: torch.Tensor | QWeight, slot: int, dtype: torch.dtype) -> torch.Tensor:
    """One slot's weight [N, K] in `dtype`: a quantized one dequantized (kernels.quant), then cast."""
    return (w.dequant(slot) if isinstance(w, QWeight) else w[slot]).to(dtype)


def moe_experts(x: torch.Tensor, w_gate_up: torch.Tensor | QWeight, w_down: torch.Tensor | QWeight,
                slots: torch.Tensor, weights: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """Weighted sum of routed expert FFNs.

    x [T, H]; w_gate_up [S, 2I, H]; w_down [S, H, I] (S = slots of a GPU pool or experts of a
    host bank), tensors or QWeights of those shapes; slots [T, K] integer, -1 = this route is
    computed elsewhere; weights [T, K].
    Returns [T, H] float32: sum over k of weights[t, k] * FFN_{slots[t, k]}(x[t]), with each
    weight rounded to x's dtype (a quantized one dequantized first).
    """
    out = torch.zeros(x.shape[0], w_down.shape[1], dtype=torch.float32, device=x.device)
    flat = slots.reshape(-1)
    order = torch.argsort(flat, stable=True)
    uniq, counts = torch.unique_consecutive(flat[order], return_counts=True)
    tok, w = order // slots.shape[1], weights.reshape(-1)
    start = 0
    for s, n in zip(uniq.tolist(), counts.tolist()):
        idx, t = order[start:start + n], tok[start:start + n]
        start += n
        if s < 0:  # routes computed elsewhere
            continue
        h = act_and_mul(x[t] @ expert_weight(w_gate_up, s, x.dtype).t(), act)
        y = (h @ expert_weight(w_down, s, x.dtype).t()) * w[idx, None]
        out.index_add_(0, t, y.float())
    return out


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                    page_table: torch.Tensor, q_lens: list[int], ctx_lens: list[int],
                    scale: float, window: int | None = None) -> torch.Tensor:
    """Causal attention of new tokens over paged KV.

    q [T, Hq, D] (sequences' new tokens back to back); k_pool, v_pool [P, page, Hkv, D] already
    hold the new tokens' keys; page_table [B, max_pages]; q_lens, ctx_lens per sequence (new
    tokens, total tokens). The i-th new token of a sequence sits at position ctx - q_len + i.
    """
    page = k_pool.shape[1]
    out, start = [], 0
    for b, (ql, ctx) in enumerate(zip(q_lens, ctx_lens)):
        pages = page_table[b, :(ctx + page - 1) // page].long()
        k = k_pool[pages].flatten(0, 1)[:ctx].transpose(0, 1)  # [Hkv, ctx, D]
        v = v_pool[pages].flatten(0, 1)[:ctx].transpose(0, 1)
        qb = q[start:start + ql].transpose(0, 1)                 # [Hq, ql, D]
        start += ql
        mask = None
        if ql > 1 or window:
            qpos = torch.arange(ctx - ql, ctx, device=q.device)[:, None]
            kpos = torch.arange(ctx, device=q.device)[None, :]
            mask = kpos <= qpos
            if window:
                mask &= kpos > qpos - window
        # 4-D inputs (a batch of 1), and with a mask K/V expanded to every query head: the fused
        # kernels take nothing else, and the math fallback materialises [heads, T, ctx] scores
        gqa = k.shape[0] != qb.shape[0]
        if mask is not None and gqa:
            k, v, gqa = *(t.repeat_interleave(qb.shape[0] // t.shape[0], 0) for t in (k, v)), False
        o = F.scaled_dot_product_attention(qb[None], k[None], v[None], attn_mask=mask, scale=scale,
                                           enable_gqa=gqa)[0]
        out.append(o.transpose(0, 1))
    return torch.cat(out, dim=0)


def latent_attention(q: torch.Tensor, latent_pool: torch.Tensor, page_table: torch.Tensor,
                     q_lens: list[int], ctx_lens: list[int], scale: float, v_dim: int) -> torch.Tensor:
    """Multi-head latent attention with absorbed weights: one shared latent head (MQA).

    q [T, Hq, C + R]: each head's query with its no-rope part folded into the latent space
    (q_nope @ W_UK), then its rotary part; latent_pool [P, page, 1, C + R] holds each token's
    normed latent (C = v_dim) and its rotated rope key, and the latents are also the values.
    Returns [T, Hq, C] (the caller applies W_UV)."""
    return paged_attention(q, latent_pool, latent_pool[..., :v_dim], page_table, q_lens, ctx_lens, scale)


def split_fetch(m: int, q: float, recurring: bool = False) -> int:
    """How many of m misses to fetch over PCIe (the rest run on the CPU): the integer F in
    {floor(qm), floor(qm)+1} that minimises the slower branch max(F/q, (m-F)/(1-q)), where
    q = B_P / (B_P + B_H). Ties go to fetching, since a fill can be reused. For the same reason
    F is at least 1 when one of the misses recurs (was also demanded at this layer's previous
    step): a miss left to the CPU is never cached, so a recurring expert would otherwise run
    on the CPU at every step."""
    if q >= 1.0:
        return m
    if q <= 0.0:
        return 0
    f = int(q * m)
    cands = [c for c in (f + 1, f) if c <= m]
    f = min(cands, key=lambda c: max(c / q, (m - c) / (1 - q)))
    return max(f, 1) if recurring else f


def recurs(seen: int, clock: int, n_layers: int) -> bool:
    """Whether an expert last demanded at `seen` was demanded at its layer's previous step, when
    this step's clock is `clock` (the clock counts layer steps, n_layers of them per token)."""
    return 0 <= seen and clock - n_layers <= seen


def plan(ids: torch.Tensor, layer: int, n_experts: int, slot_of: torch.Tensor,
         owner_of: torch.Tensor, last_use: torch.Tensor, seen: torch.Tensor, clock: int,
         q: float, cold: bool = False):
    """One MoE layer step of expert-cache control; updates the tables in place.

    ids [T, K] expert ids of this layer (-1: a route computed elsewhere, e.g. by another rank,
    which stays -1 and is not counted); slot_of [L*E] (slot or -1), owner_of [S] (flat id or
    -1), last_use [S] and seen [L*E] (clock of last demand). Deduplicates the routed experts,
    classifies hits and misses, fetches F = split_fetch(M, q, a miss recurs) of the M misses (most recently
    demanded first, then most routed tokens) into the least recently used slots that no hit of
    this step owns, and returns (route slots [T, K] with -1 = CPU, fill slots [F], fill expert
    ids [F] within the layer, hits, misses). With cold, the fills enter as least recently used
    (a long prefill scans through a few cold slots instead of evicting the decode working set).
    """
    mine = ids.reshape(-1) >= 0
    flat = ids.reshape(-1) + layer * n_experts
    uniq, counts = torch.unique(flat[mine], return_counts=True)
    slots = slot_of[uniq]
    hit = slots >= 0
    miss, mcount = uniq[~hit], counts[~hit]
    order = torch.argsort(-mcount, stable=True)
    order = order[torch.argsort(-seen[miss[order]], stable=True)]
    miss = miss[order]
    protect = torch.zeros_like(last_use, dtype=torch.bool)
    protect[slots[hit]] = True
    recurring = any(recurs(int(t), clock, slot_of.numel() // n_experts) for t in seen[miss])
    f = min(split_fetch(miss.numel(), q, recurring), int((~protect).sum()))
    victims = torch.argsort(last_use.masked_fill(protect, torch.iinfo(last_use.dtype).max), stable=True)[:f]
    fetch = miss[:f]
    old = owner_of[victims]
    slot_of[old[old >= 0]] = -1
    slot_of[fetch] = victims
    owner_of[victims] = fetch
    last_use[victims] = -1 if cold else clock
    last_use[slots[hit]] = clock
    seen[uniq] = clock
    route = torch.where(mine, slot_of[flat.clamp(min=0)], -1)
    return route.view_as(ids), victims, fetch - layer * n_experts, int(hit.sum()), miss.numel()


def fill_rows(src: torch.Tensor, dst: torch.Tensor, victims: torch.Tensor, fetch: torch.Tensor,
              base: int) -> None:
    """dst[victims[i]] = src[base + fetch[i]] for every i with victims[i] >= 0 (rows of bytes)."""
    for v, f in zip(victims.tolist(), fetch.tolist()):
        if v >= 0:
            dst[v].copy_(src[base + f], non_blocking=True)
