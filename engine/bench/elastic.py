"""Elastic expert memory on a GPU shared with another program (CUDA only). Decode runs without
pause while a second process takes --other-gib of device memory in 1 GiB steps (retrying while
the device is full, as a program waiting for memory does), holds it for --hold seconds and frees
it. --gpu-gib makes the device look that big (this process holds the rest from the start), so
that the auto budget fills it. One JSON row per --every seconds: tok/s and the expert hit rate
over the row, the cache's size, free memory as the watcher sees it and what the other process
holds; then a summary row: tok/s before, while the memory is held and after, how long the other
process took to get its memory, and any out-of-memory error. Bounded: the other process gives
up after --take-limit seconds, the whole run ends after baseline + take limit + hold + recover
and a minute for the other process to start.

    python3 -m engine.bench.elastic --layers 16 --gpu-gib 32 --other-gib 20
"""
from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import statistics
import time
from dataclasses import replace

import torch

GiB = 2**30
START_S = 60.0  # the other process's start (spawn, torch import, CUDA context), at most


def hog(gib: int, hold: float, limit: float, events) -> None:
    """The other program: take `gib` GiB in 1 GiB steps (retrying on OOM for up to `limit`
    seconds), hold them `hold` seconds, free them."""
    import torch
    torch.cuda.init()
    chunks, t0 = [], time.time()
    events.put(("started", 0, 0))
    while len(chunks) < gib and time.time() - t0 < limit:
        try:
            chunks.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
            events.put(("held", len(chunks), time.time() - t0))
        except torch.cuda.OutOfMemoryError:
            time.sleep(0.05)
    events.put(("got", len(chunks), time.time() - t0))
    time.sleep(hold)
    chunks.clear()
    torch.cuda.empty_cache()
    events.put(("released", 0, time.time() - t0))


def build(a):
    """The synthetic model, its expert runtime for the routing, a scheduler and the watcher."""
    from engine.config import EngineConfig
    from engine.elastic import elastic_experts
    from engine.loader import load_synthetic, rebuild_experts
    from engine.moe.replay import make_routing
    from engine.profile import load_or_measure
    from engine.scheduler import Scheduler
    config = EngineConfig(model="synthetic", device="cuda", cpu_threads=a.cpu_threads, max_context=a.max_context,
                          elastic=True)
    runner = load_synthetic(config, a.shape, a.layers)
    store = runner.runtime.store
    rt = rebuild_experts(runner, store, config, make_routing(a.routing, len(store.banks), runner.cfg.num_experts,
                                                             runner.cfg.router.top_k))
    rt.qstar.use_profile(load_or_measure(a.cpu_threads))
    sched = Scheduler(runner, set(), 1, runner.prefill_chunk, prefix_cache=False)
    return runner, sched, elastic_experts(runner, sched, config)


def run(a) -> list[dict]:
    from engine.config import SamplingParams
    from engine.scheduler import Sequence
    total = torch.cuda.mem_get_info()[1]
    ballast = torch.empty(max(0, total - a.gpu_gib * GiB), dtype=torch.uint8, device="cuda") if a.gpu_gib else None
    runner, sched, elastic = build(a)
    rt = runner.runtime
    prompt = torch.randint(0, runner.cfg.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    ctx = mp.get_context("spawn")
    events, other = ctx.Queue(), None
    state = {"phase": "before", "other_gib": 0, "got_s": None, "released": None, "error": None}
    rows, seq, t0 = [], None, time.time()
    end = t0 + a.baseline + START_S + a.take_limit + a.hold + a.recover
    tokens, mark, before = 0, t0, replace(rt.cache.stats)
    try:
        while time.time() < end and state["phase"] != "done":
            if seq is None or seq.finish:
                seq = Sequence(prompt, SamplingParams(max_tokens=runner.max_context - len(prompt) - 1, ignore_eos=True))
                sched.add(seq)
            tokens += len(sched.step())
            now = time.time()
            if other is None and now - t0 >= a.baseline:
                other = ctx.Process(target=hog, args=(a.other_gib, a.hold, a.take_limit, events), daemon=True)
                other.start()
                state["phase"] = "taking"
            if now - mark >= a.every:
                _events(events, state, now, a.recover)
                rt.sync_stats()
                d = rt.cache.stats - before
                rows.append({"t": round(now - t0, 2), "phase": state["phase"], "tok_s": tokens / (now - mark),
                             "hit_rate": d.hit_rate, "cache_gib": rt.cache.nbytes / GiB,
                             "cache_slots": rt.cache.n_slots, "free_gib": elastic.free() / GiB,
                             "other_gib": state["other_gib"], "resizes": elastic.resizes})
                print(json.dumps(rows[-1]), flush=True)
                tokens, mark, before = 0, now, replace(rt.cache.stats)
    except torch.cuda.OutOfMemoryError as e:
        state["error"] = f"engine out of memory: {e}"
    finally:
        elastic.close()
        if other is not None:
            other.join(a.hold + a.take_limit)
    del ballast
    rows.append(summary(rows, state, a))
    print(json.dumps(rows[-1]), flush=True)
    return rows


def _events(events, state: dict, now: float, recover: float) -> None:
    """Fold the other process's reports into the phase: taking -> holding -> after -> done."""
    while not events.empty():
        kind, gib, seconds = events.get()
        if kind == "held":
            state["other_gib"] = gib
        elif kind == "got":
            state["phase"], state["got_s"], state["other_gib"] = "holding", seconds, gib
        elif kind == "released":
            state["phase"], state["other_gib"], state["released"] = "after", 0, now
    if state["phase"] == "after" and now - state["released"] >= recover:
        state["phase"] = "done"


def summary(rows: list[dict], state: dict, a) -> dict:
    def median(phase: str, tail: float = 1.0) -> float | None:
        r = [x["tok_s"] for x in rows if x["phase"] == phase]
        r = r[int(len(r) * (1 - tail)):]
        return statistics.median(r) if r else None
    held = max((r["other_gib"] for r in rows), default=0)
    return {"summary": True, "other_gib_wanted": a.other_gib, "other_gib_got": held, "other_take_s": state["got_s"],
            "tok_s_before": median("before", 0.7), "tok_s_holding": median("holding"),
            "tok_s_after": median("after", 0.5), "cache_gib_min": min((r["cache_gib"] for r in rows), default=None),
            "cache_gib_max": max((r["cache_gib"] for r in rows), default=None),
            "resizes": rows[-1]["resizes"] if rows else 0, "error": state["error"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen3-30b-a3b")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--gpu-gib", type=int, default=32, help="device size to emulate (0: the whole device)")
    p.add_argument("--other-gib", type=int, default=20, help="memory the other program takes")
    p.add_argument("--routing", default="uniform", help="model | uniform | trace:FILE")
    p.add_argument("--cpu-threads", type=int, default=8)
    p.add_argument("--max-context", type=int, default=4096)
    p.add_argument("--baseline", type=float, default=10.0, help="seconds before the other program starts")
    p.add_argument("--take-limit", type=float, default=60.0, help="seconds the other program tries to get its memory")
    p.add_argument("--hold", type=float, default=20.0, help="seconds it holds the memory")
    p.add_argument("--recover", type=float, default=20.0, help="seconds measured after it frees the memory")
    p.add_argument("--every", type=float, default=1.0, help="seconds per row")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0f ms %(name)s: %(message)s")
    run(a)


if __name__ == "__main__":
    main()
