"""Plain-torch references. Each function defines the semantics of one kernel; the Triton and
C++ versions are tested against it, and it is also the path used where no kernel applies."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from freetoken_kernels.quant import QWeight

# cuDNN's attention builds a graph for every new (query, key) length it meets, 0.04-1.4 s each on
# an H200, so every prompt of a new length would pay it; the other fused kernels need no build
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass(frozen=True)
class ExpertAct:
    """The gated activation of a routed expert: h = g * sigmoid(alpha * g) * (u + shift) for its
    gate g and up u, with g clamped from above and u on both sides at `limit` first (None: no
    clamp). The defaults are SwiGLU's silu(g) * u; gpt-oss's clamped SwiGLU is (1.702, 7.0, 1.0)."""
    alpha: float = 1.0
    limit: float | None = None
    shift: float = 0.0


SILU = ExpertAct()
ExpertBias = tuple  # (gate_up bias [S, 2I], down bias [S, H]), float32, or None: no biases


def act_and_mul(gate_up: torch.Tensor, act: ExpertAct = SILU) -> torch.Tensor:
    """[N, 2I] with gate columns first, then up -> [N, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    if act == SILU:
        return F.silu(gate) * up
    if act.limit is not None:
        gate, up = gate.clamp(max=act.limit), up.clamp(-act.limit, act.limit)
    return gate * torch.sigmoid(gate * act.alpha) * (up + act.shift)


def expert_weight(w: torch.Tensor | QWeight, slot: int, dtype: torch.dtype) -> torch.Tensor:
    """One slot's weight [N, K] in `dtype`: a quantized one dequantized (freetoken_kernels.quant), then cast."""
    return (w.dequant(slot) if isinstance(w, QWeight) else w[slot]).to(dtype)


def moe_experts(x: torch.Tensor, w_gate_up: torch.Tensor | QWeight, w_down: torch.Tensor | QWeight,
                slots: torch.Tensor, weights: torch.Tensor, act: ExpertAct = SILU,
                bias: ExpertBias | None = None, reduce: bool = True, routes: torch.Tensor | None = None) -> torch.Tensor:
    """Weighted sum of routed expert FFNs.

    x [T, H]; w_gate_up [S, 2I, H]; w_down [S, H, I] (S = slots of a GPU pool or experts of a
    host bank), tensors or QWeights of those shapes; slots [T, K] integer, -1 = this route is
    computed elsewhere; weights [T, K]; bias: the slots' gate_up and down biases, or None.
    Returns [T, H] float32: sum over k of weights[t, k] * FFN_{slots[t, k]}(x[t]), where
    FFN(x) = act(x Wgu^T + bgu) Wd^T + bd, with each weight and bias rounded to x's dtype (a
    quantized weight dequantized first), each token's routes summed in the order of k. Without
    reduce: the weighted routes [T, K, H] (a route computed elsewhere: zero). routes: that result of
    an earlier call on other routes of the same tokens, written into instead of zeros (groups of
    experts computed in turns and summed once).
    """
    T, K = slots.shape
    out = torch.zeros(T * K, w_down.shape[1], dtype=torch.float32, device=x.device) if routes is None \
        else routes.view(T * K, -1)
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
        gu = x[t] @ expert_weight(w_gate_up, s, x.dtype).t()
        if bias is not None:
            gu = gu + bias[0][s].to(x.dtype)
        y = act_and_mul(gu, act) @ expert_weight(w_down, s, x.dtype).t()
        if bias is not None:
            y = y + bias[1][s].to(x.dtype)
        out[idx] = (y * w[idx, None]).float()
    out = out.view(T, K, -1)
    return out.sum(1) if reduce else out


@sdpa_kernel(SDPA_BACKENDS)
def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                    page_table: torch.Tensor, q_lens: list[int], ctx_lens: list[int],
                    scale: float, window: int | None = None, sinks: torch.Tensor | None = None,
                    new: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Causal attention of new tokens over paged KV.

    q [T, Hq, D] (sequences' new tokens back to back); k_pool, v_pool [P, page, Hkv, D] already
    hold the new tokens' keys; page_table [B, max_pages]; q_lens, ctx_lens per sequence (new
    tokens, total tokens). The i-th new token of a sequence sits at position ctx - q_len + i.
    window: a query sees only the `window` latest positions up to its own (pages wholly before
    every query's window are never read); sinks [Hq]: a logit per head that joins each softmax's
    denominator with no value (gpt-oss); new: the new tokens' keys and values [T, Hkv, D], read
    from these rather than from the pool, which then needs to hold only the keys before them (a
    sliding layer's prefill chunk, whose pages behind the window of the chunk's end are not held).
    """
    page = k_pool.shape[1]
    out, start = [], 0
    for b, (ql, ctx) in enumerate(zip(q_lens, ctx_lens)):
        lo = max(0, ctx - ql - window + 1) // page * page if window else 0  # first key read
        end = ctx if new is None else ctx - ql                            # the last from the pool, + 1
        pages = page_table[b, lo // page:(end + page - 1) // page].long()
        k, v = (pool[pages].flatten(0, 1)[:end - lo] for pool in (k_pool, v_pool))
        if new is not None:
            k, v = (torch.cat((old, t[start:start + ql])) for old, t in zip((k, v), new))
        k, v = k.transpose(0, 1), v.transpose(0, 1)                   # [Hkv, ctx - lo, D]
        qb = q[start:start + ql].transpose(0, 1)                      # [Hq, ql, D]
        start += ql
        if ql > 1 and not window and sinks is None and _flash_prefill(qb, k, v):
            # FlashAttention's causal mask is aligned to the last key, as a chunk after cached
            # tokens needs (SDPA's is_causal aligns it to the first); it reads grouped K/V as they are
            o = torch.ops.aten._scaled_dot_product_flash_attention(qb[None], k[None], v[None], 0.0, True,
                                                                   scale=scale)[0][0]
            out.append(o.transpose(0, 1))
            continue
        mask = None
        if ql > 1 or window:
            qpos = torch.arange(ctx - ql, ctx, device=q.device)[:, None]
            kpos = torch.arange(lo, ctx, device=q.device)[None, :]
            mask = kpos <= qpos
            if window:
                mask &= kpos > qpos - window
        # 4-D inputs (a batch of 1), and with a mask K/V expanded to every query head: the fused
        # kernels take nothing else, and the math fallback materialises [heads, T, ctx] scores
        gqa = k.shape[0] != qb.shape[0]
        if (mask is not None or sinks is not None) and gqa:
            k, v, gqa = *(t.repeat_interleave(qb.shape[0] // t.shape[0], 0) for t in (k, v)), False
        if sinks is not None:
            qb, k, v, mask = _sink_key(qb, k, v, mask, sinks, scale)
        o = F.scaled_dot_product_attention(qb[None], k[None], v[None], attn_mask=mask, scale=scale,
                                           enable_gqa=gqa)[0]
        out.append(o.transpose(0, 1))
    return torch.cat(out, dim=0)


def _flash_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a prefill's causal attention runs in FlashAttention: CUDA from sm80, half precision,
    equal head widths up to 256 in multiples of 8. (SDPA with a mask runs the memory-efficient
    kernel: 36 ms a layer for 16k tokens of Qwen3-30B-A3B's heads on an H200, against 7.2 ms.)"""
    D = q.shape[-1]
    return (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and k.shape[-1] == v.shape[-1] == D
            and D <= 256 and D % 8 == 0 and torch.cuda.get_device_capability(q.device) >= (8, 0))


def _sink_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              sinks: torch.Tensor, scale: float):
    """Attention sinks as one more key per head, seen by every query, whose score is the head's
    sink logit and whose value is zero, so it only adds exp(sink) to the softmax's denominator.
    q [H, n, D] and k [H, m, D] gain 8 dims (fused kernels want widths in multiples of 8): q's
    first is 1, the real keys' 0 (their scores do not change), the sink key's sink / scale."""
    H, n, D = q.shape
    q = torch.cat((q, F.pad(torch.ones(H, n, 1, dtype=q.dtype, device=q.device), (0, 7))), dim=-1)
    sink = torch.zeros(H, 1, D + 8, dtype=k.dtype, device=k.device)
    sink[:, 0, D] = sinks.float() / scale
    k = torch.cat((F.pad(k, (0, 8)), sink), dim=1)
    v = torch.cat((v, v.new_zeros(H, 1, v.shape[-1])), dim=1)
    if mask is not None:
        mask = F.pad(mask, (0, 1), value=True)
    return q, k, v, mask


def latent_attention(q: torch.Tensor, latent_pool: torch.Tensor, page_table: torch.Tensor,
                     q_lens: list[int], ctx_lens: list[int], scale: float, v_dim: int) -> torch.Tensor:
    """Multi-head latent attention with absorbed weights: one shared latent head (MQA).

    q [T, Hq, C + R]: each head's query with its no-rope part folded into the latent space
    (q_nope @ W_UK), then its rotary part; latent_pool [P, page, 1, C + R] holds each token's
    normed latent (C = v_dim) and its rotated rope key, and the latents are also the values.
    Returns [T, Hq, C] (the caller applies W_UV)."""
    return paged_attention(q, latent_pool, latent_pool[..., :v_dim], page_table, q_lens, ctx_lens, scale)


def split_fetch(m: int, q: float, least: int = 0) -> int:
    """How many of m misses to fetch over PCIe (the rest run on the CPU): the integer F in
    {floor(qm), floor(qm)+1} that minimises the slower branch max(F/q, (m-F)/(1-q)), where
    q = B_P / (B_P + B_H). Ties go to fetching, since a fill can be reused. For the same reason
    F is at least `least` (at most m; see plan): a miss left to the CPU is never cached, so a
    recurring expert would otherwise run on the CPU at every step, and a cache with room for
    more than the steps' misses would fill through recurring misses only."""
    if q >= 1.0:
        return m
    if q <= 0.0:
        return 0
    f = int(q * m)
    cands = [c for c in (f + 1, f) if c <= m]
    f = min(cands, key=lambda c: max(c / q, (m - c) / (1 - q)))
    return max(f, min(least, m))


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
    classifies hits and misses, fetches F = split_fetch(M, q, least) of the M misses (most
    recently demanded first, then most routed tokens; least: 1 when a miss recurs, and the number
    of empty slots first in line, fills that evict nothing) into the least recently used slots
    that no hit of this step owns and that are not reserved (last_use at its maximum: prefill
    buffers), and returns (route slots [T, K] with -1 = CPU, fill slots [F], fill expert ids [F]
    within the layer, hits, misses). With cold, the fills enter as least recently used
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
    protect = last_use == torch.iinfo(last_use.dtype).max  # reserved (prefill buffers)
    protect[slots[hit]] = True
    lru = torch.argsort(last_use.masked_fill(protect, torch.iinfo(last_use.dtype).max), stable=True)
    lru = lru[:int((~protect).sum())]
    room = int(torch.cumprod(owner_of[lru[:miss.numel()]] < 0, 0).sum())  # empty slots first in line
    recurring = any(recurs(int(t), clock, slot_of.numel() // n_experts) for t in seen[miss])
    f = min(split_fetch(miss.numel(), q, max(room, int(recurring))), lru.numel())
    victims = lru[:f]
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


# Gated DeltaNet (linear attention of Qwen3-Next / Qwen3.5). q, k are L2-normalised inside (in
# fp32) and q scaled by Dk^-0.5; the state S [H, Dk, Dv] (fp32) decays by exp(g) per token and
# learns with rate beta: S = exp(g) S + k (beta (v - S^T k))^T, o = S^T q.

def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _expand_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., Hk, D] -> [..., heads, D]: each key head serves heads / Hk consecutive value heads."""
    return x if x.shape[-2] == heads else x.repeat_interleave(heads // x.shape[-2], dim=-2)


def causal_conv1d(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv with SiLU over new inputs x [T, C], continuing from state [K-1, C]
    (the previous K-1 inputs); weight [C, K]. -> (out [T, C] in x's dtype, new state [K-1, C])."""
    xx = torch.cat((state.to(x.dtype), x))                                # [K-1+T, C]
    out = F.conv1d(xx.t()[None], weight[:, None].to(x.dtype), groups=weight.shape[0])[0].t()
    return F.silu(out), xx[xx.shape[0] - state.shape[0]:]


def causal_conv1d_step(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One new input per sequence: x [B, C], state [B, K-1, C] -> (out [B, C], new state)."""
    xx = torch.cat((state.to(x.dtype), x[:, None]), dim=1)                # [B, K, C]
    out = F.silu((xx.float() * weight.t().float()).sum(1)).to(x.dtype)
    return out, xx[:, 1:]


def gated_delta_step(q, k, v, g, beta, state) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: q, k [B, Hk, Dk], v [B, H, Dv], g, beta [B, H], state [B, H, Dk, Dv]
    (fp32) -> (o [B, H, Dv] in v's dtype, new state)."""
    H = v.shape[1]
    q, k = (_l2norm(_expand_heads(t, H).float()) for t in (q, k))
    q = q * q.shape[-1] ** -0.5
    s = state * g.float().exp()[..., None, None]
    delta = (v.float() - (s * k[..., None]).sum(-2)) * beta.float()[..., None]
    s = s + k[..., None] * delta[..., None, :]
    return (s * q[..., None]).sum(-2).to(v.dtype), s


def gated_delta_chunked(q, k, v, g, beta, state, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence at once, in chunks (the UT-transform form): q, k [T, Hk, Dk], v [T, H, Dv],
    g, beta [T, H], state [H, Dk, Dv] (fp32) -> (o [T, H, Dv] in v's dtype, final state).
    Equals gated_delta_step applied token by token."""
    (T, H), dtype = v.shape[:2], v.dtype
    q, k = (_l2norm(_expand_heads(t, H).float()).transpose(0, 1) for t in (q, k))   # [H, T, Dk]
    q = q * q.shape[-1] ** -0.5
    v, g, beta = v.float().transpose(0, 1), g.float().t(), beta.float().t()          # [H, T, ...]
    pad = -T % chunk
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (T + pad) // chunk
    q, k, v = (t.reshape(H, n, chunk, -1) for t in (q, k, v))
    g, beta = g.reshape(H, n, chunk).cumsum(-1), beta.reshape(H, n, chunk)           # g: log decay so far
    kb, vb = k * beta[..., None], v * beta[..., None]
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(future, float("-inf")).exp()  # [H, n, C, C]
    # the chunk's own delta updates as one unit-lower-triangular system: u = M^-1 (beta v) are the
    # values written, w = M^-1 (beta k e^g) the keys that read the state the chunk starts from
    system = (kb @ k.transpose(-1, -2)) * decay
    u = torch.linalg.solve_triangular(system, vb, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, kb * g.exp()[..., None], upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay
    qg, kg = q * g.exp()[..., None], k * (g[..., -1:] - g).exp()[..., None]
    last = g[..., -1].exp()[..., None, None]                                         # [H, n, 1, 1]
    s, out = state.float(), torch.empty_like(v)
    for i in range(n):
        fresh = u[:, i] - w[:, i] @ s                                                # [H, C, Dv]
        out[:, i] = qg[:, i] @ s + attn[:, i] @ fresh
        s = s * last[:, i] + kg[:, i].transpose(-1, -2) @ fresh
    return out.reshape(H, n * chunk, -1)[:, :T].transpose(0, 1).to(dtype), s
