"""Random-weight models of real models' shapes, built in memory (no checkpoint): for benchmarks
of the expert memory on machines without the real weights. Experts are drawn from a small pool
of random experts and copied into every bank, which is fast and moves the same bytes."""
from __future__ import annotations

import torch

from engine.errors import UserError
from engine.models.base import ModelConfig, RouterSpec

SHAPES = {
    "qwen3-30b-a3b": dict(hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128,
                          num_experts=128, top_k=8, moe_intermediate_size=768, vocab_size=151936),
    "qwen3-235b-a22b": dict(hidden_size=4096, num_layers=94, num_heads=64, num_kv_heads=4, head_dim=128,
                            num_experts=128, top_k=8, moe_intermediate_size=1536, vocab_size=151936),
    "tiny": dict(hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                 num_experts=16, top_k=4, moe_intermediate_size=32, vocab_size=512),
}


def synthetic_config(shape: str, layers: int | None = None) -> ModelConfig:
    if shape not in SHAPES:
        raise UserError(f"unknown --synthetic shape {shape!r}; choose {', '.join(SHAPES)}")
    s = dict(SHAPES[shape])
    n = layers or s.pop("num_layers")
    s.pop("num_layers", None)
    top_k = s.pop("top_k")
    return ModelConfig(model_type="qwen3_moe", num_layers=n, rms_norm_eps=1e-6,
                       rope={"rope_type": "default", "rope_theta": 1e6}, max_position_embeddings=40960,
                       tie_word_embeddings=False, router=RouterSpec(top_k=top_k, norm_topk_prob=True),
                       moe_layers=(True,) * n, qk_norm="head", dtype="bfloat16", **s)


def random_dense(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Norm weights 1, everything else N(0, 0.02): hidden states stay well scaled."""
    for name, p in model.named_parameters():
        data = torch.ones(p.shape) if "norm" in name else torch.randn(p.shape, generator=gen) * 0.02
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
