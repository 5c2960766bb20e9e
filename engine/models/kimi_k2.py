"""Kimi-K2 (Instruct, Thinking): the DeepSeek-V3 architecture under its own model_type, so that
engines can tell it apart; 384 experts, 64 heads, no expert groups."""
from engine.models.deepseek_v3 import RENAMES, config, transform  # noqa: F401 (the arch's interface)
