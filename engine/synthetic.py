"""Random-weight models of real models' shapes, built in memory (no checkpoint): for benchmarks
of the expert memory on machines without the real weights. Experts are drawn from a small pool
of random experts and copied into every bank, which is fast and moves the same bytes."""
from __future__ import annotations

import torch

from engine.errors import UserError
from engine.models.base import LinearAttnSpec, ModelConfig, RouterSpec

SHAPES = {
    "qwen3-30b-a3b": dict(hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128,
                          num_experts=128, top_k=8, moe_intermediate_size=768, vocab_size=151936),
    "qwen3-235b-a22b": dict(hidden_size=4096, num_layers=94, num_heads=64, num_kv_heads=4, head_dim=128,
                            num_experts=128, top_k=8, moe_intermediate_size=1536, vocab_size=151936),
    "tiny": dict(hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                 num_experts=16, top_k=4, moe_intermediate_size=32, vocab_size=512),
    # hybrids: every fourth layer gated full attention, the others Gated DeltaNet
    "qwen3.5-35b-a3b": dict(hidden_size=2048, num_layers=40, num_heads=16, num_kv_heads=2, head_dim=256,
                            num_experts=256, top_k=8, moe_intermediate_size=512, vocab_size=248320,
                            linear=LinearAttnSpec(16, 32, 128, 128, 4), shared_expert_size=512),
    "tiny-hybrid": dict(hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                        num_experts=16, top_k=4, moe_intermediate_size=32, vocab_size=512,
                        linear=LinearAttnSpec(2, 4, 16, 16, 4), shared_expert_size=32),
}


def synthetic_config(shape: str, layers: int | None = None) -> ModelConfig:
    if shape not in SHAPES:
        raise UserError(f"unknown --synthetic shape {shape!r}; choose {', '.join(SHAPES)}")
    s = dict(SHAPES[shape])
    n = layers or s.pop("num_layers")
    s.pop("num_layers", None)
    top_k, linear = s.pop("top_k"), s.pop("linear", None)
    rope = {"rope_type": "default", "rope_theta": 1e6}
    if linear:
        s.update(model_type="qwen3_5_moe", linear_attn=linear, attn_output_gate=True, norm_zero_centered=True,
                 shared_expert_gate=True, layer_types=tuple("full_attention" if (i + 1) % 4 == 0 else
                                                            "linear_attention" for i in range(n)))
        rope["partial_rotary_factor"] = 0.25
    return ModelConfig(**{"model_type": "qwen3_moe", **s}, num_layers=n, rms_norm_eps=1e-6, rope=rope,
                       max_position_embeddings=40960, tie_word_embeddings=False,
                       router=RouterSpec(top_k=top_k, norm_topk_prob=True), moe_layers=(True,) * n,
                       qk_norm="head", dtype="bfloat16")


def random_dense(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Norms scale by 1 (weight 0 for (1 + w) norms), everything else N(0, 0.02): hidden states stay
    well scaled."""
    centered = model.cfg.norm_zero_centered
    for name, p in model.named_parameters():
        if "norm" in name:
            data = torch.zeros(p.shape) if centered and "linear_attn.norm" not in name else torch.ones(p.shape)
        else:
            data = torch.randn(p.shape, generator=gen) * 0.02
        p.data.copy_(data.to(p.dtype))


def random_banks(store, dtype: torch.dtype, gen: torch.Generator, distinct: int = 32,
                 progress=None) -> None:
    """Fill the store's rows from a pool of `distinct` random experts (varied per layer);
    progress(bytes done, total) after each layer."""
    layout = store.layout
    pool = torch.zeros(distinct, layout.slot_bytes, dtype=torch.uint8)
    for v in layout.views(pool).values():
        v.copy_((torch.randn(v.shape, generator=gen) * 0.02).to(dtype))
    for layer, bank in enumerate(store.banks):
        idx = (torch.arange(bank.shape[0]) * 7 + layer * 13) % distinct
        torch.index_select(pool, 0, idx, out=bank)
        if progress:
            progress((layer + 1) * bank.numel(), store.nbytes)
