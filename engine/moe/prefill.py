"""Full-layer double buffering for long prefill chunks. For the length of a chunk, two
whole-layer buffers are taken from the coldest cache slots; while layer l computes from one, a
copy stream loads all of layer l+1's experts into the other. Layers computed from a buffer never
touch the cache tables, so the decode working set survives the prefill.

Whether to stream the next layer follows the bandwidth model: streaming moves all E experts but
behind the compute, max(E * slot / B_P, c); fetching moves only the m routed experts that are not
resident, in the foreground, m * slot / B_P + c. Stream when (E - m) * slot / B_P <= c, the
compute time of one layer (mode "adaptive", which needs a B_P estimate; without one it fetches).
c is timed on the compute stream (CUDA events; the host clock on the CPU) from one layer step's
end to the next, less the layer's own transfers (its fills, or its wait for a streamed buffer),
so it is measured for every layer, streamed or not. A decision uses the newest completed
measurement; the first layers of a chunk use the last chunk's, scaled by the chunk's tokens, and
without any measurement a layer is fetched.
"stream" and "routed" force one side (benchmarks, tests).
The buffers are taken at the first streamed layer of a chunk, so a chunk that never streams
leaves the cache alone."""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch

PREFILL_MODES = ("adaptive", "stream", "routed")


class LayerStreamer:
    def __init__(self, runtime, mode: str = "adaptive"):
        self.rt, self.mode = runtime, mode
        self.E = runtime.cache.n_experts
        self.cuda = runtime.cache.pool.is_cuda
        self.copy_stream = torch.cuda.Stream() if self.cuda else None
        self.active = False                      # a long chunk is running
        self.slots: list[int] | None = None      # the 2E reserved slots, taken at the first stream
        self.ready: dict[int, tuple] = {}        # layer -> (slot ids [E] on the device, event)
        self.tokens = 0                          # tokens of the running chunk
        self.compute, self.compute_tokens = 0.0, 0  # newest measured layer compute (s), its chunk's tokens
        self.start, self.waits, self.pending = None, [], []  # the open layer window, timed windows

    @property
    def usable(self) -> bool:
        """Two buffers plus room for one routed layer step must fit in the cache."""
        return self.mode != "routed" and self.rt.cache.n_slots >= 3 * self.E

    def begin(self, tokens: int) -> None:
        self.active, self.ready, self.tokens = True, {}, tokens
        self.start, self.waits = self._mark(), []

    def end(self) -> None:
        if self.slots is not None:
            if self.cuda:  # the buffers return to the cache once their last reads are done
                torch.cuda.current_stream().synchronize()
            self.rt.cache.tables.release(self.slots)
        self.active, self.slots, self.ready = False, None, {}

    def take(self, layer: int) -> torch.Tensor | None:
        """Slot ids [E] holding this layer's experts, if it was streamed."""
        if layer not in self.ready:
            return None
        slots, event = self.ready.pop(layer)
        if event is not None:
            with self.transfer():
                torch.cuda.current_stream().wait_event(event)
        return slots

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    @contextmanager
    def transfer(self):
        """Time a layer's own transfer, which is not compute."""
        a = self._mark()
        yield
        self.waits.append((a, self._mark()))

    def _measure(self) -> float:
        """Close the layer window, fold in the newest completed ones -> this chunk's compute (s)."""
        end = self._mark()
        if self.start is not None:
            self.pending.append((self.start, end, self.waits, self.tokens))
        self.waits = []
        done = [w for w in self.pending if not self.cuda or w[1].query()]
        if done:
            a, b, waits, self.compute_tokens = done[-1]
            self.compute = max(0.0, self._seconds(a, b) - sum(self._seconds(x, y) for x, y in waits))
            self.pending = self.pending[len(done):]  # events complete in stream order
        return self.estimate()

    def estimate(self) -> float:
        """One layer's compute for this chunk: the newest measurement scaled by tokens (0: none)."""
        return self.compute * self.tokens / self.compute_tokens if self.compute_tokens else 0.0

    def maybe_prefetch(self, layer: int, missing: int) -> None:
        """After layer-1's step (its `missing` experts were not resident): start streaming `layer`
        if the bandwidth model says so (missing < 0: never, `layer` is not cacheable); then open
        `layer`'s compute window."""
        if not self.active:
            return
        compute = self._measure()
        est = self.rt.qstar.estimator
        b_p = est.b_p if est else 0.0  # 0: no link estimate, fetch
        if layer < len(self.rt.store.banks) and (self.mode == "stream" and missing >= 0 or (
                missing > 0 and b_p > 0 and (self.E - missing) * self.rt.store.layout.slot_bytes / b_p <= compute)):
            self._load(layer)
        self.start = self._mark()

    def _load(self, layer: int) -> None:
        c, bank = self.rt.cache, self.rt.store.banks[layer]
        if self.slots is None:
            self.slots = c.tables.reserve(2 * self.E)
        half = self.slots[(layer % 2) * self.E:(layer % 2 + 1) * self.E]
        event = None
        if self.cuda:
            self.copy_stream.wait_stream(torch.cuda.current_stream())  # the buffer's last reader is queued there
            with torch.cuda.stream(self.copy_stream):
                for s, e in zip(half, range(self.E)):
                    c.pool[s].copy_(bank[e], non_blocking=True)
                event = torch.cuda.Event()
                event.record()
        else:
            for s, e in zip(half, range(self.E)):
                c.pool[s].copy_(bank[e])
        c.stats.record(slot_bytes=self.rt.store.layout.slot_bytes, streamed=self.E)
        self.ready[layer] = (torch.tensor(half, device=c.pool.device), event)
