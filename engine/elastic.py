"""Elastic expert memory: the device expert cache resized while the model serves, at a scheduler
safe point (between two steps), without a restart and without dropping requests. A resize is
warm: the most recently used experts that fit are copied into the new pool from the host store
(the source of truth) and keep their order of recency and demand history, so decode goes on
with its working set; on CUDA the decode graphs, which point into the pool and the tables, are
captured again. The budget a user sets (--expert-budget, /budget in the chat, POST
/v1/admin/expert-budget) is a ceiling; with --elastic (on by default with an auto budget on
CUDA) a watcher polls free device memory (NVML) at safe points and shrinks the cache below it
when another program takes memory, and grows it back once the memory is free again.

With experts across ranks (engine.dist) a budget is per GPU and a resize runs on every rank
(engine.dist.on_ranks), each keeping its own hottest experts; an auto budget is each rank's own
free memory. The watcher reads one GPU, so it is off there and --elastic is refused."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import torch

from engine.dist import on_ranks
from engine.errors import UserError
from engine.loader import GiB, capture_graphs, device_reserve, free_memory, release_graphs
from engine.moe.cache import slots_for_budget

log = logging.getLogger("freetoken.elastic")
MARGIN = 512 << 20   # the watcher's dead band over the reserve (bytes): no resize inside it
SETTLE = 2.0         # seconds of surplus free memory before the watcher grows the cache


def size_text(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


def resize_experts(runner, budget: int, max_running: int) -> None:
    """Resize the expert cache to `budget` bytes (at most every expert); call between steps.
    A budget below one layer's experts raises UserError and changes nothing. When the device has
    no room for the pool and the decode graphs' capture beside it (another program may take memory
    while the old pool is freed), the cache gets the size that fits, down to one layer's experts
    (warm), and UserError says so."""
    rt = runner.runtime
    c, store = rt.cache, rt.store
    slot = store.layout.slot_bytes
    slots = min(slots_for_budget(budget, store.layout, store.n_experts), store.nbytes // slot)
    if slots == c.n_slots and store.shard.world == 1:  # ranks all go on: a capture's all-reduces need every rank
        return
    assert not rt.streamer.active, "the expert cache is resized between steps only"
    rt.sync_stats()
    old, graphs, asked, short = c.tables, runner.graphs is not None, slots, False
    t0, before, tries = time.perf_counter(), c.nbytes, 0
    release_graphs(runner)
    while True:
        tries += 1
        try:
            t1 = time.perf_counter()
            c.resize(slots, least=store.n_experts)
            t2 = time.perf_counter()
            if graphs:  # the capture's warm-up needs room beside the pool too
                capture_graphs(runner, max_running)
            t3 = time.perf_counter()
            break
        except torch.cuda.OutOfMemoryError:
            # another program took the memory meanwhile: the size the pool fell back to, else half
            # of it, down to one layer's experts
            release_graphs(runner)
            if slots == store.n_experts or store.shard.world > 1:
                raise  # over ranks a retry of this rank alone would leave the others in the capture's collectives
            short, slots = True, c.n_slots if c.n_slots < slots else max(store.n_experts, slots // 2)
    if c.nbytes >= store.nbytes:
        rt.warm()  # every expert fits: all resident, as at load
    else:
        c.adopt(old, store.rows)
    t4 = time.perf_counter()
    log.info("expert cache %s -> %s in %.2f s (%d tries; the last: pool %.2f s, graphs %.2f s; experts copied %.2f s)",
             size_text(before), size_text(c.nbytes), t4 - t0, tries, t2 - t1, t3 - t2, t4 - t3)
    if short:
        raise UserError(f"the device has no room for {size_text(asked * slot)} of experts; the cache "
                        f"holds {size_text(c.nbytes)}. Free device memory or ask for less")


def auto_budget(runner, reserve: int, free: Callable[[], int] | None = None) -> int:
    """What an auto budget gets now on this rank: every expert on the CPU; on the GPU the cache
    plus the free memory beyond the reserve (free: the watcher's reading, else the driver's)."""
    if runner.device.type == "cpu":
        return runner.runtime.store.nbytes
    return runner.runtime.cache.nbytes + (free() if free else free_memory(runner.device)) - reserve


def cache_size(runner) -> tuple[int, int]:
    """This rank's expert cache: (bytes, slots)."""
    c = runner.runtime.cache
    return c.nbytes, c.n_slots


def resize_rank(runner, budget: int | None, max_running: int, reserve: int,
                free: Callable[[], int] | None = None) -> None:
    """resize_experts on this rank to `budget` bytes, or (None) to what auto_budget gives here."""
    resize_experts(runner, auto_budget(runner, reserve, free) if budget is None else budget, max_running)


class DeviceMemory:
    """Free memory of a CUDA device as the engine can use it, read at a safe point: what NVML
    reports free (the driver's figure where NVML cannot see the device) plus what torch's caching
    allocator holds unused."""

    def __init__(self, device: torch.device):
        import pynvml
        self.device, self.nvml, self.handle = device, pynvml, None
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(device).uuid}")
        except pynvml.NVMLError:
            log.warning("NVML cannot see %s; --elastic reads free memory from the CUDA driver", device)

    def __call__(self) -> int:
        free = (self.nvml.nvmlDeviceGetMemoryInfo(self.handle).free if self.handle is not None
                else torch.cuda.mem_get_info(self.device)[0])
        return free + torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)


class ElasticExperts:
    """The expert budget of a loaded model while it serves: `set_budget` (the user's ceiling;
    None = auto, every expert that free memory allows) and, when watching, the watcher's resizes
    below it. Resizes run at the scheduler's next safe point."""

    def __init__(self, runner, scheduler, budget: int | None, reserve: int):
        self.runner, self.scheduler, self.budget, self.reserve = runner, scheduler, budget, reserve
        self.resizes = 0
        self.free: Callable[[], int] | None = None  # the watcher's source of free device memory
        self.clock, self.margin, self.settle = time.monotonic, MARGIN, SETTLE
        self._surplus_since: float | None = None
        self._stop, self._thread = threading.Event(), None

    @property
    def cache(self):
        return self.runner.runtime.cache

    @property
    def ceiling(self) -> int:
        """The most the cache may hold (bytes): the budget set, or every expert."""
        store = self.runner.runtime.store
        return store.nbytes if self.budget is None else min(self.budget, store.nbytes)

    def set_budget(self, budget: int | None) -> None:
        """A new budget (bytes; None = auto), applied at once. A budget below one layer's
        experts, or one the device has no room for, raises UserError and the budget stays."""
        self.scheduler.safe_point(lambda: self._resize(budget))
        self.budget = budget

    def _resize(self, nbytes: int | None) -> None:
        """Every rank's cache to `nbytes` (None: auto, by each rank's free memory)."""
        before = self.cache.n_slots
        on_ranks(self.runner, resize_rank, nbytes, self.scheduler.max_running, self.reserve, self.free)
        self.resizes += self.cache.n_slots != before

    def poll(self) -> None:
        """One decision of the watcher (at a safe point). Free memory under the reserve shrinks
        the cache by the shortfall (never below one layer); free memory over reserve + margin for
        `settle` seconds grows it back, up to the ceiling. Both aim at reserve + margin / 2 free,
        so one resize does not call for the next."""
        free, now, c = self.free(), self.clock(), self.cache
        aim = self.reserve + self.margin // 2
        slot = c.layout.slot_bytes
        if free < self.reserve:
            self._surplus_since = None
            target = max(c.nbytes - (aim - free), c.n_experts * slot)
        elif free > self.reserve + self.margin and c.nbytes + slot <= self.ceiling:
            self._surplus_since = now if self._surplus_since is None else self._surplus_since
            if now - self._surplus_since < self.settle:
                return
            target = min(c.nbytes + free - aim, self.ceiling)
        else:
            self._surplus_since = None
            return
        if target // slot != c.n_slots:
            log.info("free device memory %.2f GiB: expert cache %.2f -> %.2f GiB", free / GiB, c.nbytes / GiB,
                     target // slot * slot / GiB)
            self._resize(target)

    def watch(self, free: Callable[[], int], interval: float = 0.5) -> None:
        """Poll `free` (bytes of device memory) every `interval` seconds at a safe point, in a
        daemon thread, until close(). The reserve never exceeds what is free at the start: an
        auto budget has just taken the rest."""
        self.free = free
        self.reserve = min(self.reserve, self.scheduler.safe_point(free))
        self._thread = threading.Thread(target=self._watch, args=(interval,), name="freetoken-elastic", daemon=True)
        self._thread.start()

    def _watch(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.scheduler.safe_point(self.poll)
            except UserError as e:  # no room to grow after all: try again at the next poll
                log.warning("%s", e)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def size(self) -> tuple[int, int, int]:
        """The expert cache's bytes and slots summed over ranks, and the number of ranks."""
        sizes = on_ranks(self.runner, cache_size)
        return sum(b for b, _ in sizes), sum(n for _, n in sizes), len(sizes)

    def stats(self) -> dict:
        """The budget (per GPU) and the cache's bytes and slots, summed over ranks."""
        nbytes, slots, _ = self.size()
        return {"expert_budget": self.budget, "expert_cache_bytes": nbytes, "cache_slots": slots,
                "elastic": self.free is not None, "expert_resizes": self.resizes}

    def describe(self) -> str:
        (nbytes, slots, ranks), b = self.size(), self.budget
        return (f"expert cache {size_text(nbytes)} ({slots} experts"
                + (f" over {ranks} ranks" if ranks > 1 else "") + "), budget "
                + ("auto" if b is None else size_text(b)) + (" per GPU" if ranks > 1 else "")
                + (", following free memory" if self.free else ""))


def check_elastic(config, device: torch.device) -> None:
    if config.elastic and device.type != "cuda":
        raise UserError("--elastic follows free GPU memory and needs a CUDA device; drop --elastic or use --device cuda")
    if config.elastic and config.ranks > 1:
        raise UserError("--elastic follows one GPU's free memory and cannot drive several ranks; drop --elastic "
                        "(/budget and POST /v1/admin/expert-budget still resize every rank)")


def elastic_experts(runner, scheduler, config) -> ElasticExperts:
    """The runtime budget of a freshly loaded model; watching free device memory with
    config.elastic (None: on with an auto budget on CUDA and one rank)."""
    e = ElasticExperts(runner, scheduler, config.expert_budget, device_reserve(runner, config.prefill_chunk))
    default = config.expert_budget is None and runner.group is None
    if runner.device.type == "cuda" and (default if config.elastic is None else config.elastic):
        e.watch(DeviceMemory(runner.device))
    return e
