"""CUDA-graph decode: the whole decode step (attention, router, plan kernel, fills, experts, CPU
branch, merge) captured once per batch size and replayed with the step's inputs copied into
static buffers. Needs device-resident expert control (engine.moe.device_control)."""
from __future__ import annotations

import gc

import torch

from engine.kv.batch import ForwardBatch


class DecodeGraphs:
    def __init__(self, model, kv, max_pages: int, sizes=range(1, 9), states=None):
        dev, n = kv.k.device, max(sizes)
        self.model, self.kv, self.max_pages, self.states = model, kv, max_pages, states
        self.page = kv.alloc(1)[0]  # scratch page for the capture's dummy tokens
        i64 = dict(dtype=torch.int64, device=dev)
        # hybrid models: recurrent-state slots, a scratch slot for the capture
        self.state_scratch = states.alloc() if states else -1
        self.state_slots = torch.full((n,), self.state_scratch, **i64) if states else None
        self.ids, self.pos = torch.zeros(n, **i64), torch.zeros(n, **i64)
        self.slots = torch.full((n,), self.page * kv.page_size, **i64)
        self.table = torch.full((n, max_pages), self.page, dtype=torch.int32, device=dev)
        self.ctx = torch.ones(n, dtype=torch.int32, device=dev)
        self.rows = torch.arange(n, **i64)
        self.graphs, self.out, self.replays = {}, {}, 0
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: compile and autotune outside the capture
            for b in sizes:
                self._forward(b)
        torch.cuda.current_stream().wait_stream(side)
        pool = torch.cuda.graph_pool_handle()
        # a collection during the capture can free pinned or registered host memory of an engine
        # dropped earlier (a synchronising call, which invalidates the capture); other threads'
        # CUDA calls are theirs (thread_local)
        gc.collect()
        gc.disable()
        try:
            for b in sorted(sizes, reverse=True):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool, capture_error_mode="thread_local"):
                    self.out[b] = self._forward(b)
                self.graphs[b] = g
        finally:
            gc.enable()

    def _forward(self, b: int) -> torch.Tensor:
        slots = self.state_slots[:b] if self.states else None
        batch = ForwardBatch(self.ids[:b], self.pos[:b], [1] * b, [1] * b, self.ctx[:b], self.table[:b],
                             self.slots[:b], self.rows[:b], slots)
        return self.model(batch, self.kv)

    def release(self) -> None:
        """Give back the scratch page (and state slot) before the graphs are dropped."""
        self.kv.release([self.page])
        if self.states:
            self.states.release(self.state_scratch)

    def run(self, batch: ForwardBatch) -> torch.Tensor | None:
        """Replay the graph of this decode batch; None when no graph fits it."""
        b, width = len(batch.q_lens), batch.page_table.shape[1]
        if b not in self.graphs or width > self.max_pages or max(batch.q_lens) != 1:
            return None
        self.ids[:b].copy_(batch.input_ids)
        self.pos[:b].copy_(batch.positions)
        self.slots[:b].copy_(batch.slots)
        self.ctx[:b].copy_(batch.ctx_lens_t)
        self.table[:b, :width].copy_(batch.page_table)
        if self.states:
            self.state_slots[:b].copy_(batch.state_slots)
        self.graphs[b].replay()
        self.replays += 1
        return self.out[b]
