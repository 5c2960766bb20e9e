"""CUDA-graph decode: the whole decode step (attention, router, plan kernel, fills, experts, CPU
branch, merge) captured per batch size and replayed with the step's inputs copied into static
buffers. Batch sizes 1 and the largest are captured at load; the others on their first step, so
a server pays capture only for the batch sizes its traffic forms. Needs device-resident expert
control (engine.moe.device_control). With experts across ranks (engine.dist) every rank captures
and replays the same sizes at the same steps, and each MoE layer's all-reduce (NCCL) is part of
the graph; the warm-up steps before a capture also create the NCCL communicator, which a capture
cannot."""
from __future__ import annotations

import gc
import time

import torch

from engine.kv.batch import ForwardBatch


class DecodeGraphs:
    def __init__(self, model, kv, max_pages: int, max_batch: int, counters: torch.Tensor, states=None):
        """counters: the device counters that a capture's warm-up steps (dummy tokens) must not move;
        states: the recurrent-state pool of a hybrid model."""
        dev, n = kv.k.device, max_batch
        self.model, self.kv, self.max_pages, self.max_batch, self.counters = model, kv, max_pages, n, counters
        self.states = states
        self.page = kv.alloc(1)[0]  # scratch page for the capture's dummy tokens
        self.state_scratch = states.alloc() if states else -1  # and scratch state slot
        i64 = dict(dtype=torch.int64, device=dev)
        self.ids, self.pos, self.slots = (torch.empty(n, **i64) for _ in range(3))
        self.table = torch.empty((n, max_pages), dtype=torch.int32, device=dev)
        self.sliding = kv.sliding  # its dummy page is the sliding layers' scratch page
        if self.sliding:
            self.sliding_table = torch.empty_like(self.table)
            self.sliding_slots = torch.empty(n, **i64)
        self.ctx = torch.empty(n, dtype=torch.int32, device=dev)
        self.state_slots, self.state_out = (torch.empty(n, **i64) if states else None for _ in range(2))
        self.rows = torch.arange(n, **i64)
        self.graphs, self.out, self.replays = {}, {}, 0
        self.seconds = {"compile": 0.0, "capture": 0.0}  # warm-up steps (torch.compile, Triton JIT), captures
        self.pool = torch.cuda.graph_pool_handle()
        self.capture(sorted({1, n}, reverse=True))

    def capture(self, sizes: list[int]) -> None:
        """Warm up (compile and autotune outside the capture), then capture each batch size, on
        dummy tokens that write only the scratch page."""
        self._dummy_inputs()
        saved = self.counters.clone()
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for b in sizes:
                self._forward(b)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        # a collection during the capture can free pinned or registered host memory of an engine
        # dropped earlier (a synchronising call, which invalidates the capture); other threads'
        # CUDA calls are theirs (thread_local)
        gc.collect()
        gc.disable()
        try:
            for b in sizes:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool, capture_error_mode="thread_local"):
                    self.out[b] = self._forward(b)
                self.graphs[b] = g
        finally:
            gc.enable()
        self.counters.copy_(saved)
        self.seconds["compile"] += t1 - t0
        self.seconds["capture"] += time.perf_counter() - t1

    def _dummy_inputs(self) -> None:
        """Every row a token at position 0 in the scratch page: the last replay's inputs point
        into live sequences' KV, which a warm-up step would overwrite."""
        self.ids.zero_()
        self.pos.zero_()
        self.slots.fill_(self.page * self.kv.page_size)
        self.table.fill_(self.page)
        if self.sliding:
            self.sliding_table.fill_(self.sliding.dummy)
            self.sliding_slots.fill_(self.sliding.dummy * self.kv.page_size)
        self.ctx.fill_(1)
        if self.states:
            self.state_slots.fill_(self.state_scratch)
            self.state_out.fill_(self.state_scratch)

    def _forward(self, b: int) -> torch.Tensor:
        slots, out = (self.state_slots[:b], self.state_out[:b]) if self.states else (None, None)
        sliding = (self.sliding_table[:b], self.sliding_slots[:b]) if self.sliding else (None, None)
        batch = ForwardBatch(self.ids[:b], self.pos[:b], [1] * b, [1] * b, self.ctx[:b], self.table[:b],
                             self.slots[:b], self.rows[:b], slots, (), *sliding, out)
        return self.model(batch, self.kv)

    def release(self) -> None:
        """Give back the scratch page (and state slot) before the graphs are dropped."""
        self.kv.release([self.page])
        if self.states:
            self.states.release(self.state_scratch)

    def run(self, batch: ForwardBatch) -> torch.Tensor | None:
        """Replay the graph of this decode batch (captured now on its first use); None when no
        graph fits it."""
        b, width = len(batch.q_lens), batch.page_table.shape[1]
        if b > self.max_batch or width > self.max_pages or max(batch.q_lens) != 1:
            return None
        if b not in self.graphs:
            self.capture([b])
        self.ids[:b].copy_(batch.input_ids)
        self.pos[:b].copy_(batch.positions)
        self.slots[:b].copy_(batch.slots)
        self.ctx[:b].copy_(batch.ctx_lens_t)
        self.table[:b, :width].copy_(batch.page_table)
        if self.sliding:
            self.sliding_table[:b, :width].copy_(batch.sliding_table)
            self.sliding_slots[:b].copy_(batch.sliding_slots)
        if self.states:
            self.state_slots[:b].copy_(batch.state_slots)
            self.state_out[:b].copy_(batch.state_dst)
        self.graphs[b].replay()
        self.replays += 1
        return self.out[b]
