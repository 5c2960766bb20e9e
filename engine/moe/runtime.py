"""One MoE layer step: plan residency, fill the fetched misses, run the resident routes from the
device cache and the CPU routes from the host store concurrently, and merge exactly (every
(token, expert) route is computed on exactly one side, so the output is the plain sum). The
fills and CPU jobs are timed by engine.moe.qstar, which keeps q* current."""
from __future__ import annotations

import functools
import time
from contextlib import nullcontext

import torch

from engine.moe.cache import ExpertCache
from engine.moe.layout import expert_bias
from engine.moe.policy import MissPolicy
from engine.moe.prefill import SMALL_GROUP_ROUTES, LayerStreamer
from engine.moe.qstar import QStar
from engine.moe.store import HostExpertStore
from freetoken_kernels import ref
from freetoken_kernels.ref import SILU, ExpertAct

# A prefill chunk whose layer step routes at most this many tokens per expert on average runs
# like decode: the CPU stays memory-bound there, so the bandwidth split still applies.
SHORT_ROUTES_PER_EXPERT = 4


class ExpertRuntime:
    def __init__(self, store: HostExpertStore, cache: ExpertCache, policy: MissPolicy,
                 cpu_threads: int | None = None, prefill_mode: str = "adaptive", cpu=None, act: ExpertAct = SILU):
        self.store, self.cache, self.policy = store, cache, policy
        self.cpu_threads, self._cpu = cpu_threads, cpu  # cpu: an executor to reuse (cache rebuilds)
        self.act = act
        self.routing = None      # optional (layer, ids) -> ids (engine.moe.replay): trace, uniform, recorder
        self.qstar = QStar(store, lambda: self.cpu)
        self._experts = ref.moe_experts
        self.device_ctl = None  # engine.moe.device_control.DeviceControl in graph mode
        self._resident = None   # every expert's slot, during a prefill forward that finds all resident
        self._read_ahead = False  # _resident was read before this forward (before_forward)
        self.streamer = LayerStreamer(self, prefill_mode)
        if cache.pool.is_cuda:  # decode-sized batches run the Triton GEMV kernel; a layer step's
            from freetoken_kernels.moe_triton import moe_experts_auto  # routes meet at most E slots
            self._experts = functools.partial(moe_experts_auto, experts=cache.n_experts)

    @property
    def cpu(self):
        """The CPU expert executor, started on first use (fetch-only runs never need it), with
        cpu_threads workers, else the machine profile's count for the experts' format."""
        if self._cpu is None:
            from engine.profile import default_threads
            from freetoken_kernels.cpu_executor import CPUExecutor
            self._cpu = CPUExecutor(self.cpu_threads or default_threads(self.store.layout.dtype))
        return self._cpu

    def cpu_misses(self, layer: int) -> bool:
        """Whether this layer's misses may run on the CPU: as the policy says, unless the cache
        holds every expert (all resident once loaded; a miss before that is fetched), which saves
        graph decode the CPU branch's staging, signals and merge from the host in every step."""
        return self.policy.may_cpu(layer) and not (self.cache.holds_all and self.policy.cacheable(layer))

    def before_step(self) -> None:
        """Between steps (graph mode): fold the poller's timings into q* and publish it to the device."""
        ctl = self.device_ctl
        if ctl is not None:  # (without a CPU branch nothing reaches the poller, and no CPU probe is needed)
            self.qstar.graph_step(ctl.poller if ctl.branch else None)
            ctl.set_q()

    def before_forward(self, tokens: int, top_k: int, prefill: bool) -> None:
        """Before an eager forward of `tokens` tokens: a prefill chunk of more than
        SMALL_GROUP_ROUTES routes an expert, which routes to every expert of a layer, decides now
        to stream its first layer, so that those loads run behind the first layer's attention
        instead of after its router (see engine.moe.prefill). Whether every expert is resident is
        read here too, for the forward's first layer, before any of its work is queued."""
        if not prefill:
            return
        self._resident, self._read_ahead, st = self._resident_slots(), True, self.streamer
        if tokens * top_k > SMALL_GROUP_ROUTES * st.E and not st.active and st.usable and self._resident is None:
            st.begin(tokens)

    def after_graph_step(self) -> None:
        """After a decode graph was replayed: wait for it without spinning where the CPU branch runs."""
        if self.device_ctl is not None:
            self.device_ctl.wait()

    def sync_stats(self) -> None:
        if self.device_ctl is not None:
            self.device_ctl.collect(self.cache.stats, self.store.layout.slot_bytes)

    def close(self) -> None:
        if self.device_ctl is not None:
            self.device_ctl.close()

    def warm(self) -> None:
        """Load whole cacheable layers into the cache, in order, while they fit (all of them when
        the budget holds every expert; the GPU layers of a static policy), each once the store's
        read has reached it (so that, at load, the copies run beside the rest of the read)."""
        c, E = self.cache, self.cache.n_experts
        layers = [i for i in range(len(self.store.banks)) if self.policy.cacheable(i)]
        for n, layer in enumerate(layers[:c.n_slots // E]):
            self.store.wait_bank(layer)
            c.pool[n * E:(n + 1) * E].copy_(self.store.banks[layer])
            c.tables.install_block(n * E, layer * E, E)

    def forward(self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                prefill: bool) -> torch.Tensor:
        """x [T, H]; ids, weights [T, K] from the router -> [T, H] in x's dtype: this rank's
        routes (its shard's experts), summed with the other ranks' (engine.moe.shard)."""
        if self.routing is not None:
            ids = self.routing(layer, ids)
        shard = self.store.shard
        return shard.reduce(self._forward(layer, x, shard.local(layer, ids), weights, prefill))

    def _forward(self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                 prefill: bool) -> torch.Tensor:
        """The routes of ids [T, K] (local ids, -1: another rank's) -> [T, H] in x's dtype."""
        c = self.cache
        if self.device_ctl is not None and not prefill and ids.numel() <= self.device_ctl.route.numel():
            return self.device_ctl.forward(layer, x, ids, weights)
        if prefill and layer == 0:  # a forward's first layer: is every expert resident (for all of it)?
            if not self._read_ahead:  # (a forward not stepped by the runner)
                self._resident = self._resident_slots()
            self._read_ahead = False
        if prefill and self._resident is not None:  # nothing to plan: no wait for the router
            self._count_hits(ids)
            c.stats.record(scan=ids.numel() > SHORT_ROUTES_PER_EXPERT * self.store.shard.n_experts)
            return self.run_cached(x, self._resident[layer * c.n_experts + ids], weights).to(x.dtype)
        st = self.streamer
        if st.active:  # the loads decided at the last layer's end, behind this one's attention
            st.go()
        # A short chunk (an agent's follow-up) is treated like decode: the q* split, fills kept
        # hot. A long one scans nearly every expert: each layer either has its non-resident
        # experts streamed into a prefill buffer or its misses fetched as cold entries, so the
        # decode working set survives it.
        scan = prefill and ids.numel() > SHORT_ROUTES_PER_EXPERT * self.store.shard.n_experts  # the same on every rank
        # a streamed layer of a chunk taken to route to every expert needs no routes on the host
        # (reading them would wait for all the queued work)
        ids_h = None if scan and layer in st.ready and st.every else ids.cpu()
        self.qstar.update()
        if scan:
            c.stats.record(scan=True)
            if layer == 0 and st.usable and not st.active:  # (active: begun before the forward)
                st.begin(ids_h.shape[0], ids_h)
        # a streamed layer plans nothing against the cache: what is next is known already
        if scan and layer in st.ready:
            ahead = self._ahead(layer)
            routes = None
            for slots in st.passes(layer):  # the layer's buffered groups of experts, into one buffer of routes
                routes = self.run_cached(x, torch.where(ids < 0, -1, slots[ids]), weights, reduce=False, routes=routes)
            out = routes.sum(1)
        else:
            out, ahead = self._routed(layer, x, ids_h, weights, scan)
        if scan:
            st.maybe_prefetch(layer + 1, ids_h, ahead)
            if layer == len(self.store.banks) - 1 and st.active:
                st.end()
        return out.to(x.dtype)

    def _resident_slots(self) -> torch.Tensor | None:
        """Every expert's cache slot [L*E] on the device when every expert is resident on one rank
        (and prefill is not made to stream every layer), else None. Then no layer step misses, so
        it stays so for the rest of the forward."""
        c, n = self.cache, len(self.store.banks) * self.cache.n_experts
        if self.store.shard.world > 1 or self.streamer.mode == "stream" or c.n_slots < n or c.tables.owned < n:
            return None
        slots = c.tables.slot_of
        return slots if isinstance(slots, torch.Tensor) else torch.tensor(slots, device=c.pool.device)

    def _count_hits(self, ids: torch.Tensor) -> None:
        """A layer step's distinct experts as hits: on the device's counters in graph mode (no wait),
        else here. (Not torch.bincount: it waits for the device to size its output, every layer.)"""
        seen = torch.zeros(self.cache.n_experts, dtype=torch.int64, device=ids.device)
        seen[ids.flatten()] = 1
        n = seen.sum()
        if self.device_ctl is not None:
            self.device_ctl.stats[0] += n
        else:
            self.cache.stats.record(hits=int(n))

    def _routed(self, layer: int, x: torch.Tensor, ids_h: torch.Tensor, weights: torch.Tensor, scan: bool):
        """Plan against the cache, fill the fetched misses, run the CPU misses concurrently, merge.
        -> (out [T, H] float32, the next layer's residency after the plan (_ahead))."""
        c = self.cache
        q = self.policy.q(layer, scan, self.qstar.value) if self.cpu_misses(layer) else 1.0
        route, victims, fetch, hits, misses = c.tables.plan(ids_h, layer * c.n_experts, q, cold=scan)
        ahead = self._ahead(layer, fresh=True) if scan else None  # read at the plan's sync, before any work is queued
        route = route.view(ids_h.shape)
        cpu_ids = torch.where(route < 0, ids_h, -1)
        n_cpu = misses - len(victims)
        c.stats.record(slot_bytes=self.store.layout.slot_bytes, hits=hits, misses=misses, fetched=len(victims))
        # the CPU branch starts before the fills are queued: x.cpu() would otherwise wait for them
        job = self._submit_cpu(layer, x, cpu_ids, weights, n_cpu) if n_cpu else None
        route_d = route.to(x.device)
        if scan and victims:  # a long chunk: its resident experts compute while the fills run
            timed = self.streamer.transfer if self.streamer.active else nullcontext
            with timed():  # on CUDA only queued here
                done = self._fill(layer, victims, fetch, self.streamer.copy_stream)
            fetched = torch.isin(route_d, torch.tensor(victims, device=x.device))
            out = self.run_cached(x, route_d.masked_fill(fetched, -1), weights)
            with timed():
                if done is not None:
                    torch.cuda.current_stream().wait_event(done)
            out += self.run_cached(x, route_d.masked_fill(~fetched, -1), weights)
        else:
            self._fill(layer, victims, fetch)
            out = self.run_cached(x, route_d, weights)
        if job is not None:
            fut, out_h, t0 = job
            fut.wait()
            self.qstar.cpu_job(n_cpu, fut, t0)
            out += out_h.to(x.device, non_blocking=True)
        return out, ahead

    def _ahead(self, layer: int, fresh: bool = False) -> torch.Tensor | None:
        """The cache slots of layer+1's experts (-1: not resident) for the streamer, if it may
        stream that layer (None: no streamer running, the last layer, or one never cached);
        fresh: read again, after this layer's plan changed the cache."""
        nxt = layer + 1
        if not self.streamer.active or nxt >= len(self.store.banks) or not self.policy.cacheable(nxt):
            return None
        return self.streamer.residency(nxt, fresh)

    def run_cached(self, x: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor, **kw) -> torch.Tensor:
        """The routes of `slots` [T, K] (-1: elsewhere) from the device cache -> [T, H] float32."""
        c = self.cache
        return self._experts(x, c.w["gate_up"], c.w["down"], slots, weights, self.act, c.bias, **kw)

    def submit_cpu(self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, out: torch.Tensor):
        """Start the routes of `ids` [T, K] (-1: elsewhere) of `layer` on the CPU executor, from
        the host store, into out [T, H] float32 (host tensors) -> its future."""
        bank = self.store.views[layer]
        return self.cpu.submit(x, bank["gate_up"], bank["down"], ids, weights, out, self.act, expert_bias(bank))

    def _submit_cpu(self, layer: int, x: torch.Tensor, cpu_ids: torch.Tensor, weights: torch.Tensor, n: int):
        out_h = torch.empty(x.shape, dtype=torch.float32)
        t0 = time.perf_counter()
        fut = self.submit_cpu(layer, x.cpu(), cpu_ids, weights.float().cpu(), out_h)
        return fut, out_h, t0

    def _fill(self, layer: int, victims: list[int], fetch: list[int], stream=None):
        """Copy the fetched experts into their slots, on `stream` if given (after the work queued
        so far, which may still read the victims) -> an event the consumer waits for, or None."""
        if not victims:
            return None
        bank, pool, nbytes = self.store.banks[layer], self.cache.pool, len(victims) * self.store.layout.slot_bytes
        done = None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            with self.qstar.timed_fill(nbytes, pool.is_cuda):
                for s, e in zip(victims, fetch):
                    pool[s].copy_(bank[e], non_blocking=True)
            if stream is not None:
                done = torch.cuda.Event()
                done.record()
        return done
