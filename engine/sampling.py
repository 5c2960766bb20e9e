"""Token sampling: greedy, temperature, top-k and top-p, with a per-sequence seeded generator, and
a model's own sampling defaults."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.config import SamplingParams


def sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None,
               seen: torch.Tensor | None = None) -> int:
    """logits [V] float32 -> token id. `seen`: bool [V], the sequence's tokens so far (prompt and
    output; `seen_mask`), whose logits a repetition penalty scales as transformers does (a
    positive one divided by it, a negative one multiplied)."""
    if p.repetition_penalty != 1.0 and seen is not None:
        r = p.repetition_penalty
        logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
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


def seen_mask(tokens: list[int], vocab: int, device: torch.device) -> torch.Tensor:
    """Bool [vocab], True at `tokens`: a sequence's penalty mask, kept as it grows (a set built
    from its whole context at every step took 7 ms a token at 32k on the host)."""
    mask = torch.zeros(vocab, dtype=torch.bool, device=device)
    if tokens:
        mask[torch.tensor(tokens, device=device)] = True
    return mask


def generator(p: SamplingParams) -> torch.Generator | None:
    if p.temperature == 0:
        return None
    g = torch.Generator()
    g.manual_seed(p.seed if p.seed is not None else torch.seed())
    return g


def model_defaults(path: Path) -> dict:
    """A model's sampling defaults from its generation_config.json: temperature, top_p and top_k
    when it samples (`do_sample`, transformers' values for the keys it leaves out), and its
    repetition_penalty; {} without a file."""
    try:
        gen = json.loads((Path(path) / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(gen, dict):
        return {}
    out = {"repetition_penalty": gen["repetition_penalty"]} if gen.get("repetition_penalty") else {}
    if gen.get("do_sample"):
        unset = {"temperature": 1.0, "top_p": 1.0, "top_k": 50}
        out |= {k: gen[k] if gen.get(k) is not None else v for k, v in unset.items()}
    return out
