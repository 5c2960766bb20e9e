"""Architecture registry: one module per HF `model_type`, each exposing `config(hf) -> ModelConfig`,
`RENAMES` (regex renames from checkpoint names to the canonical names the engine uses),
optionally `SKIP` (a regex of checkpoint tensors the engine does not use, e.g. a vision tower)
and, where its checkpoint tensors need rearranging for the shared layers, `transform(cfg, name, t)`."""
from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from types import ModuleType

import torch

from engine.errors import UserError
from engine.models.base import ModelConfig

ARCHS = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe",
         "qwen3_next", "qwen3_5_moe", "gpt_oss")
ALIASES = {"qwen3_5_moe_text": "qwen3_5_moe"}  # the text-only class of the same architecture


def arch_module(model_type: str | None) -> ModuleType:
    model_type = ALIASES.get(model_type, model_type)
    if model_type not in ARCHS:
        raise UserError(f"model_type {model_type!r} is not supported; supported: {', '.join(ARCHS)}")
    return importlib.import_module(f"engine.models.{model_type}")


def read_hf_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    try:
        hf = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{model_dir} has no config.json; point at a HuggingFace model directory") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON ({e}); re-download the model") from None
    return hf


def model_config(hf: dict) -> ModelConfig:
    return arch_module(hf.get("model_type")).config(hf)


def skipped(model_type: str, name: str) -> bool:
    """Whether the checkpoint tensor `name` belongs to a part the engine does not run."""
    pattern = getattr(arch_module(model_type), "SKIP", None)
    return bool(pattern and re.search(pattern, name))


def canonical_name(model_type: str, name: str) -> str:
    for pattern, repl in arch_module(model_type).RENAMES:
        name = re.sub(pattern, repl, name)
    return name


def arch_tensor(cfg: ModelConfig, name: str, t):
    """A checkpoint tensor (canonical name; a float tensor, or the QParts of a quantized one)
    rearranged for the shared layers by its arch's `transform`, if it has one."""
    transform = getattr(arch_module(cfg.model_type), "transform", None)
    return t if transform is None else transform(cfg, name, t)


def dense_tensor(cfg: ModelConfig, name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A dense checkpoint tensor (canonical name) as the FTW stores it: rearranged (arch_tensor),
    in `dtype` (or float32, see transformer.param_dtype)."""
    from engine.models.transformer import param_dtype
    return arch_tensor(cfg, name, t).to(param_dtype(name, dtype)).contiguous()
