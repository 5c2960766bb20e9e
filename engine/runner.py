"""The loaded model, ready to run steps: dense weights on the device, the expert runtime (host
store, device cache, miss policy), the paged KV pool (and for hybrid models the recurrent-state
pool) and, on CUDA, the captured decode graphs. engine.loader builds one; the scheduler calls
`forward` once per step (with experts across ranks, rank 0's forward runs the step on every rank:
engine.dist)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.kv.paged import KVPool
from engine.kv.state import StatePool
from engine.models.base import ModelConfig
from engine.models.transformer import CausalLM
from engine.moe.runtime import ExpertRuntime


@dataclass
class ModelRunner:
    cfg: ModelConfig
    model: CausalLM
    kv: KVPool
    runtime: ExpertRuntime | None
    device: torch.device
    path: Path | None
    max_context: int
    graphs: object = None        # engine.graphs.DecodeGraphs when decode runs as CUDA graphs
    prefill_chunk: int = 2048    # tokens per prefill forward (EngineConfig's, or sized at load)
    gemms_warm: bool = False     # the dense GEMMs' kernels loaded (loader.warm_gemms): once a process
    timings: dict[str, float] = field(default_factory=dict)  # seconds per load phase (bench startup)
    states: StatePool | None = None  # recurrent states of hybrid models' linear-attention layers
    group: object = None         # engine.dist.Rank on rank 0 of several ranks, which follow its steps

    def forward(self, batch, kv, wait: bool = True) -> torch.Tensor:
        """One step of the model, on every rank when there are several. wait=False: a graph step
        returns once launched (the caller waits for it its own way)."""
        if self.group is not None:
            return self.group.step(self, batch, kv)
        return self.step(batch, kv, wait)

    def step(self, batch, kv, wait: bool = True) -> torch.Tensor:
        """This rank's step: a captured graph for decode batches when one fits, else eager."""
        self.runtime.before_step()
        out = self.graphs.run(batch) if self.graphs is not None else None
        if out is None:
            self.runtime.before_forward(batch.input_ids.numel(), self.cfg.router.top_k, max(batch.q_lens) > 1)
            return self.model(batch, kv)
        if wait:
            self.runtime.after_graph_step()
        return out
