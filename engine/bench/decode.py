"""Decode throughput per miss policy, at several context depths and numbers of streams decoded
together, measured in one process on the same prompts, beside the physical bound for the miss
pattern each policy produced: bytes over PCIe / B_P and bytes the CPU reads / B_H overlapped,
plus the device-resident bytes (dense weights, experts, KV) / HBM bandwidth. Only decode steps
are timed; the prompts are prefilled before the clock starts."""
from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from dataclasses import asdict, replace

import torch

from engine.config import EngineConfig, SamplingParams
from engine.dist import cache_totals, on_ranks
from engine.loader import rebuild_experts
from engine.moe.cache import CacheStats
from engine.moe.replay import make_routing
from engine.runner import ModelRunner
from engine.scheduler import Scheduler, Sequence


def bench_scheduler(runner: ModelRunner, streams: int = 1) -> Scheduler:
    """The scheduler the bench decodes through: up to `streams` sequences per step, the runner's
    prefill chunk, a prefix tree that keeps the prompts between repeats."""
    return Scheduler(runner, set(), streams, runner.prefill_chunk)


def decode_once(sched: Scheduler, prompts: list[list[int]], tokens: int, prof=None,
                sampling: dict | None = None) -> tuple[float, CacheStats]:
    """Decode len(prompts) sequences together, one token each per step (the batched path of
    `serve --max-running`), for `tokens` steps -> (seconds, cache counters of those steps),
    greedily or with `sampling` (SamplingParams' temperature, top_k, top_p, ...). Only
    decode steps are timed: each prompt is prefilled alone first (into the prefix tree, so a
    repeat prefills only its last partial page), and every stream has its first token before the
    clock starts. A torch.profiler `prof` records the timed steps only."""
    runner = sched.runner
    def until(done) -> None:  # every prompt fits the pool, so a few steps per token suffice
        for _ in range(sum(map(len, prompts)) + 8):
            if done():
                return
            sched.step()
        raise RuntimeError("the bench's prompts did not fit the KV pool: pages were not given back")

    for p in prompts:
        seq = Sequence(p, SamplingParams(max_tokens=1, ignore_eos=True))
        sched.add(seq)
        until(lambda: seq.finish)
    seqs = [Sequence(p, SamplingParams(max_tokens=1 << 30, ignore_eos=True, **(sampling or {}))) for p in prompts]
    for seq in seqs:
        sched.add(seq)
    until(lambda: all(seq.output for seq in seqs))
    sync(runner)
    before = cache_totals(runner)["stats"]  # summed over ranks
    if prof:
        prof.start()
    t0 = time.perf_counter()
    for _ in range(tokens):
        assert len(sched.step()) == len(seqs), "a stream ended inside the timed window: raise the context"
    sync(runner)
    seconds = time.perf_counter() - t0
    if prof:
        prof.stop()
    for seq in seqs:
        sched.abort(seq)
    return seconds, cache_totals(runner)["stats"] - before


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


def decode_runtime(runner: ModelRunner, config: EngineConfig, routing: str, prof: dict) -> None:
    """This rank's expert runtime rebuilt for config (budget, policy, graphs) and `routing`,
    starting from the profile's concurrent bandwidths (rank 0's on every rank, so that rows
    compare alike), q* re-estimated online. Run on every rank (engine.dist.on_ranks)."""
    store = runner.runtime.store
    rt = rebuild_experts(runner, store, config,
                         make_routing(routing, len(store.banks), runner.cfg.num_experts, runner.cfg.router.top_k))
    rt.qstar.use_profile(prof)


def follow_q(runner: ModelRunner, online: bool) -> None:
    runner.runtime.qstar.follow(online)


def random_prompt(runner: ModelRunner, n: int, stream: int = 0) -> list[int]:
    """The same n prompt tokens on every call, distinct per stream."""
    gen = torch.Generator().manual_seed(stream)
    return torch.randint(0, runner.cfg.vocab_size, (n,), generator=gen).tolist()


def measure_policy(runner: ModelRunner, store, config: EngineConfig, routing: str, sched: Scheduler,
                   prompts: list[list[int]], depths: list[int], batches: list[int], tokens: int, repeats: int,
                   prof: dict, modes: list[bool], sampling: dict | None = None) -> list[dict]:
    """A row per (depth, batch, q* mode) of one policy (mode True: q* re-estimated online, False:
    fixed at the profile's). A row of depth d and batch B decodes the first d tokens of the first
    B `prompts`. The rows share one runtime and take turns repeat by repeat, so a drift in the
    host's speed falls on each alike."""
    on_ranks(runner, decode_runtime, config, routing, prof)
    rt = runner.runtime
    est = rt.qstar.estimator
    cases = [(d, b, m) for d in depths for b in batches for m in modes]

    def once(case: tuple[int, int, bool], n: int) -> tuple[float, CacheStats]:
        d, b, online = case
        on_ranks(runner, follow_q, online)
        return decode_once(sched, [p[:d] for p in prompts[:b]], n, sampling=sampling)

    for c in cases:
        once(c, min(tokens, 8))  # warm-up: kernels, graphs, cache contents, the prompts' prefill
    runs, q = {c: [] for c in cases}, {}
    for _ in range(repeats):
        for c in cases:
            runs[c].append(once(c, tokens))
            q[c] = rt.qstar.value
    rows = []
    for (d, b, m), got in runs.items():
        step = statistics.median(t for t, _ in got) / tokens
        total = sum((c for _, c in got), CacheStats())
        per_token = {k: v / (repeats * tokens * b) for k, v in asdict(total).items()}
        rows.append({"policy": config.moe_policy + ("" if m else " (fixed q*)"), "graph": runner.graphs is not None,
                     "depth": d, "batch": b, "tok_s": b / step, "stream_tok_s": 1 / step,
                     "hit_rate": total.hit_rate,
                     **per_token, "q_star": q[d, b, m], "hit_bytes": per_token["hits"] * store.layout.slot_bytes,
                     "kv_bytes": (d + tokens / 2) * kv_token_bytes(runner),
                     **({"b_p_online_gbps": est.b_p / 1e9, "b_h_online_gbps": est.b_h / 1e9} if m else {})})
    return rows


def kv_token_bytes(runner: ModelRunner) -> float:
    """KV bytes of one token of context, over the full-attention layers (what a decode step reads
    per token; sliding-window layers read their window only)."""
    kv = runner.kv
    return kv.bytes / (kv.n_pages * kv.page_size)


def context_for(depths: list[int], batches: list[int], tokens: int, page: int = 16) -> tuple[int, int]:
    """(max_context, kv_tokens) for these rows: the deepest stream with its decoded tokens, and a
    KV pool that keeps every stream's prompt and continuations in the prefix tree (each row's
    prompt is the start of the deepest one)."""
    per_row = tokens + max(batches) + 2 * page
    return max(depths) + per_row, max(batches) * (max(depths) + len(depths) * per_row)


def policy_modes(policies: list[str]) -> list[tuple[str, list[bool]]]:
    """(policy, q* modes) in the listed order; adaptive and adaptive-fixed form one entry."""
    out: dict[str, list[bool]] = {}
    for p in policies:
        out.setdefault(p.removesuffix("-fixed"), []).append(p != "adaptive-fixed")
    return list(out.items())


def bound(row: dict, prof: dict, dense: int, hbm: float, world: int = 1) -> float:
    """Upper bound on tok/s for this row's per-token misses, over a decode step of its `batch`
    streams: when both sides work, the step's missed bytes split ideally between the link and the
    CPU at their concurrent bandwidths (whatever split the policy chose); when one side works,
    that side at its solo bandwidth; either side at least at the rate the row's own steps reached
    (b_p_online_gbps, b_h_online_gbps: a quick profile can come out below it, and a bound the row
    beats bounds nothing). Plus the GPU's own bytes at HBM speed: the dense weights once
    per step; per token its hit and filled experts and its KV. With `world` ranks on one host,
    each has its own link and HBM (the experts' bytes split over them; dense weights and KV are
    every rank's), and they share one socket's B_H."""
    B = row["batch"]
    both = row["bytes_filled"] > 0 and row["bytes_cpu"] > 0
    b_p = world * max(prof["h2d_concurrent_gbps" if both else "h2d_gbps"] or hbm,  # no GPU: a host memcpy
                      row.get("b_p_online_gbps") or 0) * 1e9
    b_h = max(prof["cpu_expert_concurrent_gbps" if both else "cpu_expert_gbps"], row.get("b_h_online_gbps") or 0) * 1e9
    if both:
        misses = B * (row["bytes_filled"] + row["bytes_cpu"]) / (b_p + b_h)
    else:
        misses = B * (row["bytes_filled"] / b_p + row["bytes_cpu"] / b_h)
    device = dense + B * ((row["hit_bytes"] + row["bytes_filled"]) / world + row["kv_bytes"])
    return B / (misses + device / (hbm * 1e9))


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
        routings: list[str], graphs: list[bool | None], tokens: int, repeats: int, depths: list[int],
        batches: list[int], prof: dict, contention: int = 0, say=lambda row: None,
        sampling: dict | None = None) -> list[dict]:
    """One row per (load, graph, routing, budget, policy, depth, batch), all on the same runner and
    prompts (stream i's prompt is the same at every depth, cut to it), each token greedy or drawn
    by `sampling`; say(row) as each is measured."""
    prompts = [random_prompt(runner, max(depths), i) for i in range(max(batches))]
    sched = bench_scheduler(runner, max(batches))
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
            for row in measure_policy(runner, store, cfg, routing, sched, prompts, depths, batches, tokens,
                                      repeats, prof, modes, sampling):
                row["load"] = f"{contention} hog(s)" if load else "none"
                row["routing"] = routing.split("/")[-1]
                row["sampling"] = ",".join(f"{k}={v}" for k, v in (sampling or {}).items()) or "greedy"
                row["budget_gib"] = runner.runtime.cache.n_slots * store.layout.slot_bytes / 2**30
                row["slots"] = runner.runtime.cache.n_slots  # per rank
                row["world_size"] = runner.runtime.store.shard.world
                row["bound_tok_s"] = bound(row, prof, dense, hbm, row["world_size"])
                row["ratio"] = row["tok_s"] / row["bound_tok_s"]
                rows.append(row)
                say(row)
        if load:
            stop.set()
            [p.join() for p in procs]
    if sched.prefix:  # give the prompts' pages back: the next run's scheduler starts from an empty pool
        sched.prefix.evict(sched.prefix.pages)
    return rows
