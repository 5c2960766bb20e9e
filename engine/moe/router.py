"""The one router for every architecture: scores (softmax or sigmoid), an optional correction
bias that steers the choice but not the weights, an optional limit to the best expert groups
(DeepSeek / GLM), top-k, optional renormalisation and scaling."""
from __future__ import annotations

import torch

from engine.models.base import RouterSpec


def route(logits: torch.Tensor, spec: RouterSpec, bias: torch.Tensor | None = None):
    """logits [T, E] -> (weights [T, K] in logits' dtype, expert ids [T, K] int64); on CUDA one
    Triton launch (freetoken_kernels.router_triton), elsewhere the reference below."""
    if logits.is_cuda:
        from freetoken_kernels.router_triton import route as route_kernel
        return route_kernel(logits, spec.top_k, spec.scoring, spec.norm_topk_prob, spec.scaling, bias,
                            spec.n_group, spec.topk_group, spec.group_score)
    return route_ref(logits, spec, bias)


def route_ref(logits: torch.Tensor, spec: RouterSpec, bias: torch.Tensor | None = None):
    """The semantics (plain torch)."""
    scores = logits.float().softmax(-1) if spec.scoring == "softmax" else logits.float().sigmoid()
    choice = scores if bias is None else scores + bias.float()
    if spec.n_group > 1:  # only experts of the topk_group best groups can be chosen
        groups = choice.view(choice.shape[0], spec.n_group, -1)                      # [T, G, E/G]
        rank = groups.topk(2, dim=-1).values.sum(-1) if spec.group_score == "top2" else groups.amax(-1)
        keep = torch.zeros_like(rank, dtype=torch.bool).scatter_(1, rank.topk(spec.topk_group, dim=-1).indices, True)
        choice = groups.masked_fill(~keep[..., None], float("-inf")).flatten(1)
    ids = choice.topk(spec.top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if spec.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if spec.scoring == "sigmoid" else 0))
    return (weights * spec.scaling).to(logits.dtype), ids
