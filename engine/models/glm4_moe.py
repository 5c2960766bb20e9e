"""GLM-4.5 / 4.6 / 4.7 and GLM-4.5-Air: GQA with q/k/v biases, partial rotary embedding
(`partial_rotary_factor`), optional per-head q/k RMSNorm (`use_qk_norm`), a shared expert,
`first_k_dense_replace` dense layers, and DeepSeek-V3's routing (sigmoid + correction bias,
group-limited top-k, `routed_scaling_factor`)."""
from __future__ import annotations

from engine.models.base import ModelConfig, common, need
from engine.models.deepseek_v3 import RENAMES, noaux_router  # noqa: F401 (the shared-experts rename)


def config(hf: dict) -> ModelConfig:
    return common(hf, qkv_bias=bool(hf.get("attention_bias", False)),
                  qk_norm="head" if hf.get("use_qk_norm") else "none", router=noaux_router(hf),
                  shared_expert_size=need(hf, "moe_intermediate_size") * (hf.get("n_shared_experts") or 0))
