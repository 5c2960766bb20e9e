"""The MoE block of a decoder layer: router weights (dense, on the device), an optional shared
expert, and the routed experts, which live in the expert runtime rather than in this module."""
from __future__ import annotations

import torch
from torch import nn

from engine.layers.mlp import DenseMLP
from engine.models.base import ModelConfig
from engine.moe.router import route


class MoEBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, moe_index: int):
        super().__init__()
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.spec, self.moe_index = cfg.router, moe_index
        if cfg.shared_expert_size:
            self.shared_expert = DenseMLP(cfg.hidden_size, cfg.shared_expert_size)
            if cfg.shared_expert_gate:
                self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)
        self.runtime = None  # set by the loader: engine.moe.runtime.ExpertRuntime

    def forward(self, x: torch.Tensor, prefill: bool) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.spec)
        out = self.runtime.forward(self.moe_index, x, ids, weights, prefill)
        if hasattr(self, "shared_expert"):
            shared = self.shared_expert(x)
            if hasattr(self, "shared_expert_gate"):
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out
