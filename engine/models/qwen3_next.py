"""Qwen3-Next (Qwen3-Next-80B-A3B): a hybrid. `layer_types` says which layers are Gated DeltaNet
linear attention and which gated full attention (q_proj also yields a sigmoid output gate; per-head
q/k norm; partial rotary); every RMSNorm but the DeltaNet output norm scales by (1 + w); MoE with
a sigmoid-gated shared expert. The checkpoint's multi-token-prediction head (mtp.*) is not used."""
import torch

from engine.models.base import LinearAttnSpec, ModelConfig, common, need

RENAMES: list[tuple[str, str]] = []
SKIP = r"^mtp\."


def layer_types(hf: dict) -> tuple[str, ...]:
    n = need(hf, "num_hidden_layers")
    if hf.get("layer_types"):
        return tuple(hf["layer_types"])
    every = hf.get("full_attention_interval") or 4
    return tuple("full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n))


def config(hf: dict, fused_qkvz: bool = True, **overrides):
    spec = LinearAttnSpec(
        num_key_heads=need(hf, "linear_num_key_heads"), num_value_heads=need(hf, "linear_num_value_heads"),
        key_head_dim=need(hf, "linear_key_head_dim"), value_head_dim=need(hf, "linear_value_head_dim"),
        conv_kernel=hf.get("linear_conv_kernel_dim") or 4, fused_qkvz=fused_qkvz)
    fields = dict(qkv_bias=bool(hf.get("attention_bias", False)), o_bias=bool(hf.get("attention_bias", False)),
                  qk_norm="head", shared_expert_size=need(hf, "shared_expert_intermediate_size"),
                  shared_expert_gate=True, layer_types=layer_types(hf), linear_attn=spec,
                  attn_output_gate=bool(hf.get("attn_output_gate", True)), norm_zero_centered=True)
    return common(hf, **{**fields, **overrides})


def transform(cfg: ModelConfig, name: str, t: torch.Tensor) -> torch.Tensor:
    """The DeltaNet projections' rows grouped by key head ([q, k, v, z] per head, [b, a] per head)
    -> q, k, v, z (then b, a) each over all heads, the order engine.layers.linear_attention reads."""
    la = cfg.linear_attn
    r = la.num_value_heads // la.num_key_heads
    if name.endswith(".in_proj_qkvz.weight"):
        sizes = [la.key_head_dim, la.key_head_dim, r * la.value_head_dim, r * la.value_head_dim]
    elif name.endswith(".in_proj_ba.weight"):
        sizes = [r, r]
    else:
        return t
    heads = t.reshape(la.num_key_heads, -1, t.shape[-1]).split(sizes, dim=1)
    return torch.cat([h.reshape(-1, t.shape[-1]) for h in heads])
