"""Device-resident expert control for decode: the residency tables live on the device
(engine.moe.tables.DeviceTables), and one MoE layer step runs plan kernel -> fills -> experts ->
CPU branch -> merge with no host sync, so the whole decode step can be captured in a CUDA graph.
q* is device data (one value per layer), changed between steps without recapture. The CPU branch
is signalled through flags in mapped pinned memory that a C++ poller answers: the plan launch
stages the CPU routes' inputs and writes `go`; the fill's last program writes `fill`, against
which the poller times the step's fills (B_P online in graph mode too); the merge kernel waits
for `done` and adds the CPU's partial sum to the routes computed here (a step that leaves no
route to the CPU signals nothing and merges no host part). On the CPU (tests)
the same steps run with the plain torch references, so the buffer logic is exercised without a
GPU."""
from __future__ import annotations

import torch

from engine.moe.layout import expert_bias
from freetoken_kernels import ref


class DeviceControl:
    """Per-step buffers of the device-controlled MoE layer step, sized for T*K <= max_routes."""

    def __init__(self, runtime, max_tokens: int, top_k: int, dtype: torch.dtype = torch.float32):
        rt, dev = runtime, runtime.cache.pool.device
        self.rt, self.dev, self.cuda, self.dtype = rt, dev, dev.type == "cuda", dtype  # dtype: the model's
        n_layers = len(rt.store.banks)
        n = max_tokens * top_k
        i64 = dict(dtype=torch.int64, device=dev)
        self.route, self.victims, self.fetch = (torch.empty(n, **i64) for _ in range(3))
        # (hits, misses, fetched) of the last layer step, then summed since the last collect
        self.counts = torch.zeros(6, **i64)
        self.stats = self.counts[3:]
        self.q = torch.ones(n_layers, dtype=torch.float64, device=dev)  # float64: the host's split rule exactly
        self.q_host = [1.0] * n_layers
        self.poller, self._slots_seen = None, None
        if self.cuda and any(rt.policy.may_cpu(layer) for layer in range(n_layers)):
            self._start_poller(max_tokens, top_k)
        self.set_q()

    def _start_poller(self, max_tokens: int, top_k: int) -> None:
        from engine.errors import UserError
        rt, H = self.rt, self.rt.store.views[0]["down"].shape[1]
        if rt.cpu.backend == "torch":
            raise UserError("CUDA-graph decode with CPU experts needs the C++ CPU executor, which could not be "
                            "built here; install a C++ compiler, or use --no-graph or --moe-policy fetch")
        pin = dict(pin_memory=True)
        self.flags = torch.zeros(3, dtype=torch.int32, **pin)                     # go, done, fill
        self.nfill = torch.zeros(1, dtype=torch.int64, **pin)                     # experts the step fills
        self.x_h = torch.zeros(max_tokens, H, dtype=rt.cpu.act_dtype(rt.store.views[0]["down"]), **pin)
        self.ids_h = torch.full((max_tokens, top_k), -1, dtype=torch.int64, **pin)
        self.w_h = torch.zeros(max_tokens, top_k, dtype=torch.float32, **pin)
        self.out_h = torch.zeros(max_tokens, H, dtype=torch.float32, **pin)
        self.fill_count = torch.zeros(1, dtype=torch.int32, device=self.dev)      # programs of a fill done
        self.poller = rt.cpu.poller(self.flags, self.nfill, self.x_h, self.ids_h, self.w_h, self.out_h,
                                    [v["gate_up"] for v in rt.store.views], [v["down"] for v in rt.store.views],
                                    rt.act, [expert_bias(v) for v in rt.store.views], self.dtype)
        self.replayed = torch.cuda.Event(blocking=True)

    def wait(self) -> None:
        """After a step was launched: with a CPU branch, the host thread sleeps until the step is
        done (a blocking event) instead of the spinning wait of the next read from the device, which
        would take a core from the CPU branch's workers."""
        if self.poller is not None and self.branch:
            self.replayed.record()
            self.replayed.synchronize()

    def set_q(self) -> None:
        """Copy the per-layer decode q at the current q* (the policy's; 1 without a CPU branch) into
        device data (outside any graph). Which layer steps have a CPU branch follows the cache's
        size, looked at again when it changed (an elastic resize, whose graphs are captured again)."""
        rt = self.rt
        if self._slots_seen != rt.cache.n_slots:
            self._slots_seen = rt.cache.n_slots
            self.cpu_layers = [rt.cpu_misses(layer) for layer in range(self.q.numel())]
            self.branch = any(self.cpu_layers)
        policy, q_star = rt.policy, rt.qstar.value
        q = [policy.q(layer, False, q_star) if cpu else 1.0 for layer, cpu in enumerate(self.cpu_layers)]
        if q != self.q_host:
            self.q.copy_(torch.tensor(q, dtype=torch.float64), non_blocking=True)  # (no wait for a step run ahead)
            self.q_host = q

    def collect(self, stats, slot_bytes: int) -> None:
        """Fold the device counters into the host CacheStats (one sync)."""
        hits, misses, fetched = self.stats.tolist()
        self.stats.zero_()
        stats.record(slot_bytes=slot_bytes, hits=hits, misses=misses, fetched=fetched)

    def _plan(self, ids: torch.Tensor, layer: int, route: torch.Tensor, n: int, stage=None) -> None:
        t, E = self.rt.cache.tables, self.rt.cache.n_experts
        if self.cuda:
            from freetoken_kernels.plan_triton import plan
            plan(ids, layer, E, *t.tensors, t.clock, self.q[layer:layer + 1], route, self.victims[:n],
                 self.fetch[:n], self.counts, stage=stage)
            return
        t.clock += 1  # the reference, padded like the kernel's outputs
        r, v, f, hits, misses = ref.plan(ids, layer, E, *t.tensors, int(t.clock), self.q_host[layer])
        route.copy_(r)
        self.victims[:n].fill_(-1)[:len(v)].copy_(v)
        self.fetch[:n].fill_(-1)[:len(f)].copy_(f)
        self.counts[:3].copy_(torch.tensor([hits, misses, len(v)]))
        self.counts[3:] += self.counts[:3]

    def forward(self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """One MoE layer step of a decode batch, no host sync on CUDA."""
        rt = self.rt
        T, K = ids.shape
        n = T * K
        route = self.route[:n].view(T, K)
        may_cpu = self.cpu_layers[layer]
        signals = may_cpu and self.cuda
        go = (layer + 1) | (T << 20)  # this step's value of the CPU branch's flags
        self._plan(ids, layer, route, n, (x.contiguous(), weights.contiguous(), self.x_h, self.ids_h, self.w_h,
                                          self.nfill, self.flags[0:1], self.flags[1:2], go) if signals else None)
        self._fill(layer, n, (self.fill_count, self.flags[2:3], go) if signals else None)
        if self.cuda:  # the merge sums the routes (moe_experts_auto on CUDA) and adds the CPU's part
            from freetoken_kernels.merge_triton import merge_routes
            out = rt.run_cached(x, route, weights, reduce=False)
            if not signals:
                return merge_routes(out, x.dtype)
            return merge_routes(out, x.dtype, self.out_h, self.flags[1:2], self.counts, go)
        out = rt.run_cached(x, route, weights)
        if may_cpu:  # tests: the executor directly, same inputs
            out_h = torch.empty(x.shape, dtype=torch.float32)
            rt.submit_cpu(layer, x, torch.where(route < 0, ids, -1), weights.float(), out_h).wait()
            out = out + out_h
        return out.to(x.dtype)

    def _fill(self, layer: int, n: int, signal=None) -> None:
        base = layer * self.rt.cache.n_experts
        if self.cuda:
            from freetoken_kernels.fill_triton import fill_rows
            fill_rows(self.rt.store.rows, self.rt.cache.pool, self.victims[:n], self.fetch[:n], base, signal=signal)
        else:
            ref.fill_rows(self.rt.store.rows, self.rt.cache.pool, self.victims[:n], self.fetch[:n], base)

    def close(self) -> None:
        if self.poller is not None:
            self.poller.close()
            self.poller = None
