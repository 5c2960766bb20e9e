"""What whole-expert splits cost against the ideal split, on a routing trace. Replays the trace
through the engine's host residency tables (the plan rule of the GPU kernel: LRU, the q* split,
the recurring-miss rule) and prices every layer step's misses at given bandwidths: the engine's
split, max(F·s / B_P, (M − F)·s / B_H + the executor's cost per job), beside the ideal split of
the same misses, M·s / (B_P + B_H), the bound's. No GPU and no weights needed.
Usage: python3 -m engine.bench.split_model TRACE B_P_GBPS B_H_GBPS [JOB_US] [GiB ...]"""
from __future__ import annotations

import sys

import numpy as np

from engine.moe.tables import HostTables

EXPERT_BYTES = 9437184  # Qwen3-30B-A3B, bf16


def price(trace: np.ndarray, slots: int, experts: int, b_p: float, b_h: float, job_s: float = 0.0,
          expert_bytes: int = EXPERT_BYTES, warm_tokens: int = 64) -> dict:
    """trace [tokens, layers, K] -> per-token hit rate, misses and miss seconds (split, ideal),
    counted after `warm_tokens`; the cache starts with whole layers resident, as the engine's."""
    tokens, layers, _ = trace.shape
    t = HostTables(slots, layers * experts, layers)
    for n in range(min(layers, slots // experts)):
        t.install_block(n * experts, n * experts, experts)
    q, tp, th = b_p / (b_p + b_h), expert_bytes / b_p, expert_bytes / b_h
    hits = misses = fetched = split = ideal = 0.0
    for tok in range(tokens):
        for layer in range(layers):
            _, victims, _, h, m = t.plan([trace[tok, layer].tolist()], layer * experts, q)
            if tok < warm_tokens:
                continue
            f = len(victims)
            split += max(f * tp, (m - f) * th + (job_s if m > f else 0.0))
            ideal += m * expert_bytes / (b_p + b_h)
            hits, misses, fetched = hits + h, misses + m, fetched + f
    n = tokens - warm_tokens
    return {"hit_rate": hits / max(1.0, hits + misses), "fetched": fetched / n, "cpu": (misses - fetched) / n,
            "split_s": split / n, "ideal_s": ideal / n}


def main(argv: list[str]) -> None:
    trace = np.load(argv[0])
    b_p, b_h = float(argv[1]) * 1e9, float(argv[2]) * 1e9
    job_s = float(argv[3]) * 1e-6 if len(argv) > 3 else 25e-6
    for gib in [float(g) for g in argv[4:]] or [4.0, 8.0, 16.0]:
        r = price(trace, int(gib * 2**30) // EXPERT_BYTES, 128, b_p, b_h, job_s)
        print(f"{gib:g} GiB: hit rate {r['hit_rate']:.1%}, fetched {r['fetched']:.1f} / CPU {r['cpu']:.1f} per token, "
              f"miss time {r['split_s'] * 1e3:.2f} ms (ideal split {r['ideal_s'] * 1e3:.2f} ms, "
              f"{r['ideal_s'] / r['split_s']:.1%})")


if __name__ == "__main__":
    main(sys.argv[1:])
