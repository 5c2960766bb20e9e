"""Time to first token per expert budget and prefill mode (stream, routed, adaptive) for cold
prompts of several lengths and for a short follow-up after a cached prefix, beside the PCIe
streaming bound (every layer's experts moved once per chunk at B_P) and, where one of the budgets
holds every expert, beside that budget's row (the compute floor). Each row is the median of its
repeats (fresh random prompts; a follow-up's repeats extend the same cached prompt); its counters
are per repeat."""
from __future__ import annotations

import statistics
import time
from dataclasses import replace

import torch

from engine.bench.decode import sync
from engine.config import EngineConfig, SamplingParams
from engine.loader import rebuild_experts
from engine.runner import ModelRunner
from engine.scheduler import Scheduler, Sequence


def ttft(runner: ModelRunner, sched: Scheduler, prompt: list[int]) -> float:
    return first_token(runner, sched, Sequence(prompt, SamplingParams(max_tokens=1, ignore_eos=True)))


def first_token(runner: ModelRunner, sched: Scheduler, seq: Sequence) -> float:
    """Seconds from adding `seq` to its first output token."""
    sched.add(seq)
    sync(runner)
    t0 = time.perf_counter()
    while not seq.output:
        sched.step()
    sync(runner)
    return time.perf_counter() - t0


def row(runner: ModelRunner, mode: str, what: str, tokens: int, runs: list[float], before, prof: dict) -> dict:
    d, store = runner.runtime.cache.stats - before, runner.runtime.store
    layer_bytes = store.n_experts * store.layout.slot_bytes
    b_p = (prof["h2d_gbps"] or prof["cpu_expert_gbps"]) * 1e9
    bound = -(-tokens // runner.prefill_chunk) * len(store.banks) * layer_bytes / b_p
    c = runner.runtime.cache
    return {"mode": mode, "prompt": what, "tokens": tokens, "chunk": runner.prefill_chunk,
            "budget_gib": c.n_slots * store.layout.slot_bytes / 2**30,
            "all_resident": c.n_slots >= len(store.banks) * store.n_experts,
            "ttft_s": statistics.median(runs), "ttft_runs": runs, "bound_s": bound,
            "streamed_layers": d.stream_layers // len(runs), "stream_passes": d.stream_passes // len(runs),
            "moved_gib": d.bytes_filled / 2**30 / len(runs),
            "cpu_gib": d.bytes_cpu / 2**30 / len(runs)}


def run(runner: ModelRunner, base: EngineConfig, modes: list[str], lengths: list[int], follow_up: int,
        prof: dict, repeats: int = 1, budgets: list[int | None] | None = None) -> list[dict]:
    """Rows for each budget (default: base's) and mode, in that order; each carries budget_gib,
    all_resident, and of_floor: its TTFT over the same mode and prompt's with every expert
    resident, where a budget of the list holds them all (else None)."""
    rows = []
    for budget in budgets or [base.expert_budget]:
        rows += _rows(runner, replace(base, expert_budget=budget), modes, lengths, follow_up, prof, repeats)
    floor = {(r["mode"], r["prompt"]): r["ttft_s"] for r in rows if r["all_resident"]}
    for r in rows:
        r["of_floor"] = r["ttft_s"] / floor[r["mode"], r["prompt"]] if (r["mode"], r["prompt"]) in floor else None
    return rows


def _rows(runner: ModelRunner, base: EngineConfig, modes: list[str], lengths: list[int], follow_up: int,
          prof: dict, repeats: int) -> list[dict]:
    rows, g = [], torch.Generator().manual_seed(0)  # the same prompts at every budget
    vocab = runner.cfg.vocab_size
    tokens = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()
    for mode in modes:
        cfg = replace(base, prefill_mode=mode)
        rt = rebuild_experts(runner, runner.runtime.store, cfg)
        rt.qstar.use_profile(prof)  # as `run` and `serve` have it
        sched = Scheduler(runner, set(), 1, runner.prefill_chunk)
        ttft(runner, sched, tokens(min(lengths)))  # warm-up
        for n in lengths:
            before, runs = replace(rt.cache.stats), []
            for _ in range(repeats):
                prompt = tokens(n)
                runs.append(ttft(runner, sched, prompt))
            rows.append(row(runner, mode, "cold", n, runs, before, prof))
        if follow_up:  # the last prompt is cached in the prefix tree now
            before = replace(rt.cache.stats)
            runs = [ttft(runner, sched, prompt + tokens(follow_up)) for _ in range(repeats)]
            rows.append(row(runner, mode, f"+{follow_up} after {lengths[-1]}", follow_up, runs, before, prof))
        sched.prefix.evict(runner.kv.n_pages)  # the next mode starts from an empty prefix tree
    return rows
