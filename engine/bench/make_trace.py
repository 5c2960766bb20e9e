"""Write a synthetic routing trace with tunable expert locality, for `--routing trace:FILE` when
no recorded trace of the real model is at hand (record one with `freetoken run --record-trace`).

Per layer, experts have a Zipf popularity (exponent --zipf over a random permutation); at each
token, each of the previous token's K experts is kept with probability --reuse, and the rest
are drawn by popularity without replacement. --zipf 0 --reuse 0 is uniform routing."""
from __future__ import annotations

import argparse

import numpy as np


def make_trace(tokens: int, layers: int, experts: int, k: int, zipf: float, reuse: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    trace = np.zeros((tokens, layers, k), dtype=np.int16)
    for layer in range(layers):
        pop = 1.0 / np.arange(1, experts + 1) ** zipf
        pop = pop[rng.permutation(experts)]
        prev = rng.choice(experts, k, replace=False, p=pop / pop.sum())
        for t in range(tokens):
            keep = prev[rng.random(k) < reuse]
            p = pop.copy()
            p[keep] = 0
            fresh = rng.choice(experts, k - len(keep), replace=False, p=p / p.sum())
            prev = np.concatenate([keep, fresh])
            trace[t, layer] = prev
    return trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--zipf", type=float, default=0.8)
    ap.add_argument("--reuse", type=float, default=0.35)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    np.save(a.out, make_trace(a.tokens, a.layers, a.experts, a.k, a.zipf, a.reuse, a.seed))


if __name__ == "__main__":
    main()
