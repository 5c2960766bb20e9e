"""OLMoE: q/k RMSNorm over all heads at once (before the head split), optional q/k/v clipping."""
from engine.models.base import common

RENAMES: list[tuple[str, str]] = []


def config(hf: dict):
    return common(hf, qkv_bias=bool(hf.get("attention_bias", False)), qk_norm="full",
                  clip_qkv=hf.get("clip_qkv"))
