"""Decode throughput per miss policy, measured in one process on the same prompt, beside the
physical bound for the miss pattern each policy produced: bytes over PCIe / B_P and bytes the
CPU reads / B_H overlapped, plus the device-resident bytes / HBM bandwidth."""
from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from dataclasses import asdict, replace

import torch

from engine.config import EngineConfig, SamplingParams
from engine.loader import rebuild_experts
from engine.moe.cache import CacheStats
from engine.moe.replay import make_routing
from engine.runner import ModelRunner
from engine.scheduler import Scheduler, Sequence


def decode_once(runner: ModelRunner, prompt: list[int], tokens: int, prof=None) -> tuple[float, CacheStats]:
    """Prefill `prompt`, then time `tokens` decode steps -> (seconds, decode-only cache counters);
    a torch.profiler `prof` records the decode steps only."""
    sched = Scheduler(runner, set(), 1, 4096, prefix_cache=False)  # every repeat prefills from scratch
    seq = Sequence(list(prompt), SamplingParams(max_tokens=tokens + 1, ignore_eos=True))
    sched.add(seq)
    sched.step()  # prefill + first token
    sync(runner)
    runner.runtime.sync_stats()
    st = runner.runtime.cache.stats
    if prof:
        prof.start()
    before, t0 = replace(st), time.perf_counter()
    while not seq.finish:
        sched.step()
    sync(runner)
    seconds = time.perf_counter() - t0
    if prof:
        prof.stop()
    runner.runtime.sync_stats()
    return seconds, st - before


def sync(runner: ModelRunner) -> None:
    if runner.device.type == "cuda":
        torch.cuda.synchronize()


def dense_bytes(runner: ModelRunner) -> int:
    return sum(p.numel() * p.element_size() for n, p in runner.model.named_parameters()
               if "embed_tokens" not in n)


def hbm_gbps(runner: ModelRunner) -> float:
    if runner.device.type != "cuda":
        return 20.0
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * 5 * a.numel() / (time.perf_counter() - t0) / 1e9


def decode_runtime(runner: ModelRunner, store, config: EngineConfig, routing: str, prof: dict):
    """The expert runtime rebuilt for config (budget, policy, graphs) and `routing`, starting from
    the profile's concurrent bandwidths, q* re-estimated online."""
    rt = rebuild_experts(runner, store, config,
                         make_routing(routing, len(store.banks), store.n_experts, runner.cfg.router.top_k))
    rt.qstar.use_profile(prof)
    return rt


def random_prompt(runner: ModelRunner, n: int) -> list[int]:
    """The same n prompt tokens on every call."""
    return torch.randint(0, runner.cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(0)).tolist()


def measure_policy(runner: ModelRunner, store, config: EngineConfig, routing: str, prompt: list[int],
                   tokens: int, repeats: int, prof: dict, modes: list[bool]) -> list[dict]:
    """A row per q* mode of one policy (True: re-estimated online, False: fixed at the profile's).
    Several modes share one runtime and take turns repeat by repeat, so a drift in the host's
    speed falls on each alike."""
    rt = decode_runtime(runner, store, config, routing, prof)
    est = rt.qstar.estimator
    runs, q = {m: [] for m in modes}, {}
    for m in modes:
        rt.qstar.follow(m)
        decode_once(runner, prompt, min(tokens, 8))  # warm-up: kernels, cache contents
    for _ in range(repeats):
        for m in modes:
            rt.qstar.follow(m)
            runs[m].append(decode_once(runner, prompt, tokens))
            q[m] = rt.qstar.value
    rows = []
    for m in modes:
        times, n = [t for t, _ in runs[m]], repeats * tokens
        total = sum((c for _, c in runs[m]), CacheStats())
        d = {k: v / n for k, v in asdict(total).items()}
        rows.append({"policy": config.moe_policy + ("" if m else " (fixed q*)"), "graph": runner.graphs is not None,
                     "tok_s": tokens / statistics.median(times),
                     "hit_rate": total.hit_rate, **d, "q_star": q[m],
                     "hit_bytes": d["hits"] * store.layout.slot_bytes,
                     **({"b_p_online_gbps": est.b_p / 1e9, "b_h_online_gbps": est.b_h / 1e9} if m else {})})
    return rows


def policy_modes(policies: list[str]) -> list[tuple[str, list[bool]]]:
    """(policy, q* modes) in the listed order; adaptive and adaptive-fixed form one entry."""
    out: dict[str, list[bool]] = {}
    for p in policies:
        out.setdefault(p.removesuffix("-fixed"), []).append(p != "adaptive-fixed")
    return list(out.items())


def bound(row: dict, prof: dict, dense: int, hbm: float) -> float:
    """Upper bound on tok/s for this row's per-token misses: when both sides work, the missed
    bytes split ideally between the link and the CPU at their concurrent bandwidths (whatever
    split the policy chose); when one side works, that side at its solo bandwidth. Plus the
    GPU's own bytes at HBM speed."""
    both = row["bytes_filled"] > 0 and row["bytes_cpu"] > 0
    b_p = (prof["h2d_concurrent_gbps" if both else "h2d_gbps"] or hbm) * 1e9  # no GPU: a host memcpy
    b_h = prof["cpu_expert_concurrent_gbps" if both else "cpu_expert_gbps"] * 1e9
    if both:
        misses = (row["bytes_filled"] + row["bytes_cpu"]) / (b_p + b_h)
    else:
        misses = row["bytes_filled"] / b_p + row["bytes_cpu"] / b_h
    return 1.0 / (misses + (dense + row["hit_bytes"] + row["bytes_filled"]) / (hbm * 1e9))


def memory_hog(stop, ready, nbytes: int, parent: int) -> None:
    """A competing program: stream through `nbytes` of RAM (release `ready` once it does) until
    stopped, or until the bench that started it is gone (killed by a time limit, it cannot stop
    its hogs)."""
    import numpy as np
    buf = np.ones(nbytes // 8)
    ready.release()
    while not stop.is_set() and os.getppid() == parent:
        buf.sum()


def run(runner: ModelRunner, store, base: EngineConfig, budgets: list[int | None], policies: list[str],
        routings: list[str], graphs: list[bool | None], tokens: int, repeats: int, prompt_tokens: int,
        prof: dict, contention: int = 0, say=lambda row: None) -> list[dict]:
    """One row per (load, graph, routing, budget, policy), all on the same runner and prompt;
    say(row) as each is measured."""
    prompt = random_prompt(runner, prompt_tokens)
    dense, hbm = dense_bytes(runner), hbm_gbps(runner)
    rows = []
    for load in ([False, True] if contention else [False]):
        if load:
            ctx = mp.get_context("spawn")
            stop, ready = ctx.Event(), ctx.Semaphore(0)
            procs = [ctx.Process(target=memory_hog, args=(stop, ready, 2 << 30, os.getpid()), daemon=True)
                     for _ in range(contention)]
            [p.start() for p in procs]
            for _ in procs:  # every hog streaming before the loaded rows start
                if not ready.acquire(timeout=120):
                    raise RuntimeError("a memory hog did not start within 120 s")
        for graph, routing, budget, (pol, modes) in ((g, r, b, p) for g in graphs for r in routings
                                                     for b in budgets for p in policy_modes(policies)):
            cfg = replace(base, expert_budget=budget, graph=graph, moe_policy=pol)
            for row in measure_policy(runner, store, cfg, routing, prompt, tokens, repeats, prof, modes):
                row["load"] = f"{contention} hog(s)" if load else "none"
                row["routing"] = routing.split("/")[-1]
                row["budget_gib"] = runner.runtime.cache.n_slots * store.layout.slot_bytes / 2**30
                row["slots"] = runner.runtime.cache.n_slots
                row["bound_tok_s"] = bound(row, prof, dense, hbm)
                row["ratio"] = row["tok_s"] / row["bound_tok_s"]
                rows.append(row)
                say(row)
        if load:
            stop.set()
            [p.join() for p in procs]
    return rows
