"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder): per-head q/k RMSNorm, softmax top-k."""
from engine.models.base import common

RENAMES: list[tuple[str, str]] = []


def config(hf: dict):
    return common(hf, qkv_bias=bool(hf.get("attention_bias", False)),
                  o_bias=bool(hf.get("attention_bias", False)), qk_norm="head")
