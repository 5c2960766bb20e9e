"""The decoder-only MoE transformer all supported architectures share. Module names follow the
canonical HF names (after an arch's renames), so checkpoint tensors map onto it by name."""
from __future__ import annotations

import torch
from torch import nn

from engine.kv.batch import ForwardBatch
from engine.layers.attention import Attention, RMSNorm
from engine.layers.linear_attention import GatedDeltaNet
from engine.layers.mla import MLAttention
from engine.layers.mlp import DenseMLP
from engine.layers.rope import Rope
from engine.models.base import ModelConfig
from engine.moe.block import MoEBlock


# parameters made of several checkpoint tensors, concatenated along dim 0
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
         "in_proj_qkvzba": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),   # Qwen3.5
         "in_proj_qkvz_ba": ("in_proj_qkvz", "in_proj_ba")}                          # Qwen3-Next
# kept in float32 whatever the model's dtype, as transformers does: the correction bias ranks
# experts by differences finer than bf16 resolves
FP32 = (".e_score_correction_bias",)


def param_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a parameter (or checkpoint tensor) is stored and used in."""
    return torch.float32 if name.endswith(FP32) else dtype


def checkpoint_names(name: str) -> list[str]:
    """The checkpoint tensors a parameter of this model is read from."""
    for fused, parts in FUSED.items():
        if f".{fused}." in name:
            return [name.replace(fused, p) for p in parts]
    return [name]


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, moe_index: int | None, kv_index: int | None, linear_index: int | None,
                 window: int | None = None):
        """Softmax attention (GQA or MLA) over KV layer kv_index (of the sliding pool when it has a
        window), or (hybrid models) linear attention."""
        super().__init__()
        if linear_index is None:
            self.self_attn = MLAttention(cfg, kv_index) if cfg.mla else Attention(cfg, kv_index, window)
        else:
            self.linear_attn = GatedDeltaNet(cfg, linear_index)
        self.mlp = MoEBlock(cfg, moe_index) if moe_index is not None else \
            DenseMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_zero_centered)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_zero_centered)

    def forward(self, h, delta, batch, kv, cos, sin, prefill: bool):
        """-> (the residual stream, this layer's MLP output, which the next norm adds to it)."""
        h, x = self.input_layernorm.add(h, delta)
        if hasattr(self, "linear_attn"):
            h, x = self.post_attention_layernorm.add(h, self.linear_attn(x, batch))
        else:  # o_proj with the residual add and the norm (one launch at decode on CUDA)
            o = self.self_attn(x, batch, kv, cos, sin, project=False)
            h, x = self.post_attention_layernorm.add_linear(h, o, self.self_attn.o_proj)
        return h, (self.mlp(x, prefill) if isinstance(self.mlp, MoEBlock) else self.mlp(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # built on the meta device to be assigned: a given weight skips the random init, which on
        # the meta device imports torch._dynamo (~900 modules, seconds at every start)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        index = lambda ids: {layer: i for i, layer in enumerate(ids)}  # noqa: E731
        moe, kv, linear = index(cfg.moe_layer_ids), index(cfg.attention_layer_ids), index(cfg.linear_layer_ids)
        kv |= index(cfg.sliding_layer_ids)
        self.layers = nn.ModuleList(DecoderLayer(cfg, moe.get(i), kv.get(i), linear.get(i), cfg.window(i))
                                    for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_zero_centered)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope: Rope | None = None  # built on the device by the loader

    def moe_blocks(self) -> list[MoEBlock]:
        return [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, MoEBlock)]

    def linear_layers(self) -> list[GatedDeltaNet]:
        return [layer.linear_attn for layer in self.model.layers if hasattr(layer, "linear_attn")]

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv) -> torch.Tensor:
        """-> float32 logits [len(batch.logit_rows), V]."""
        h = self.model.embed_tokens(batch.input_ids)
        cos, sin = self.rope.cos_sin(batch.positions, h.dtype)
        prefill = max(batch.q_lens) > 1
        delta = None
        for layer in self.model.layers:
            h, delta = layer(h, delta, batch, kv, cos, sin, prefill)
        _, h = self.model.norm.add(h[batch.logit_rows], delta[batch.logit_rows])
        return self.lm_head(h).float()
