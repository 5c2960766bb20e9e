"""DeepSeek-V2 / V2-Lite: Multi-head Latent Attention with its compressed KV cache
(engine.layers.mla; q_lora_rank null means a plain q_proj), YaRN with the mscale_all_dim softmax
correction, shared experts, `first_k_dense_replace` dense layers, softmax routing, limited to the
`topk_group` best of `n_group` groups (each ranked by its best expert) under
`topk_method: group_limited_greedy`. DeepSeek rotates interleaved pairs of the rotary dims; the
conversion de-interleaves those rows of q and of the rope key, so the shared rotate-half RoPE
computes the same scores."""
from __future__ import annotations

import torch

from engine.errors import UserError
from engine.layers.rope import yarn_mscale
from engine.models.base import MLASpec, ModelConfig, RouterSpec, common, need, rope_params

RENAMES = [(r"\.mlp\.shared_experts\.", ".mlp.shared_expert.")]


def mla_config(hf: dict, router: RouterSpec, rope_interleave: bool) -> ModelConfig:
    """The config of a DeepSeek MLA model (V2 and V3 differ in routing)."""
    rp = rope_params(hf)
    nope, rope = need(hf, "qk_nope_head_dim"), need(hf, "qk_rope_head_dim")
    scale = (nope + rope) ** -0.5
    if rp["rope_type"] != "default" and rp.get("mscale_all_dim"):
        scale *= yarn_mscale(rp["factor"], rp["mscale_all_dim"]) ** 2
    mla = MLASpec(q_lora_rank=hf.get("q_lora_rank"), kv_lora_rank=need(hf, "kv_lora_rank"),
                  qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=need(hf, "v_head_dim"),
                  softmax_scale=scale)
    heads, bias = need(hf, "num_attention_heads"), bool(hf.get("attention_bias", False))
    return common(hf, head_dim=rope, num_kv_heads=heads, mla=mla, router=router, qkv_bias=bias, o_bias=bias,
                  shared_expert_size=need(hf, "moe_intermediate_size") * (hf.get("n_shared_experts") or 0),
                  extra={"rope_interleave": rope_interleave})


def config(hf: dict) -> ModelConfig:
    method = hf.get("topk_method") or "greedy"
    if method not in ("greedy", "group_limited_greedy"):
        raise UserError(f"deepseek_v2 topk_method {method!r} is not supported; supported: greedy, group_limited_greedy")
    grouped = method == "group_limited_greedy"
    router = RouterSpec(top_k=need(hf, "num_experts_per_tok"), norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
                        scaling=float(hf.get("routed_scaling_factor") or 1.0),
                        n_group=need(hf, "n_group") if grouped else 1,
                        topk_group=need(hf, "topk_group") if grouped else 1, group_score="max")
    return mla_config(hf, router, rope_interleave=True)


def transform(cfg: ModelConfig, name: str, t: torch.Tensor) -> torch.Tensor:
    """De-interleave the rotary rows ((x0, x1), (x2, x3), ... pairs -> the two halves that
    rotate-half pairs up) of each head's query and of the shared rope key."""
    if not cfg.extra.get("rope_interleave"):
        return t
    m = cfg.mla
    r = m.qk_rope_head_dim
    perm = torch.cat((torch.arange(0, r, 2), torch.arange(1, r, 2)))
    if name.endswith((".q_proj.weight", ".q_b_proj.weight")):  # [Hq * (nope + rope), in]
        heads = t.reshape(cfg.num_heads, -1, t.shape[-1]).clone()
        heads[:, -r:] = heads[:, -r:][:, perm]
        return heads.reshape(t.shape)
    if ".kv_a_proj_with_mqa." in name:  # [kv_lora_rank + rope, ...], weight and bias
        t = t.clone()
        t[m.kv_lora_rank:] = t[m.kv_lora_rank:][perm]
    return t
