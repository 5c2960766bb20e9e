"""Double buffering for long prefill chunks. For the length of a chunk, two buffers of G slots
are taken from the coldest cache slots; while the experts of one buffer compute, a copy stream
loads the next G experts that are not resident into the other. G is a whole layer's E experts
when two layers' buffers and a routed layer step fit in the cache (3E slots); a smaller cache
streams each layer in up to MAX_GROUPS groups of experts (3G slots). A short chunk (at most
SMALL_GROUP_ROUTES routes an expert) whose layers move slower than they compute takes groups of
E / MAX_GROUPS instead of whole layers: two whole-layer buffers evict two layers of cached
experts, which its layers would move again, and its extra passes are cheap. A layer's routes are
computed group by group into one buffer of routes and summed once (every route on exactly one
pass, the experts resident in the cache on the first; the sum has the bits of a single pass).
Layers computed this way never touch the cache tables, so the decode working set survives the
prefill.

Whether to stream the next layer follows the bandwidth model: streaming moves all m of its
experts that are not resident, behind the compute, max(m * slot / B_P, c); fetching moves only
those of them that the layer routes to, in the foreground, m' * slot / B_P + c. Stream when the
experts streamed in vain hide behind the compute of one layer, (m - m') * slot / B_P <= c, with
m' estimated from this layer's share of routed experts (mode "adaptive", which needs a B_P
estimate; without one it fetches). A long chunk routes to nearly every expert (m' ~ m), so its
layers stream whenever any expert misses. A chunk's first layer decides on its own routes, before
its step: streamed, it holds the buffers from the chunk's start, so the second layer's loads run
behind the first layer's compute instead of after it. A chunk of more than SMALL_GROUP_ROUTES
routes an expert decides before its forward instead (ExpertRuntime.before_forward), taking every
expert as routed, so that the first layer's own loads run behind its attention too: a buffer's
first loads wait only for the work queued before the chunk.
Loads decided at a layer's end are queued at the next layer step's start (go), before its wait
for its router: queueing a pass's copies takes the host a millisecond or more, in which the GPU
would otherwise idle once the layer's experts are computed; then it computes the next attention.
Which experts are resident is read once for every layer at the chunk's start (residency), again
only after a layer planned against the cache; a chunk taken to route to every expert needs no
routes on the host for its streamed layers either, so those queue their work without waiting for
the GPU at all.
c is timed on the compute stream (CUDA events; the host clock on the CPU) from one layer step's
end to the next, less the layer's own transfers (its fills, or its waits for streamed buffers),
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
MAX_GROUPS = 8  # passes a streamed layer may take: where compute sets the pace, smaller groups cost more than they hide
# Routes an expert up to which a chunk whose layers move slower than they compute streams whole-layer
# groups as MAX_GROUPS smaller ones. Each pass sorts all of a chunk's routes, so long chunks pay for
# the passes: on the H200 a hybrid's 300-token turns (10 routes an expert) gained 12%, its 16k-token
# chunks (512) lost 17%.
SMALL_GROUP_ROUTES = 64


def group_size(experts: int, slots: int, link_bound: bool = False) -> int:
    """Experts a buffer holds: the largest of experts / k (k = 1..MAX_GROUPS, rounded up) of
    which three fit in `slots` (two buffers and room for a routed layer step); 0: none does.
    link_bound (a short chunk whose layers move slower than they compute): experts / MAX_GROUPS
    where a whole layer would fit, so that the buffers evict fewer of the cache's experts, which
    the layers would move again. (A cache already streaming in groups keeps them: there, smaller
    ones made a 200-token follow-up stream more layers and move 1.5-2.2x the bytes.)"""
    big = next((g for g in (-(-experts // k) for k in range(1, MAX_GROUPS + 1)) if 3 * g <= slots), 0)
    return -(-experts // MAX_GROUPS) if link_bound and big == experts else big


class LayerStreamer:
    def __init__(self, runtime, mode: str = "adaptive"):
        self.rt, self.mode = runtime, mode
        self.E = runtime.cache.n_experts
        self.cuda = runtime.cache.pool.is_cuda
        self.copy_stream = torch.cuda.Stream() if self.cuda else None
        self.active = False                      # a long chunk is running
        self.G = 0                               # experts a buffer holds, set for each chunk
        self.slots: list[int] | None = None      # the 2G reserved slots, taken at the first stream
        self.ready: dict[int, list] = {}         # layer -> its passes: (slot ids [E] on the device, event, buffer)
        self.queue: list[tuple] = []             # passes whose loads wait for their buffer's last reader
        self.loaded = self.used = 0              # passes loaded, passes whose compute is queued
        self.tokens = 0                          # tokens of the running chunk
        self.compute, self.compute_tokens = 0.0, 0  # newest measured layer compute (s), its chunk's tokens
        self.start, self.waits, self.pending = None, [], []  # the open layer window, timed windows
        self.read = [None, None]  # per buffer: an event after the work of its last reader (CUDA)
        self.held: torch.Tensor | None = None  # every layer's experts' cache slots (host), read at the chunk's start
        self.every = False                       # the chunk is taken to route to every expert

    @property
    def usable(self) -> bool:
        """Two buffers plus room for one routed layer step must fit in the cache."""
        return self.mode != "routed" and group_size(self.E, self.rt.cache.n_slots) > 0

    def begin(self, tokens: int, ids: torch.Tensor | None = None) -> None:
        """A long chunk of `tokens` tokens starts: at its first layer, routed like ids [T, K] (on
        the host), or before its first layer's attention (ids None: a chunk of more than
        SMALL_GROUP_ROUTES routes an expert, taken to route to every expert). Its buffers hold the
        smallest groups where the chunk is short and moving a whole layer would take longer than its
        compute (the last measurement, scaled), else the largest that fit (see group_size). The
        first layer streams too where the rule below says so, so that the next layer's loads run
        behind its compute instead of waiting for it (and, decided before the chunk's forward,
        its own loads behind the first attention)."""
        self.active, self.ready, self.tokens, self.held, self.every = True, {}, tokens, None, ids is None
        est, compute = self.rt.qstar.estimator, self.estimate()
        link_bound = bool(est and est.b_p and compute and ids is not None and ids.numel() <= SMALL_GROUP_ROUTES * self.E
                          and self.E * self.rt.store.layout.slot_bytes / est.b_p > compute)
        self.G, self.queue, self.loaded, self.used = group_size(self.E, self.rt.cache.n_slots, link_bound), [], 0, 0
        self.start, self.waits = self._mark(), []
        # the buffers' last readers: the work queued before the chunk (the slots leave the cache now)
        self.read = [self.start] * 2 if self.cuda else [None, None]
        if self.rt.policy.cacheable(0):
            self._decide(0, ids, self.residency(0), compute)

    def residency(self, layer: int, fresh: bool = False) -> torch.Tensor:
        """The cache slots of `layer`'s experts (-1: not resident), from one read of every layer's
        at the chunk's start, or a new one (`fresh`) after a layer step planned against the cache.
        The streamed layers never touch the tables, so between plans nothing else is read (on the
        device tables a read waits for all the queued work)."""
        if fresh or self.held is None:
            self.held = self.rt.cache.tables.resident(0, len(self.rt.store.banks) * self.E)
        return self.held[layer * self.E:(layer + 1) * self.E]

    def go(self) -> None:
        """At a layer step's start, before its wait for its router: queue the loads decided since
        (the host's milliseconds of copy calls then run while the GPU computes the step's attention,
        which is queued, instead of leaving it idle once the previous layer's experts are done)."""
        self._pump()

    def end(self) -> None:
        if self.slots is not None:
            if self.cuda:  # the buffers return to the cache once their last reads are done
                torch.cuda.current_stream().synchronize()
            self.rt.cache.tables.release(self.slots)
        self.active, self.slots, self.ready, self.queue, self.held = False, None, {}, [], None

    def passes(self, layer: int):
        """Yield the slot ids [E] of each pass of a streamed layer (-1: an expert of another pass),
        once its buffer is loaded; once the caller has queued the work that reads a buffer, the
        next load into it is queued."""
        self._pump()  # (a layer decided in its own step)
        for j in range(len(self.ready[layer])):
            slots, event, buf = self.ready[layer][j]  # loaded: the passes before it are queued
            if event is not None:
                with self.transfer():
                    torch.cuda.current_stream().wait_event(event)
            yield slots
            if self.cuda:
                self.read[buf] = torch.cuda.Event()
                self.read[buf].record()
            self.used += 1
            self._pump()
        del self.ready[layer]

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

    def maybe_prefetch(self, layer: int, ids: torch.Tensor | None, held: torch.Tensor | None) -> None:
        """After layer-1's step, whose routes were ids [T, K] (local expert ids, -1 elsewhere; None
        or a chunk begun as routing to every expert: every expert routed), with held the cache
        slots of `layer`'s experts (-1: not resident; None: never stream it): start streaming
        `layer` if the bandwidth model says so; then open its compute window."""
        if not self.active:
            return
        compute = self._measure()
        if held is not None:
            self._decide(layer, None if self.every else ids, held, compute)
        self.start = self._mark()

    def _decide(self, layer: int, ids: torch.Tensor | None, held: torch.Tensor, compute: float) -> None:
        """Stream `layer` (held: its experts' cache slots, -1 not resident) if the experts it
        would move in vain, for routes like ids, take no longer on the link than `compute`."""
        est = self.rt.qstar.estimator
        b_p = est.b_p if est else 0.0  # 0: no link estimate, fetch
        m = int((held < 0).sum())
        if self.mode == "stream" or (m > 0 and b_p > 0 and self._in_vain(m, ids) * self.rt.store.layout.slot_bytes
                                     / b_p <= compute):
            self._load(layer, held)

    def _in_vain(self, m: int, ids: torch.Tensor | None) -> float:
        """Of m experts not resident, how many a layer routed like ids would not use (None: every
        expert routed)."""
        if ids is None:
            return 0.0
        flat = ids.flatten()
        routed = int((torch.bincount(flat[flat >= 0], minlength=self.E) > 0).sum())
        return m * (1 - routed / self.E)

    def _load(self, layer: int, held: torch.Tensor) -> None:
        """Plan the loads of `layer`'s experts that are not resident (held: their cache slots,
        -1), G to a pass (queued by go or the layer's passes); the first pass also reads every
        resident expert from its cache slot."""
        c = self.rt.cache
        if self.slots is None:  # the coldest slots: queued work may still read them, and their experts leave
            self.slots = c.tables.reserve(2 * self.G)  # (the tables forget those experts; the chunk's read too)
            self.held[torch.isin(self.held, torch.tensor(self.slots))] = -1
            held = self.residency(layer)
        fetch = (held < 0).nonzero().flatten().tolist()
        self.ready[layer] = [None] * max(1, -(-len(fetch) // self.G))
        for j in range(len(self.ready[layer])):
            self.queue.append((layer, j, fetch[j * self.G:(j + 1) * self.G],
                               held.clone() if j == 0 else torch.full_like(held, -1)))
        c.stats.record(slot_bytes=self.rt.store.layout.slot_bytes, streamed=len(fetch), passes=len(self.ready[layer]))

    def _pump(self) -> None:
        """Start the queued loads whose buffer's last reader is queued (two passes ahead at most)."""
        c, bank_of = self.rt.cache, self.rt.store.banks
        while self.queue and self.loaded < self.used + 2:
            layer, j, experts, slots = self.queue.pop(0)
            buf, bank = self.loaded % 2, bank_of[layer]
            self.loaded += 1
            dest = self.slots[buf * self.G:buf * self.G + len(experts)]
            event = None
            if self.cuda:
                # not the work queued since, which reads the other buffer (or, at the buffer's
                # first use, no cache slot of the chunk): the copies overlap it
                self.copy_stream.wait_event(self.read[buf])
                with torch.cuda.stream(self.copy_stream):
                    for s, e in zip(dest, experts):
                        c.pool[s].copy_(bank[e], non_blocking=True)
                    event = torch.cuda.Event()
                    event.record()
            else:
                for s, e in zip(dest, experts):
                    c.pool[s].copy_(bank[e])
            slots[experts] = torch.tensor(dest, dtype=slots.dtype)
            if self.cuda:  # pinned and queued: a pageable copy would wait for all the queued compute
                slots = slots.pin_memory().to(c.pool.device, non_blocking=True)
            self.ready[layer][j] = (slots, event, buf)
