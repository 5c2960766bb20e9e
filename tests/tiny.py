"""Tiny random checkpoints in the real HuggingFace layout, built with transformers' own config
classes; every constant-valued tensor (norm weights, biases) is perturbed so that an engine
that ignores it cannot match."""
from __future__ import annotations

from pathlib import Path

import torch

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            initializer_range=0.08, rms_norm_eps=1e-6)


def demo_vocab() -> int:
    """The embedded demo tokenizer's vocabulary: a tiny model that borrows that tokenizer needs it."""
    import json

    from engine.resolve import DEMO
    return json.loads((DEMO / "config.json").read_text())["vocab_size"]


def hf_config(arch: str, **kw):
    import transformers as tf
    base, moe = {**BASE, **kw}, dict(num_experts_per_tok=2, moe_intermediate_size=32)
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(**base, **moe, num_experts=8, head_dim=16, norm_topk_prob=True)
    if arch == "qwen2_moe":
        return tf.Qwen2MoeConfig(**base, **moe, num_experts=8, shared_expert_intermediate_size=48)
    if arch == "mixtral":
        return tf.MixtralConfig(**{**base, "intermediate_size": 32}, num_local_experts=8, num_experts_per_tok=2)
    if arch == "olmoe":
        return tf.OlmoeConfig(**base, num_experts=8, num_experts_per_tok=2, clip_qkv=4.0)
    mla = {**base, "num_key_value_heads": 4, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
           "v_head_dim": 12, "moe_intermediate_size": 32, "num_experts_per_tok": 3, "first_k_dense_replace": 1}
    yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=128)
    if arch == "deepseek_v3":  # mscale != mscale_all_dim: both the rotary and the softmax scale move
        return tf.DeepseekV3Config(**{**mla, "q_lora_rank": 24, "n_routed_experts": 16, "n_group": 4, "topk_group": 2,
                                      "n_shared_experts": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
                                      "rope_parameters": {**yarn, "mscale": 0.8, "mscale_all_dim": 1.0}, **kw})
    if arch == "deepseek_v2":  # V2-Lite's plain q_proj and mscale, V2's group-limited softmax routing
        return tf.DeepseekV2Config(**{**mla, "num_attention_heads": 8, "num_key_value_heads": 8}, q_lora_rank=None,
                                   n_routed_experts=12, n_group=3, topk_group=2, topk_method="group_limited_greedy",
                                   n_shared_experts=1, routed_scaling_factor=1.5, attention_bias=True,
                                   rope_parameters={**yarn, "mscale": 0.707, "mscale_all_dim": 0.707})
    if arch == "glm4_moe":
        return tf.Glm4MoeConfig(**{**base, "num_attention_heads": 6}, head_dim=16, partial_rotary_factor=0.5,
                                use_qk_norm=True, attention_bias=True, n_routed_experts=8, num_experts_per_tok=2,
                                moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
                                n_group=2, topk_group=1, routed_scaling_factor=1.5)
    hybrid = dict(num_experts=8, head_dim=16, shared_expert_intermediate_size=48, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                  layer_types=["linear_attention", "full_attention", "linear_attention"])
    if arch == "qwen3_next":
        return tf.Qwen3NextConfig(**base, **moe, **hybrid, mlp_only_layers=[2])
    if arch == "qwen3_5_moe":  # the published layout: the vision-language wrapper
        text = {k: v for k, v in base.items() if k != "intermediate_size"}
        vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64)
        return tf.Qwen3_5MoeConfig(text_config=dict(**text, **moe, **hybrid), vision_config=vision)
    if arch == "gpt_oss":  # sliding layers whose window the 64-token prompt crosses; a limit that clamps
        return tf.GptOssConfig(**{**base, "intermediate_size": 32}, head_dim=16, num_local_experts=8,
                               num_experts_per_tok=2, sliding_window=20, swiglu_limit=0.8,
                               rope_parameters={**yarn, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False})
    raise ValueError(arch)


def perturb_(model: torch.nn.Module, seed: int = 0) -> None:
    """Noise on every constant-valued tensor the checkpoint holds (parameters and saved buffers,
    such as DeepSeek's e_score_correction_bias)."""
    g = torch.Generator().manual_seed(seed)
    saved = model.state_dict(keep_vars=True).values()
    buffers = [b for _, b in model.named_buffers() if any(b is t for t in saved)]
    with torch.no_grad():
        for p in [p for _, p in model.named_parameters()] + buffers:
            if p.numel() and (p == p.flatten()[0]).all():
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def torch_delta_rule() -> None:
    """Where flash-linear-attention imports, transformers runs its (CUDA-only) kernels for the
    Gated DeltaNet layers; the reference runs on the CPU, so it gets transformers' own torch
    functions back (the undecorated ones)."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
    from transformers.models.qwen3_next import modeling_qwen3_next
    for module in (modeling_qwen3_next, modeling_qwen3_5_moe):
        for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
            fn = getattr(module, name)
            setattr(module, name, getattr(fn, "__wrapped__", fn))


def build(arch: str, out: Path, fused: bool = False, seed: int = 0, **kw):
    """Save a tiny random `arch` model to `out`; returns the transformers model (fp32, eval)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    cfg = hf_config(arch, **kw)
    cfg.eos_token_id = None
    if arch in ("qwen3_next", "qwen3_5_moe"):
        torch_delta_rule()
    if arch == "qwen3_5_moe":
        from transformers import Qwen3_5MoeForConditionalGeneration
        model = Qwen3_5MoeForConditionalGeneration._from_config(cfg, dtype=torch.float32).eval()
    else:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    if arch == "gpt_oss":  # transformers 5.17 ignores swiglu_limit (its experts clamp at 7.0); 5.24 reads it
        for experts in (layer.mlp.experts for layer in model.model.layers):
            experts.limit = cfg.swiglu_limit
    perturb_(model, seed)
    model.save_pretrained(out, save_original_format=not fused)
    return model
