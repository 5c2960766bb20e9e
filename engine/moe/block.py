"""The MoE block of a decoder layer: router weights (dense, on the device), an optional shared
expert, and the routed experts, which live in the expert runtime rather than in this module."""
from __future__ import annotations

import torch
from torch import nn

from engine.layers.fuse import one_token
from engine.layers.mlp import DenseMLP
from engine.models.base import ModelConfig
from engine.moe.router import route


class MoEBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, moe_index: int):
        super().__init__()
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=cfg.router_bias)
        if cfg.router.bias:  # the checkpoint's name: mlp.gate.e_score_correction_bias [E], kept in float32
            self.gate.e_score_correction_bias = nn.Parameter(torch.empty(cfg.num_experts), requires_grad=False)
        self.spec, self.moe_index = cfg.router, moe_index
        if cfg.shared_expert_size:
            self.shared_expert = DenseMLP(cfg.hidden_size, cfg.shared_expert_size)
            if cfg.shared_expert_gate:
                self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)
        self.runtime = None  # set by the loader: engine.moe.runtime.ExpertRuntime

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (weights [T, K], expert ids [T, K]); one token on CUDA in one launch with the
        router's linear layer (freetoken_kernels.router_triton.route_linear)."""
        bias = getattr(self.gate, "e_score_correction_bias", None)
        if one_token(x, self.gate):
            from freetoken_kernels.router_triton import route_linear
            s = self.spec
            return route_linear(x, self.gate.weight, self.gate.bias, s.top_k, s.scoring, s.norm_topk_prob,
                                s.scaling, bias, s.n_group, s.topk_group, s.group_score)
        return route(self.gate(x), self.spec, bias)

    def forward(self, x: torch.Tensor, prefill: bool) -> torch.Tensor:
        weights, ids = self.route(x)
        out = self.runtime.forward(self.moe_index, x, ids, weights, prefill)
        if hasattr(self, "shared_expert"):
            shared = self.shared_expert(x)
            if hasattr(self, "shared_expert_gate"):
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out
