"""DeepSeek-V3 / R1 and Kimi-K2: DeepSeek-V2's Multi-head Latent Attention (see deepseek_v2) with
V3's routing (`noaux_tc`): sigmoid scores plus `e_score_correction_bias` for the choice only, limited
to the `topk_group` best of `n_group` groups (each ranked by the sum of its two best biased
scores), weights from the unbiased scores, renormalised (`norm_topk_prob`) and scaled by
`routed_scaling_factor`. `rope_interleave` (default true) says whether the rotary rows need the
de-interleaving."""
from __future__ import annotations

from engine.models.base import ModelConfig, RouterSpec, need
from engine.models.deepseek_v2 import RENAMES, mla_config, transform  # noqa: F401 (the arch's interface)


def noaux_router(hf: dict) -> RouterSpec:
    """Sigmoid + correction bias + group-limited top-k (DeepSeek-V3, GLM-4.5)."""
    return RouterSpec(top_k=need(hf, "num_experts_per_tok"), scoring=hf.get("scoring_func") or "sigmoid",
                      norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
                      scaling=float(hf.get("routed_scaling_factor") or 1.0), bias=True,
                      n_group=hf.get("n_group") or 1, topk_group=hf.get("topk_group") or 1, group_score="top2")


def config(hf: dict) -> ModelConfig:
    return mla_config(hf, noaux_router(hf), rope_interleave=bool(hf.get("rope_interleave", True)))
