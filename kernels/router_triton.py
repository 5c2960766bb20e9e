"""Router scoring and top-k in one launch (Triton): the semantics of engine.moe.router's plain
function (scores, optional correction bias, top-k by descending choice, optional renormalisation,
scaling). At decode torch runs softmax, topk, a sort of the k winners, gather and renormalise as
~10 kernels per layer; here one program per token holds its E scores in registers and extracts
the k largest in order (ties: lowest expert id first)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, E, K, scaling, eps,
                  SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
                  BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    me = e < E
    x = tl.load(logits_ptr + t * E + e, mask=me, other=-float("inf")).to(tl.float32)
    if SIGMOID:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        p = tl.exp(x - tl.max(x, axis=0))
        s = p / tl.sum(p, axis=0)
    choice = s
    if HAS_BIAS:
        choice = s + tl.load(bias_ptr + e, mask=me, other=0.0).to(tl.float32)
    choice = tl.where(choice != choice, float("inf"), choice)      # NaN ranks first, as in torch.topk
    choice = tl.where(me, choice, -float("inf"))
    k = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], tl.int64)
    w = tl.zeros([BLOCK_K], tl.float32)
    for j in range(0, K):
        best = tl.max(choice, axis=0)
        i = tl.min(tl.where((choice == best) & me, e, E - 1), axis=0)  # lowest id among ties
        ids = tl.where(k == j, i, ids)
        w = tl.where(k == j, tl.sum(tl.where(e == i, s, 0.0), axis=0), w)
        choice = tl.where(e == i, -float("inf"), choice)
    if NORM:
        w = w / (tl.sum(w, axis=0) + eps)
    mk = k < K
    tl.store(ids_ptr + t * K + k, ids, mask=mk)
    tl.store(w_ptr + t * K + k, (w * scaling).to(w_ptr.dtype.element_ty), mask=mk)


def route(logits: torch.Tensor, top_k: int, scoring: str, norm: bool, scaling: float,
          bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, K] in logits' dtype, expert ids [T, K] int64)."""
    T, E = logits.shape
    w = torch.empty(T, top_k, dtype=logits.dtype, device=logits.device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=logits.device)
    if T:
        _route_kernel[(T,)](logits.contiguous(), bias if bias is not None else logits, w, ids, E, top_k,
                            float(scaling), 1e-20 if scoring == "sigmoid" else 0.0,
                            SIGMOID=scoring == "sigmoid", HAS_BIAS=bias is not None, NORM=norm,
                            BLOCK_E=triton.next_power_of_2(E), BLOCK_K=triton.next_power_of_2(top_k),
                            num_warps=1)  # one warp: the k extractions reduce within a warp
    return w, ids
