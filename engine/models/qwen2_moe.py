"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): q/k/v biases and a shared expert behind a sigmoid gate."""
from engine.models.base import common

RENAMES: list[tuple[str, str]] = []


def config(hf: dict):
    return common(hf, qkv_bias=bool(hf.get("qkv_bias", True)),
                  shared_expert_size=hf["shared_expert_intermediate_size"], shared_expert_gate=True)
