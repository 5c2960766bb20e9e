"""Token sampling on the device that holds the logits, a step's rows together: greedy, temperature,
top-k and top-p, with a per-sequence seeded generator; a model's own sampling defaults."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.config import SamplingParams

GREEDY = SamplingParams()  # temperature 0


def sample(logits: torch.Tensor, params: list[SamplingParams], gens: list[torch.Generator | None],
           seen: list[torch.Tensor | None]) -> torch.Tensor:
    """A token for every row of logits [B, V], on their device, without waiting for it: row i by
    params[i] (greedy at temperature 0; else temperature, top-k, top-p, then a draw from gens[i],
    a generator on that device), its logits first scaled by a repetition penalty at the tokens
    seen[i] (bool [V], `seen_mask`) as transformers does: a positive one divided by it, a
    negative one multiplied. Top-k keeps the ties of the k-th logit, top-p a tie whole; a draw is
    the Gumbel-max of the kept logits, V uniforms a row, so a row's tokens depend on its own
    generator only, not on the rows beside it. The rows' settings reach the device in one copy
    that does not wait for the stream (a blocking one would wait for the step run ahead)."""
    dev, (B, V) = logits.device, logits.shape
    hot = [p.temperature > 0 for p in params]
    k = [min(p.top_k, V) if p.top_k and h else V if h else 1 for p, h in zip(params, hot)]
    penalty = [p.repetition_penalty if m is not None else 1.0 for p, m in zip(params, seen)]
    cfg = torch.tensor([[p.temperature if h else 1.0, p.top_p, kk, r, h]
                        for p, h, kk, r in zip(params, hot, k, penalty)]).to(dev, non_blocking=True)
    logits = logits.float()
    if any(r != 1.0 for r in penalty):
        none = torch.zeros(V, dtype=torch.bool, device=dev)
        hit, r = torch.stack([m if m is not None else none for m in seen]), cfg[:, 3:4]
        logits = torch.where(hit, torch.where(logits > 0, logits / r, logits * r), logits)
    out = logits.argmax(-1)
    if not any(hot):
        return out
    x = logits / cfg[:, :1]
    vals = (x.topk(max(k), -1) if max(k) < V else x.sort(-1, descending=True)).values  # the top logits, descending
    thr = vals.gather(1, cfg[:, 2:3].long() - 1)  # the k-th value: every logit at or above it stays
    top = vals[:, :1]
    z = torch.where(x >= thr, (x - top).exp(), 0.0).sum(-1, keepdim=True)
    probs = torch.where(vals >= thr, (vals - top).exp(), 0.0) / z
    above = (probs.cumsum(-1) - probs).gather(1, torch.searchsorted(-vals, -vals))  # mass of strictly higher logits
    top_p = cfg[:, 1:2]
    keep = (vals >= thr) & ((above < top_p) | (above == 0) | (top_p >= 1))  # the smallest set reaching top_p
    cut = torch.where(keep, vals, float("inf")).amin(-1, keepdim=True)
    half = None if all(hot) else torch.full((V,), 0.5, device=dev)  # (a greedy row's uniforms: unused)
    u = torch.stack([torch.rand(V, generator=g, device=dev) if h else half for g, h in zip(gens, hot)])
    pick = torch.where(x >= cut, x - (-u.log()).log(), float("-inf")).argmax(-1)
    return torch.where(cfg[:, 4] > 0, pick, out)


def seen_mask(tokens: list[int], vocab: int, device: torch.device) -> torch.Tensor:
    """Bool [vocab], True at `tokens`: a sequence's penalty mask, kept as it grows (a set built
    from its whole context at every step took 7 ms a token at 32k on the host)."""
    mask = torch.zeros(vocab, dtype=torch.bool, device=device)
    if tokens:
        mask[torch.tensor(tokens).to(device, non_blocking=True)] = True
    return mask


def generator(p: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    if p.temperature == 0:
        return None
    g = torch.Generator(device=device)
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
