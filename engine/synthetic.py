"""Random-weight models of real models' shapes, built in memory (no checkpoint): for benchmarks
of the expert memory on machines without the real weights. A shape is the model's config.json
(the fields that matter), read by its architecture like a real one. Experts are drawn from a small
pool of random experts and copied into every bank, which is fast and moves the same bytes."""
from __future__ import annotations

import torch

from engine.errors import UserError
from engine.models import model_config
from engine.models.base import ModelConfig
from engine.moe.layout import SlotLayout

QWEN3 = dict(model_type="qwen3_moe", num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
             norm_topk_prob=True, vocab_size=151936, rope_theta=1e6, max_position_embeddings=40960)
QWEN35 = dict(model_type="qwen3_5_moe", linear_conv_kernel_dim=4, full_attention_interval=4,
              partial_rotary_factor=0.25, rope_theta=1e6, max_position_embeddings=40960)
SHAPES = {
    "qwen3-30b-a3b": dict(QWEN3, hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                          moe_intermediate_size=768),
    "qwen3-235b-a22b": dict(QWEN3, hidden_size=4096, num_hidden_layers=94, num_attention_heads=64,
                            moe_intermediate_size=1536),
    # 3 dense layers, then MoE: 256 experts of 3 x 7168 x 2048 (21 GiB per layer in bf16)
    "deepseek-v3": dict(model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                        moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
                        num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256, routed_scaling_factor=2.5,
                        kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                        topk_method="noaux_tc", scoring_func="sigmoid", n_group=8, topk_group=4, num_experts_per_tok=8,
                        first_k_dense_replace=3, norm_topk_prob=True, max_position_embeddings=163840,
                        rope_theta=10000, rope_scaling=dict(type="yarn", factor=40, mscale=1.0, mscale_all_dim=1.0,
                                                            beta_fast=32, beta_slow=1,
                                                            original_max_position_embeddings=4096)),
    # 1 dense layer, then MoE: 128 experts of 3 x 4096 x 1408 (4.1 GiB per layer in bf16)
    "glm-4.5-air": dict(model_type="glm4_moe", vocab_size=151552, hidden_size=4096, intermediate_size=10944,
                        moe_intermediate_size=1408, num_hidden_layers=46, num_attention_heads=96, num_key_value_heads=8,
                        head_dim=128, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=False,
                        n_routed_experts=128, n_shared_experts=1, num_experts_per_tok=8, n_group=1, topk_group=1,
                        routed_scaling_factor=1.0, norm_topk_prob=True, first_k_dense_replace=1,
                        rms_norm_eps=1e-5, rope_theta=1e6, max_position_embeddings=131072),
    # no dense layers: 128 experts of 3 x 2880 x 2880 with biases (5.9 GiB per layer in bf16, 1.6 in MXFP4)
    "gpt-oss-120b": dict(model_type="gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880,
                         num_hidden_layers=36, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                         num_local_experts=128, num_experts_per_tok=4, sliding_window=128, attention_bias=True,
                         swiglu_limit=7.0, rms_norm_eps=1e-5, max_position_embeddings=131072, rope_theta=150000,
                         rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                                           truncate=False, original_max_position_embeddings=4096)),
    "tiny": dict(QWEN3, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, vocab_size=512),
    # hybrids: every fourth layer gated full attention, the others Gated DeltaNet
    "qwen3.5-35b-a3b": dict(QWEN35, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                            num_key_value_heads=2, head_dim=256, num_experts=256, num_experts_per_tok=8,
                            moe_intermediate_size=512, shared_expert_intermediate_size=512, vocab_size=248320,
                            linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                            linear_value_head_dim=128, max_position_embeddings=262144),
    "tiny-hybrid": dict(QWEN35, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
                        shared_expert_intermediate_size=32, vocab_size=512, linear_num_key_heads=2,
                        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16),
}


def synthetic_config(shape: str, layers: int | None = None) -> ModelConfig:
    """The shape's config, cut to its first `layers` layers."""
    if shape not in SHAPES:
        raise UserError(f"unknown --synthetic shape {shape!r}; choose {', '.join(SHAPES)}")
    hf = dict(SHAPES[shape], torch_dtype="bfloat16", tie_word_embeddings=False)
    if layers:
        hf["num_hidden_layers"] = layers
    cfg = model_config(hf)
    if not cfg.moe_layer_ids:
        raise UserError(f"--layers {layers} keeps only dense layers of {shape}; raise it")
    return cfg


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


def expert_layout(cfg: ModelConfig, quant: tuple[str, int] | None) -> SlotLayout:
    """The slot layout of the shape's experts: bf16, or quant = (format, group) of freetoken_kernels.quant
    (a group that does not divide a tiny shape's dimensions halves until it does)."""
    from freetoken_kernels.quant import quantize
    H, I = cfg.hidden_size, cfg.moe_intermediate_size
    if quant is None:
        return SlotLayout.for_experts(H, I, torch.bfloat16, cfg.expert_bias)
    fmt, group = quant
    while H % group or I % group:
        group //= 2
    return SlotLayout.for_qweights(fmt, {"gate_up": quantize(fmt, torch.zeros(2 * I, H), group),
                                         "down": quantize(fmt, torch.zeros(H, I), group)}, cfg.expert_bias)


def random_banks(store, dtype: torch.dtype, gen: torch.Generator, distinct: int = 32,
                 progress=None) -> None:
    """Fill the store's rows from a pool of `distinct` random experts (varied per layer), quantized
    when the store's layout is; progress(bytes done, total) after each layer."""
    from freetoken_kernels.quant import QWeight, quantize
    layout = store.layout
    pool = torch.zeros(distinct, layout.slot_bytes, dtype=torch.uint8)
    for v in layout.views(pool).values():
        if isinstance(v, QWeight):
            _, n, k = v.shape
            for e in range(distinct):
                q, sc, z, _ = quantize(v.fmt, torch.randn(n, k, generator=gen) * 0.02, v.block[1])
                for dst, src in ((v.q, q), (v.s, sc), (v.z, z)):
                    if src is not None:
                        dst[e].copy_(src)
        else:
            v.copy_((torch.randn(v.shape, generator=gen) * 0.02).to(dtype))
    for layer, bank in enumerate(store.banks):  # the same expert (layer, e) whichever rank holds it
        owned = store.shard.owned(layer)
        idx = (torch.tensor(owned, dtype=torch.int64) * 7 + layer * 13) % distinct
        torch.index_select(pool, 0, idx, out=bank[:len(owned)])
        if progress:
            progress((layer + 1) * bank.numel(), store.nbytes)
