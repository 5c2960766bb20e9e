"""One MoE layer step: plan residency, fill the fetched misses, run the resident routes from the
device cache and the CPU routes from the host store concurrently, and merge exactly (every
(token, expert) route is computed on exactly one side, so the output is the plain sum)."""
from __future__ import annotations

import torch

from engine.moe.cache import ExpertCache
from engine.moe.policy import MissPolicy
from engine.moe.store import HostExpertStore
from kernels import ref


class ExpertRuntime:
    def __init__(self, store: HostExpertStore, cache: ExpertCache, policy: MissPolicy,
                 cpu_threads: int | None = None):
        self.store, self.cache, self.policy = store, cache, policy
        self.cpu_threads, self._cpu = cpu_threads, None
        self.act = "silu"

    @property
    def cpu(self):
        """The CPU expert executor, started on first use (fetch-only runs never need it)."""
        if self._cpu is None:
            from kernels.cpu_executor import CPUExecutor
            self._cpu = CPUExecutor(self.cpu_threads)
        return self._cpu

    def warm_all(self) -> None:
        """Make every cacheable expert resident (the budget holds them all)."""
        c, E = self.cache, self.cache.n_experts
        layers = [i for i in range(len(self.store.banks)) if self.policy.cacheable(i)]
        for n, layer in enumerate(layers):
            slots = torch.arange(n * E, (n + 1) * E)
            c.pool[n * E:(n + 1) * E].copy_(self.store.banks[layer])
            c.slot_of[layer * E:(layer + 1) * E] = slots
            c.owner_of[slots] = torch.arange(layer * E, (layer + 1) * E)

    def forward(self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                prefill: bool) -> torch.Tensor:
        """x [T, H]; ids, weights [T, K] from the router -> [T, H] in x's dtype."""
        c = self.cache
        c.clock += 1
        ids_h = ids.cpu()
        route, victims, fetch, hits, misses = ref.plan(ids_h, layer, c.n_experts, c.slot_of, c.owner_of,
                                         c.last_use, c.seen, c.clock, self.policy.q(layer, prefill))
        self._fill(layer, victims, fetch)
        cpu_ids = torch.where(route < 0, ids_h, -1)
        self._count(hits, misses, misses - len(victims))
        fut = None
        if len(victims) < misses:
            xh, wh = x.cpu(), weights.float().cpu()
            bank = self.store.views[layer]
            out_h = torch.empty(x.shape[0], x.shape[1], dtype=torch.float32)
            fut = self.cpu.submit(xh, bank["gate_up"], bank["down"], cpu_ids, wh, out_h)
        out = ref.moe_experts(x, c.w["gate_up"], c.w["down"], route.to(x.device), weights, self.act)
        if fut is not None:
            fut.wait()
            out += out_h.to(x.device, non_blocking=True)
        return out.to(x.dtype)

    def _fill(self, layer: int, victims: torch.Tensor, fetch: torch.Tensor) -> None:
        bank, pool = self.store.banks[layer], self.cache.pool
        for s, e in zip(victims.tolist(), fetch.tolist()):
            pool[s].copy_(bank[e], non_blocking=True)
        self.cache.stats.fetched += len(victims)
        self.cache.stats.bytes_filled += len(victims) * self.store.layout.slot_bytes

    def _count(self, hits: int, misses: int, n_cpu: int) -> None:
        st = self.cache.stats
        st.hits += hits
        st.misses += misses
        st.cpu += n_cpu
        st.bytes_cpu += n_cpu * self.store.layout.slot_bytes
