"""Full-layer double buffering for long prefill chunks. For the length of a chunk, two
whole-layer buffers are taken from the coldest cache slots; while layer l computes from one, a
copy stream loads all of layer l+1's experts into the other. Layers computed from a buffer never
touch the cache tables, so the decode working set survives the prefill.

Whether to stream the next layer follows the bandwidth model: streaming moves all E experts but
behind the compute, max(E * slot / B_P, c); fetching moves only the m routed experts that are not
resident, in the foreground, m * slot / B_P + c. Stream when (E - m) * slot / B_P <= c, the
compute time of one layer (mode "adaptive", which needs a B_P estimate; without one it fetches).
c is measured between these decisions (the host waits for every layer's routing and transfers),
less the layer's own fetches; a window that waited for a streamed layer is not used.
"stream" and "routed" force one side (benchmarks, tests).
The buffers are taken at the first streamed layer of a chunk, so a chunk that never streams
leaves the cache alone."""
from __future__ import annotations

import time

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
        self.t_last, self.compute = 0.0, 0.0     # last decision's time, one layer's compute (s)

    @property
    def usable(self) -> bool:
        """Two buffers plus room for one routed layer step must fit in the cache."""
        return self.mode != "routed" and self.rt.cache.n_slots >= 3 * self.E

    def begin(self) -> None:
        self.active, self.ready, self.t_last = True, {}, time.perf_counter()

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
            torch.cuda.current_stream().wait_event(event)
        return slots

    def maybe_prefetch(self, layer: int, missing: int, streamed: bool) -> None:
        """After layer-1's step (`streamed` from a buffer, else its `missing` experts fetched):
        start streaming `layer` if the bandwidth model says so. The host waited for layer-1's
        routing and its own transfers, so the time since the last call is one layer's compute
        plus those transfers; a streamed layer's window (its stream wait) is not used."""
        now = time.perf_counter()
        b_p = self.rt.estimator.b_p if self.rt.estimator else 0.0  # 0: no link estimate, fetch
        slot_bytes = self.rt.store.layout.slot_bytes
        if b_p > 0 and not streamed:
            self.compute = max(0.0, now - self.t_last - missing * slot_bytes / b_p)
        self.t_last = now
        if not self.active or layer >= len(self.rt.store.banks):
            return
        if self.mode == "stream" or missing and b_p > 0 and (self.E - missing) * slot_bytes / b_p <= self.compute:
            self._load(layer)

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
        c.stats.stream_layers += 1
        c.stats.bytes_filled += self.E * self.rt.store.layout.slot_bytes
        self.ready[layer] = (torch.tensor(half, device=c.pool.device), event)
