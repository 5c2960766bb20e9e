"""gpt-oss (gpt-oss-20b, gpt-oss-120b): attention with a learned per-head sink logit in every
softmax, sliding-window layers alternating with full ones (`layer_types`, `sliding_window`),
biases on q/k/v/o, a router with a bias whose top-k logits are softmaxed (the weights of a
softmax over all experts renormalised over the top k), routed experts with biases and the
clamped SwiGLU (`swiglu_alpha`, `swiglu_limit`, and (up + 1)), YaRN RoPE, no dense layers.

Its fused expert tensors interleave the gate and up features (even rows gate, odd rows up), and
the float ones are stored transposed: gate_up_proj [E, H, 2I], down_proj [E, I, H]; the MXFP4
ones are [E, 2I, H / 32, 16] and [E, H, I / 32, 16] (engine.formats.mxfp4). `transform` brings
both into the shared layout (gate_up [E, 2I, H] gate rows first, down [E, H, I])."""
from __future__ import annotations

import torch

from engine.models.base import ModelConfig, RouterSpec, common, need
from freetoken_kernels.ref import ExpertAct

RENAMES = [(r"\.mlp\.router\.", ".mlp.gate.")]


def config(hf: dict) -> ModelConfig:
    n_layers = need(hf, "num_hidden_layers")
    types = hf.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
    bias = bool(hf.get("attention_bias", True))
    act = ExpertAct(alpha=float(hf.get("swiglu_alpha") or 1.702), limit=float(hf.get("swiglu_limit") or 7.0),
                    shift=1.0)
    return common(hf, qkv_bias=bias, o_bias=bias, layer_types=tuple(types), attention_sinks=True,
                  router=RouterSpec(top_k=need(hf, "num_experts_per_tok"), norm_topk_prob=True), router_bias=True,
                  expert_bias=True, expert_act=act, moe_intermediate_size=need(hf, "intermediate_size"),
                  intermediate_size=0)


def _gate_first(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Interleaved gate/up features along `dim` -> the gate features, then the up features."""
    dim %= t.dim()
    return t.unflatten(dim, (-1, 2)).transpose(dim, dim + 1).flatten(dim, dim + 1).contiguous()


def transform(cfg: ModelConfig, name: str, t):
    """Fused expert tensors (a float tensor, or QParts of MXFP4) -> the shared layout."""
    if name.endswith(".experts.gate_up_proj_bias"):
        return _gate_first(t, -1)
    if name.endswith(".experts.gate_up_proj"):
        if isinstance(t, tuple):  # QParts: codes and scales [E, 2I, .], rows interleaved
            q, s, z, block = t
            return _gate_first(q, -2), _gate_first(s, -2), z, block
        return _gate_first(t.transpose(-1, -2), -2)
    if name.endswith(".experts.down_proj") and not isinstance(t, tuple):
        return t.transpose(-1, -2)
    return t
