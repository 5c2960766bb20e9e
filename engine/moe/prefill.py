"""Layer double buffering for long prefill chunks. For the length of a chunk, two layer buffers
of E slots are taken from the coldest cache slots; while layer l computes, a copy stream loads
layer l+1's experts that are not resident into the other buffer, and layer l+1 then reads every
expert from there or from its cache slot. Layers computed this way never touch the cache tables,
so the decode working set survives the prefill.

Whether to stream the next layer follows the bandwidth model: streaming moves all m of its
experts that are not resident, behind the compute, max(m * slot / B_P, c); fetching moves only
those of them that the layer routes to, in the foreground, m' * slot / B_P + c. Stream when the
experts streamed in vain hide behind the compute of one layer, (m - m') * slot / B_P <= c, with
m' estimated from this layer's share of routed experts (mode "adaptive", which needs a B_P
estimate; without one it fetches). A long chunk routes to nearly every expert (m' ~ m), so its
layers stream whenever any expert misses.
c is timed on the compute stream (CUDA events; the host clock on the CPU) from one layer step's
end to the next, less the layer's own transfers (its fills, or its wait for a streamed buffer),
so it is measured for every layer, streamed or not. A decision uses the newest completed
measurement; the first layers of a chunk use the last chunk's, scaled by the chunk's tokens, and
without any measurement a layer is fetched.
"stream" and "routed" force one side (benchmarks, tests).
The buffers are taken at the first streamed layer of a chunk, so a chunk that never streams
leaves the cache alone; the slots of the resident experts a buffered layer reads stay as they
are until it has run, as no layer step plans against the cache in between."""
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
        self.read = [None, None]  # per buffer: an event after the work of its last reader (CUDA)

    @property
    def usable(self) -> bool:
        """Two buffers plus room for one routed layer step must fit in the cache."""
        return self.mode != "routed" and self.rt.cache.n_slots >= 3 * self.E

    def begin(self, tokens: int) -> None:
        self.active, self.ready, self.tokens, self.read = True, {}, tokens, [None, None]
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

    def maybe_prefetch(self, layer: int, ids: torch.Tensor, held: torch.Tensor | None) -> None:
        """After layer-1's step, whose routes were ids [T, K] (local expert ids, -1 elsewhere),
        with held the cache slots of `layer`'s experts (-1: not resident; None: never stream it):
        start streaming `layer` if the bandwidth model says so; then open its compute window."""
        if not self.active:
            return
        if self.cuda:  # the work so far includes layer-1's, the last reader of the other buffer
            self.read[(layer - 1) % 2] = torch.cuda.Event()
            self.read[(layer - 1) % 2].record()
        compute = self._measure()
        est = self.rt.qstar.estimator
        b_p = est.b_p if est else 0.0  # 0: no link estimate, fetch
        if held is not None:
            m = int((held < 0).sum())
            if self.mode == "stream" or (m > 0 and b_p > 0 and self._in_vain(m, ids) * self.rt.store.layout.slot_bytes
                                         / b_p <= compute):
                self._load(layer, held)
        self.start = self._mark()

    def _in_vain(self, m: int, ids: torch.Tensor) -> float:
        """Of m experts not resident, how many a layer routed like ids would not use."""
        flat = ids.flatten()
        routed = int((torch.bincount(flat[flat >= 0], minlength=self.E) > 0).sum())
        return m * (1 - routed / self.E)

    def _load(self, layer: int, held: torch.Tensor) -> None:
        """Copy `layer`'s experts that are not resident (held: their cache slots, -1) into its
        buffer; the layer's slot map points every other expert at its cache slot."""
        c, bank = self.rt.cache, self.rt.store.banks[layer]
        after = self.read[layer % 2]  # the buffer's last reader
        if self.slots is None:  # the coldest slots: queued work may still read them, and their experts leave
            self.slots, after = c.tables.reserve(2 * self.E), None
            held = torch.where(torch.isin(held, torch.tensor(self.slots)), -1, held)
        half = torch.tensor(self.slots[(layer % 2) * self.E:(layer % 2 + 1) * self.E])
        fetch = (held < 0).nonzero().flatten().tolist()
        event = None
        if self.cuda:
            if after is None:
                self.copy_stream.wait_stream(torch.cuda.current_stream())
            else:  # not the current layer's work, which reads the other buffer: the copies overlap it
                self.copy_stream.wait_event(after)
            with torch.cuda.stream(self.copy_stream):
                for e in fetch:
                    c.pool[int(half[e])].copy_(bank[e], non_blocking=True)
                event = torch.cuda.Event()
                event.record()
        else:
            for e in fetch:
                c.pool[int(half[e])].copy_(bank[e])
        c.stats.record(slot_bytes=self.rt.store.layout.slot_bytes, streamed=len(fetch))
        self.ready[layer] = (torch.where(held >= 0, held, half).to(c.pool.device), event)
