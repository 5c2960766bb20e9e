"""Token sampling: greedy, temperature, top-k and top-p, with a per-sequence seeded generator."""
from __future__ import annotations

import torch

from engine.config import SamplingParams


def sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    """logits [V] float32 -> token id."""
    if p.temperature == 0:
        return int(logits.argmax())
    logits = logits / p.temperature
    if p.top_k:
        kth = logits.topk(min(p.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_l, order = logits.sort(descending=True)
        probs = sorted_l.softmax(-1)
        drop = probs.cumsum(-1) - probs >= p.top_p  # keep the smallest prefix reaching top_p
        logits = logits.scatter(0, order, sorted_l.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1).cpu()
    return int(torch.multinomial(probs, 1, generator=gen))


def generator(p: SamplingParams) -> torch.Generator | None:
    if p.temperature == 0:
        return None
    g = torch.Generator()
    g.manual_seed(p.seed if p.seed is not None else torch.seed())
    return g
