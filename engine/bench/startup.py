"""What a cold start costs, phase by phase: the loader's own timings (the device context, dense
weights, the KV pool, the expert cache and its control, pinning, a short prefill that warms the
prefill path, the decode graphs' warm-up steps (Triton JIT) and captures, the wait for the rest
of the expert read, shown beside the disk's sequential read bound, with the resident experts'
copy beside it, a layer at a time), the machine profile, then two
prefills of distinct prompts of one length: the first request's extra cost is the first minus the second. Beside
them, the Triton kernels compiled in this process (not found in its on-disk cache),
torch.compile's own account (its seconds and its on-disk cache hits and misses; a start after
the first should only hit), and the Python modules compiled from source in this process
(bytecode that could not be cached is recompiled on every start; see engine.config.bytecode_prefix)."""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import torch

from engine.bench.decode import random_prompt
from engine.bench.prefill import ttft
from engine.runner import ModelRunner
from engine.scheduler import Scheduler

def read_speed(path: Path, limit: int = 2 << 30) -> tuple[float, bool]:
    """Sequential read speed (bytes/s) of the disk under `path`, over up to `limit` bytes of its
    largest file -> (bytes/s, direct): with as many requests of the loader's size in flight as
    the loader keeps, each thread into one reused buffer (no page faults: the disk alone), through
    O_DIRECT where the filesystem allows, as the loader reads; else buffered, where the page cache
    may answer instead of the disk."""
    from concurrent.futures import ThreadPoolExecutor
    from ftw import ALIGN, aligned_empty
    from ftw.io import PIECE_BYTES, READ_THREADS
    f = max((p for p in Path(path).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    size = min(limit, f.stat().st_size)
    block = min(PIECE_BYTES, size // ALIGN * ALIGN)
    assert block > 0, f"{f} is too small to time a read"
    own = threading.local()

    def read(offset: int) -> int:
        if not hasattr(own, "buf"):
            own.buf = memoryview(aligned_empty((block,), torch.uint8).numpy())
        return os.preadv(fd, [own.buf], offset)
    try:
        fd, direct = os.open(f, os.O_RDONLY | getattr(os, "O_DIRECT", 0)), hasattr(os, "O_DIRECT")
    except OSError:  # EINVAL: no O_DIRECT on this filesystem
        fd, direct = os.open(f, os.O_RDONLY), False
    offsets = range(0, size // block * block, block)
    try:
        with ThreadPoolExecutor(READ_THREADS) as pool:
            list(pool.map(read, offsets[:READ_THREADS]))  # the buffers' page faults, untimed
            t0 = time.perf_counter()
            list(pool.map(read, offsets))
            return len(offsets) * block / (time.perf_counter() - t0), direct
    finally:
        os.close(fd)


def compiled_from_source(since: float) -> int:
    """Modules imported in this process whose bytecode was compiled now: no cached file, or one
    written after `since` (epoch seconds)."""
    n = 0
    for m in list(sys.modules.values()):
        cached = getattr(m, "__dict__", {}).get("__cached__")  # not getattr: torch.ops answers any name
        if isinstance(cached, str):
            try:
                n += os.stat(cached).st_mtime >= since
            except OSError:
                n += 1
    return n


def triton_compiled(since: float) -> int:
    """Kernels Triton compiled in this process: entries of its cache directory written after
    `since` (epoch seconds); a cache hit writes none."""
    import triton
    d = Path(triton.knobs.cache.dir)
    return sum(p.stat().st_mtime >= since for p in d.iterdir() if p.is_dir()) if d.is_dir() else 0


def compile_account() -> dict:
    """torch.compile's seconds in this process and its on-disk cache hits and misses."""
    if "torch._dynamo" not in sys.modules:  # nothing was compiled (the CPU path runs plain torch)
        return {"torch_compile_s": 0.0, "fx_graph_cache_hit": 0, "fx_graph_cache_miss": 0,
                "autograd_cache_hit": 0, "autograd_cache_miss": 0}
    from torch._dynamo.utils import calculate_time_spent, counters
    return {"torch_compile_s": calculate_time_spent().get("total_wall_time", 0.0),
            "fx_graph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
            "fx_graph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
            **{k: counters["aot_autograd"][k] for k in ("autograd_cache_hit", "autograd_cache_miss")}}


def prefills(runner: ModelRunner, tokens: int) -> tuple[float, float]:
    """Seconds to the first token of two distinct `tokens`-long prompts, one after the other."""
    sched = Scheduler(runner, set(), 1, runner.prefill_chunk)
    first, second = (ttft(runner, sched, random_prompt(runner, tokens, stream)) for stream in (0, 1))
    return first, second


def phases(runner: ModelRunner, import_s: float, load_s: float, profile_s: float) -> dict:
    """Seconds of the start's phases in the order this thread ran them: the imports, the load's
    setup (its load_s seconds less its phases: the engine's imports, the checkpoint's header), the
    loader's phases (its decode graphs' phase split into the warm-up steps, which compile, and the
    rest, the captures), the machine profile."""
    out = {"import": import_s, "setup": max(0.0, load_s - sum(runner.timings.values()))}
    for name, sec in runner.timings.items():
        if name == "graphs":
            compile_s = runner.graphs.seconds["compile"] if runner.graphs is not None else 0.0
            out.update(compile=compile_s, capture=sec - compile_s)
        else:
            out[name] = sec
    out["profile"] = profile_s
    return out


def report(runner: ModelRunner, started: float, imported: float, loaded: float, profile_s: float,
           prompt_tokens: int) -> dict:
    """The phases of a start that began at `started` (epoch seconds, the process's start), had its
    modules imported at `imported`, loaded `runner` by `loaded`, then the profile: ready now; then
    runs the two prefills and, for a checkpoint on disk, times its disk (read_speed: after ready,
    which it is not part of). The experts' read ran on its own thread beside the phases up to
    `wait` (read_s; None for a synthetic model, whose experts are built in phase `build`)."""
    ready = time.time() - started
    first, second = prefills(runner, prompt_tokens)
    disk = read_speed(runner.path) if runner.path else None
    store = runner.runtime.store
    out = {"phases": phases(runner, imported - started, loaded - imported, profile_s), "ready_s": ready,
           "read_s": store.read_seconds, "expert_bytes": store.nbytes,
           "read_gbps": store.nbytes / store.read_seconds / 1e9 if store.read_seconds else None,
           "prompt_tokens": prompt_tokens, "first_prefill_s": first, "second_prefill_s": second,
           "first_request_ratio": first / second, **compile_account(),
           "triton_compiled": triton_compiled(started), "modules_compiled_from_source": compiled_from_source(started),
           "pycache_prefix": sys.pycache_prefix, "dont_write_bytecode": sys.dont_write_bytecode}
    if disk:
        out.update(disk_gbps=disk[0] / 1e9, disk_direct=disk[1], read_bound_s=store.nbytes / disk[0])
    return out
