"""Token sampling: greedy, temperature, top-k and top-p, with a per-sequence seeded generator, and
a model's own sampling defaults."""
from __future__ import annotations

import json
from pathlib import Path

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


def model_defaults(path: Path) -> dict:
    """temperature, top_p and top_k from a model's generation_config.json when it samples
    (`do_sample`), with transformers' values for the keys it leaves out; {} for greedy or no file."""
    try:
        gen = json.loads((Path(path) / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(gen, dict) or not gen.get("do_sample"):
        return {}
    unset = {"temperature": 1.0, "top_p": 1.0, "top_k": 50}
    return {k: gen[k] if gen.get(k) is not None else v for k, v in unset.items()}
