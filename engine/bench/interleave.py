"""Decode tok/s of code variants taking turns repeat by repeat in one process, so a drift of the
host's speed falls on each alike (two trees measured one after the other drift apart by up to
~13% on the lent machines, more than a small change is worth). A variant sets module attributes
that the decode path reads when its runtime is built and its graphs captured; each repeat
rebuilds the runtime for the variant, warms it up, then times the decode. For example, with a
switch `FUSED = True` that a candidate adds to engine/layers/attention.py, every expert resident
(model routing) and then 8 GiB on a trace, one load:

  python -m engine.bench.interleave --synthetic qwen3-30b-a3b --budget 60GiB,8GiB \
      --routing model,trace:FILE --variant fused --variant unfused:engine.layers.attention.FUSED=False"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import statistics
import time


from engine.bench.decode import bench_scheduler, decode_once, decode_runtime, random_prompt
from engine.config import EngineConfig, parse_size
from engine.loader import load_synthetic
from engine.profile import load_or_measure


def parse_variant(spec: str) -> tuple[str, list[tuple[object, str, object]]]:
    """'NAME[:module.attr=value,...]' -> (NAME, [(module, attr, value)]); the attributes must exist."""
    name, _, sets = spec.partition(":")
    out = []
    for s in filter(None, sets.split(",")):
        path, _, value = s.partition("=")
        mod, _, attr = path.rpartition(".")
        m = importlib.import_module(mod)
        if not hasattr(m, attr):
            raise SystemExit(f"variant {name!r}: {mod} has no attribute {attr!r}")
        out.append((m, attr, ast.literal_eval(value)))
    return name, out


def run(runner, config: EngineConfig, routing: str, variants: list[tuple[str, list]], tokens: int,
        repeats: int, prof: dict, say=print) -> dict[str, list[float]]:
    """-> {variant: [tok/s per repeat]}; each repeat runs every variant in turn."""
    prompts, sched = [random_prompt(runner, 32)], bench_scheduler(runner)
    defaults = {(m, a): getattr(m, a) for _, sets in variants for m, a, _ in sets}
    runs: dict[str, list[float]] = {name: [] for name, _ in variants}
    for r in range(repeats):
        for name, sets in variants:
            for (m, a), v in defaults.items():
                setattr(m, a, v)
            for m, a, v in sets:
                setattr(m, a, v)
            decode_runtime(runner, config, routing, prof)
            decode_once(sched, prompts, min(tokens, 8))  # warm-up: kernels, cache contents
            seconds, c = decode_once(sched, prompts, tokens)
            runs[name].append(tokens / seconds)
            qs = runner.runtime.qstar
            say(f"repeat {r + 1}, {name}: {runs[name][-1]:.2f} tok/s, hits {c.hit_rate:.1%}, MB per token filled "
                f"{c.bytes_filled / tokens / 1e6:.1f} / CPU {c.bytes_cpu / tokens / 1e6:.1f}, q* "
                f"{qs.value:.3f}" + (f" (B_P {qs.estimator.b_p / 1e9:.1f}, B_H {qs.estimator.b_h / 1e9:.1f} GB/s)"
                                     if qs.estimator else ""))
    for (m, a), v in defaults.items():
        setattr(m, a, v)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--synthetic", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget", default="8GiB", help="a comma list: each budget in turn, one load")
    ap.add_argument("--policy", default="adaptive")
    ap.add_argument("--routing", default="model", help="a comma list, one per budget (or one for all)")
    ap.add_argument("--cpu-threads", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variant", action="append", required=True, help="NAME[:module.attr=value,...]")
    a = ap.parse_args()
    variants = [parse_variant(v) for v in a.variant]
    budgets, routings = a.budget.split(","), a.routing.split(",")
    routings = routings * len(budgets) if len(routings) == 1 else routings
    if len(routings) != len(budgets):
        raise SystemExit("--routing: give one routing, or one per budget")
    t0 = time.time()
    config = EngineConfig(model="synthetic", device=a.device, expert_budget=parse_size(budgets[0]),
                          cpu_threads=a.cpu_threads, max_context=4096, moe_policy=a.policy)
    runner = load_synthetic(config, a.synthetic, a.layers)
    print(f"[{time.time() - t0:.0f} s] loaded", flush=True)
    prof = load_or_measure(a.cpu_threads, say=print)
    for budget, routing in zip(budgets, routings):
        config = dataclasses.replace(config, expert_budget=parse_size(budget))
        runs = run(runner, config, routing, variants, a.tokens, a.repeats, prof,
                   say=lambda m: print(f"[{time.time() - t0:.0f} s] {budget} {routing}: {m}", flush=True))
        base = statistics.median(runs[variants[0][0]])
        for name, tok_s in runs.items():
            med = statistics.median(tok_s)
            print(f"{budget} {routing}, {name}: median {med:.2f} tok/s ({med / base:.3f}x {variants[0][0]}), "
                  f"repeats {', '.join(f'{t:.2f}' for t in tok_s)}", flush=True)


if __name__ == "__main__":
    main()
