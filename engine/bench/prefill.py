"""Time to first token per prefill mode (stream, routed, adaptive) for cold prompts of several
lengths and for a short follow-up after a cached prefix, beside the PCIe streaming bound: every
layer's experts moved once per chunk at B_P. Each row is the median of its repeats (fresh random
prompts; a follow-up's repeats extend the same cached prompt); its counters are per repeat."""
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
    return {"mode": mode, "prompt": what, "tokens": tokens, "chunk": runner.prefill_chunk,
            "ttft_s": statistics.median(runs), "ttft_runs": runs, "bound_s": bound,
            "streamed_layers": d.stream_layers // len(runs), "moved_gib": d.bytes_filled / 2**30 / len(runs),
            "cpu_gib": d.bytes_cpu / 2**30 / len(runs)}


def run(runner: ModelRunner, base: EngineConfig, modes: list[str], lengths: list[int], follow_up: int,
        prof: dict, repeats: int = 1) -> list[dict]:
    rows, g = [], torch.Generator().manual_seed(0)
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
