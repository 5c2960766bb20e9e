"""Tiny random checkpoints in the real HuggingFace layout, built with transformers' own config
classes; every constant-valued tensor (norm weights, biases) is perturbed so that an engine
that ignores it cannot match."""
from __future__ import annotations

from pathlib import Path

import torch

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            initializer_range=0.08, rms_norm_eps=1e-6)


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
    hybrid = dict(num_experts=8, head_dim=16, shared_expert_intermediate_size=48, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                  layer_types=["linear_attention", "full_attention", "linear_attention"])
    if arch == "qwen3_next":
        return tf.Qwen3NextConfig(**base, **moe, **hybrid, mlp_only_layers=[2])
    if arch == "qwen3_5_moe":  # the published layout: the vision-language wrapper
        text = {k: v for k, v in base.items() if k != "intermediate_size"}
        vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64)
        return tf.Qwen3_5MoeConfig(text_config=dict(**text, **moe, **hybrid), vision_config=vision)
    raise ValueError(arch)


def perturb_(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.numel() and (p == p.flatten()[0]).all():
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def build(arch: str, out: Path, fused: bool = False, seed: int = 0, **kw):
    """Save a tiny random `arch` model to `out`; returns the transformers model (fp32, eval)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    cfg = hf_config(arch, **kw)
    cfg.eos_token_id = None
    if arch == "qwen3_5_moe":
        from transformers import Qwen3_5MoeForConditionalGeneration
        model = Qwen3_5MoeForConditionalGeneration._from_config(cfg, dtype=torch.float32).eval()
    else:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    perturb_(model, seed)
    model.save_pretrained(out, save_original_format=not fused)
    return model
