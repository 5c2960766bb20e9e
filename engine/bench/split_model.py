"""What a decode token costs on a routing trace, estimated on the CPU from measured numbers: the
miss policies, whole-expert splits against the ideal split, and a cross-layer prefetch on the idle
link. No GPU and no weights needed.

Replays the trace through the engine's host residency tables (the plan rule of the GPU kernel:
LRU, the q split, the recurring-miss and empty-slot rules), from the cache the loader leaves (empty, or every
expert when the budget holds them all), and prices every layer step's misses: the engine's split,
max(F·s / B_P, (M − F)·s / B_H + the executor's cost per job), beside the ideal split of the same
misses, M·s / (B_P + B_H), the bound's; the concurrent bandwidths of the profile where both sides
work in a step, the solo ones where one does. A token's estimated time is a measured token with
every expert resident plus its layer steps' miss time. As in the step profiles of
benchmarks/RESULTS.md, a layer step's GPU work runs around its misses, not beside them, except the
expert kernels (`experts_s`), which follow the fills while the CPU's job runs: a step's miss time
is max(link, CPU − experts_s).

Prefetch (`predict`): the link idles from the end of layer l's fills to the start of layer l+1's,
max(link + experts_s, CPU) − link + `gap_s` (the merge, layer l+1's attention, router and plan).
In that window the predicted experts of layer l+1 that are not resident are fetched, as many whole experts
as the window holds at B_P (so layer l+1's own fills never wait), into the least recently used
slots that layer l does not use, entering as least recently used: a wrong guess is the next victim,
a right one becomes a hit of layer l+1 (and its most recent). `Guess` models the predictor from its
measured share per layer pair.
Usage: python3 -m engine.bench.split_model TRACE --profile PROFILE.json --resident TOK_S[,BOUND_TOK_S]
       [--budgets 1152MiB,8GiB,16GiB] [--share S1,...] [--tokens FIRST:END] [--job-us 25] [--experts-us 23]
       [--gap-us 64]"""
from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import dataclass

import numpy as np
import torch

from engine.config import parse_size
from engine.moe.tables import HostTables

EXPERT_BYTES = 9437184  # Qwen3-30B-A3B, bf16
HBM_GBPS = 4240.0  # the H200's copy rate behind the all-resident rows' bounds (thirteenth run, batch 1 and 4)


@dataclass(frozen=True)
class Machine:
    """Measured rates: link (B_P) and CPU executor (B_H) bandwidths in bytes/s while both work and
    alone, the executor's fixed cost per job, the GPU's expert kernels of a layer step, and the
    link's idle time per layer step after them (from the merge to the next layer's fills)."""
    b_p: float
    b_h: float
    b_p_solo: float
    b_h_solo: float
    job_s: float = 25e-6
    experts_s: float = 23e-6
    gap_s: float = 64e-6
    expert_bytes: int = EXPERT_BYTES

    @classmethod
    def from_profile(cls, prof: dict, **kw) -> Machine:
        """From `freetoken profile --json`'s object."""
        g = 1e9
        return cls(prof["h2d_concurrent_gbps"] * g, prof["cpu_expert_concurrent_gbps"] * g,
                   prof["h2d_gbps"] * g, prof["cpu_expert_gbps"] * g, expert_bytes=prof["expert_bytes"], **kw)


class Guess:
    """The cross-layer predictor, modelled from its measured share per layer pair: each expert the
    trace routes at layer l+1 is among the K guesses with probability share[l]; the other guesses
    are layer l+1's other experts drawn by their frequency in the trace (+1, so any may come up);
    the guesses come in random order."""

    def __init__(self, trace: np.ndarray, experts: int, share: list[float], seed: int = 0):
        self.trace, self.share, self.rng = trace, share, np.random.default_rng(seed)
        self.freq = [np.bincount(trace[:, layer].ravel(), minlength=experts) + 1.0 for layer in range(trace.shape[1])]

    def __call__(self, token: int, layer: int) -> list[int]:
        """Guesses for `layer` (>= 1), made from the MoE input of layer - 1."""
        routed = self.trace[token, layer]
        right = routed[self.rng.random(len(routed)) < self.share[layer - 1]]
        p = self.freq[layer].copy()
        p[routed] = 0
        wrong = self.rng.choice(len(p), len(routed) - len(right), replace=False, p=p / p.sum())
        guess = np.concatenate([right, wrong]).astype(int)
        self.rng.shuffle(guess)
        return guess.tolist()


def prefetch(t: HostTables, flats: list[int], busy: set[int]) -> None:
    """Install `flats` into the least recently used slots outside `busy`, as least recently used."""
    victims = list(itertools.islice((s for s in t.lru if s not in busy), len(flats)))
    for s, f in zip(victims, flats):
        t.install(s, f)
    for s in reversed(victims):
        t.lru.move_to_end(s, last=False)


def price(trace: np.ndarray, slots: int, experts: int, m: Machine, q: float | None = None, predict=None,
          warm_tokens: int = 64, end: int | None = None) -> dict:
    """trace [tokens, layers, K] through `slots` cache slots at fetched share q (None: q* of m's
    concurrent bandwidths) -> per token over tokens [warm_tokens, end): hit rate, hits, misses,
    fetched, cpu, miss seconds of the engine's split (split_s) and of the ideal one (ideal_s),
    experts prefetched and those of them that layer l+1 then used; with `predict` (token, layer
    -> guessed expert ids), the prefetch of the module doc."""
    tokens, layers, _ = trace.shape
    end = tokens if end is None else end
    slots = min(slots, layers * experts)
    t = HostTables(slots, layers * experts, layers)
    if slots == layers * experts:
        t.install_block(0, 0, slots)
    q = m.b_p / (m.b_p + m.b_h) if q is None else q
    s = m.expert_bytes
    sums = dict.fromkeys(("hits", "misses", "fetched", "cpu", "split_s", "ideal_s", "prefetched", "used"), 0.0)
    pending: set[int] = set()
    for tok in range(end):
        for layer in range(layers):
            ids, base = trace[tok, layer].tolist(), layer * experts
            route, victims, _, h, miss = t.plan(torch.tensor([ids]), base, q)
            f, c = len(victims), miss - len(victims)
            both = f > 0 and c > 0
            link = f * s / (m.b_p if both else m.b_p_solo)
            cpu = c * s / (m.b_h if both else m.b_h_solo) + (m.job_s if c else 0.0)
            miss_s = max(link, cpu - m.experts_s)
            used, pending = len(pending.intersection(base + e for e in ids)), set()
            if predict is not None and layer + 1 < layers:
                room = int((max(link + m.experts_s, cpu) - link + m.gap_s) * m.b_p / s)  # whole fills the idle link holds
                nxt = (layer + 1) * experts
                want = [nxt + e for e in predict(tok, layer + 1) if t.slot_of[nxt + e] < 0][:room]
                prefetch(t, want, {r for r in route if r >= 0})
                pending = set(want)
            if tok < warm_tokens:
                continue
            for k, v in (("hits", h), ("misses", miss), ("fetched", f), ("cpu", c), ("split_s", miss_s),
                         ("ideal_s", miss * s / (m.b_p + m.b_h)), ("prefetched", len(pending)), ("used", used)):
                sums[k] += v
    n = end - warm_tokens
    out = {k: v / n for k, v in sums.items()}
    out["hit_rate"] = sums["hits"] / max(1.0, sums["hits"] + sums["misses"])
    return out


def tok_s(r: dict, resident_s: float) -> float:
    """Estimated decode tok/s: a token with every expert resident plus the miss time."""
    return 1.0 / (resident_s + r["split_s"])


def bound_tok_s(r: dict, m: Machine, resident_bound_s: float, hbm: float = HBM_GBPS * 1e9) -> float:
    """`freetoken bench decode`'s bound for these per-token misses: the missed bytes split ideally
    (concurrent rates when both sides work, solo otherwise) plus the GPU's bytes at HBM speed, which
    are the all-resident row's (its bound's time) less the experts the CPU computes."""
    s = m.expert_bytes
    if r["fetched"] > 0 and r["cpu"] > 0:
        misses = (r["fetched"] + r["cpu"]) * s / (m.b_p + m.b_h)
    else:
        misses = r["fetched"] * s / m.b_p_solo + r["cpu"] * s / m.b_h_solo
    return 1.0 / (misses + resident_bound_s - r["cpu"] * s / hbm)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--profile", required=True, help="`freetoken profile --json` output of the machine")
    ap.add_argument("--resident", required=True, help="measured tok/s with every expert resident[,its bound tok/s]")
    ap.add_argument("--budgets", default="1152MiB,8GiB,16GiB")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--job-us", type=float, default=25.0)
    ap.add_argument("--experts-us", type=float, default=23.0)
    ap.add_argument("--gap-us", type=float, default=64.0)
    ap.add_argument("--share", help="the predictor's measured share per layer pair: adds prefetch rows")
    ap.add_argument("--seed", type=int, default=0, help="of the modelled predictor's draws")
    ap.add_argument("--tokens", default="64:", help="FIRST:END, the tokens counted (the ones before warm the cache)")
    a = ap.parse_args(argv)
    trace = np.load(a.trace)
    with open(a.profile) as f:
        prof = json.load(f)
    if not prof.get("h2d_concurrent_gbps"):
        raise SystemExit(f"{a.profile} has no link bandwidths (h2d_*); use a profile taken on a machine with a GPU")
    m = Machine.from_profile(prof, job_s=a.job_us * 1e-6, experts_s=a.experts_us * 1e-6, gap_s=a.gap_us * 1e-6)
    resident = [float(x) for x in a.resident.split(",")]
    first, _, last = a.tokens.partition(":")
    span = dict(warm_tokens=int(first), end=int(last) if last else None)
    share = [float(x) for x in a.share.split(",")] if a.share else None
    if share and len(share) != trace.shape[1] - 1:
        raise SystemExit(f"--share needs {trace.shape[1] - 1} values (one per layer pair of the trace), got {len(share)}")
    print(f"B_P {m.b_p / 1e9:.1f} / {m.b_p_solo / 1e9:.1f} GB/s, B_H {m.b_h / 1e9:.1f} / {m.b_h_solo / 1e9:.1f} "
          f"(concurrent / solo), q* {m.b_p / (m.b_p + m.b_h):.3f}, job {a.job_us:g} us, experts {a.experts_us:g} us, "
          f"gap {a.gap_us:g} us, all resident {resident[0]:g} tok/s; estimates")
    for budget in a.budgets.split(","):
        slots = min(parse_size(budget) // m.expert_bytes, trace.shape[1] * a.experts)
        rows = {p: price(trace, slots, a.experts, m, q, **span) for p, q in (("adaptive", None), ("fetch", 1.0), ("cpu", 0.0))}
        if share:
            for name, sh in (("adaptive + prefetch", share), ("adaptive + oracle prefetch", [1.0] * len(share))):
                rows[name] = price(trace, slots, a.experts, m, predict=Guess(trace, a.experts, sh, a.seed), **span)
        base = tok_s(rows["adaptive"], 1 / resident[0])
        print(f"{budget} ({slots} slots, {slots / (trace.shape[1] * a.experts):.0%} of the experts):")
        for name, r in rows.items():
            est = tok_s(r, 1 / resident[0])
            line = (f"  {name}: {est:.1f} tok/s ({est / base:.3f}x adaptive), hit rate {r['hit_rate']:.1%}, "
                    f"fetched {r['fetched']:.2f} / CPU {r['cpu']:.2f} per token, miss time {r['split_s'] * 1e3:.3f} ms "
                    f"(ideal split {r['ideal_s'] * 1e3:.3f})")
            if len(resident) > 1:
                line += f", {est / bound_tok_s(r, m, 1 / resident[1]):.0%} of bound"
            if "prefetch" in name:
                line += f", prefetched {r['prefetched']:.2f} per token, {r['used']:.2f} used"
            print(line)


if __name__ == "__main__":
    main()
