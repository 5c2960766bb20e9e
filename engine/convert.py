"""HF checkpoint -> FTW conversion. Streams layer by layer (peak RAM about one layer's expert
bank): dense tensors are cast and written as they are; routed experts of a layer, whether
stored per expert or fused, are packed into one [E, slot_bytes] bank in the runtime layout."""
from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Callable

import torch

from engine.errors import UserError
from engine.models import arch_module, canonical_name, model_config, read_hf_config, skipped
from engine.models.base import DTYPES, ModelConfig
from engine.moe.layout import SlotLayout
from engine.moe.store import bank_name

SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "vocab.json",
              "merges.txt", "tokenizer.model", "added_tokens.json")
EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\."
                    r"(?:(\d+)\.(gate_proj|up_proj|down_proj)\.weight|(gate_up_proj|down_proj))$")
IGNORED = re.compile(r"rotary_emb\.inv_freq$")
CONVERTER = "freetoken-convert-1"


class Source:
    """All tensors of a safetensors checkpoint, by canonical name, opened lazily per file."""

    def __init__(self, model_dir: Path, model_type: str):
        from safetensors import safe_open
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise UserError(f"{model_dir} has no *.safetensors files; only safetensors checkpoints are supported")
        self.where: dict[str, tuple] = {}
        unused = 0
        for f in files:
            try:
                h = safe_open(str(f), framework="pt")
                keys = list(h.keys())
            except Exception as e:  # safetensors raises its own error types for corrupt headers
                raise UserError(f"{f} is not a readable safetensors file ({e}); re-download it") from None
            for k in keys:
                if skipped(model_type, k):
                    unused += 1
                    continue
                self.where[canonical_name(model_type, k)] = (h, k, f)
        if unused:
            logging.getLogger("freetoken.convert").warning(
                "skipping %d tensors this engine does not run (vision tower, multi-token prediction)", unused)
        self.files = files

    def get(self, name: str) -> torch.Tensor:
        h, key, f = self.where[name]
        try:
            return h.get_tensor(key)
        except Exception as e:
            raise UserError(f"cannot read tensor {key} from {f} ({e}); the file looks corrupt, re-download it") from None


def fingerprint(model_dir: Path, dtype: str) -> str:
    h = hashlib.sha256((model_dir / "config.json").read_bytes())
    for f in sorted(model_dir.glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    h.update(f"{dtype}:{CONVERTER}".encode())
    return h.hexdigest()


def target_dtype(cfg: ModelConfig, dtype: str) -> str:
    if dtype == "auto":
        return cfg.dtype
    if dtype not in DTYPES:
        raise UserError(f"unknown --dtype {dtype!r}; choose bf16, fp16, fp32 or auto")
    return str(DTYPES[dtype]).removeprefix("torch.")


def expected_names(cfg: ModelConfig) -> set[str]:
    from engine.models.transformer import CausalLM, checkpoint_names
    with torch.device("meta"):
        names = {p for n in CausalLM(cfg).state_dict() for p in checkpoint_names(n)}
    if cfg.tie_word_embeddings:
        names.discard("lm_head.weight")
    return names


def pack_bank(src: Source, layer: int, cfg: ModelConfig, layout: SlotLayout, dt) -> torch.Tensor:
    """One MoE layer's experts -> [E, slot_bytes] uint8 in the runtime layout."""
    bank = torch.zeros(cfg.num_experts, layout.slot_bytes, dtype=torch.uint8)
    v, inter, pre = layout.views(bank), cfg.moe_intermediate_size, f"model.layers.{layer}.mlp.experts."
    if pre + "gate_up_proj" in src.where:  # fused layout: [E, 2I, H] gate rows then up rows
        v["gate_up"].copy_(src.get(pre + "gate_up_proj").to(dt))
        v["down"].copy_(src.get(pre + "down_proj").to(dt))
        return bank
    for e in range(cfg.num_experts):
        part = f"{pre}{e}."
        if part + "gate_proj.weight" not in src.where:
            raise UserError(f"checkpoint lacks {part}gate_proj.weight; it looks incomplete, re-download it")
        v["gate_up"][e, :inter].copy_(src.get(part + "gate_proj.weight").to(dt))
        v["gate_up"][e, inter:].copy_(src.get(part + "up_proj.weight").to(dt))
        v["down"][e].copy_(src.get(part + "down_proj.weight").to(dt))
    return bank


def check_names(src: Source, cfg: ModelConfig) -> None:
    dense = {n for n in src.where if not EXPERT.match(n) and not IGNORED.search(n)}
    want = expected_names(cfg)
    if missing := sorted(want - dense):
        raise UserError(f"checkpoint lacks {missing[0]} (and {len(missing) - 1} more); it looks incomplete")
    if extra := sorted(dense - want - {"lm_head.weight"}):
        raise UserError(f"checkpoint has tensor {extra[0]} that this {cfg.model_type} model does not use; "
                        "the config and weights disagree")


def convert(src_dir: Path, out: Path, dtype: str = "auto", force: bool = False,
            progress: Callable[[int, int], None] | None = None) -> Path:
    """Convert a local HF directory to FTW at `out`. progress(done_layers, total_layers)."""
    from ftw import FTWWriter
    hf = read_hf_config(src_dir)
    cfg = model_config(hf)
    dt_name = target_dtype(cfg, dtype)
    dt = DTYPES[dt_name]
    src = Source(src_dir, cfg.model_type)
    check_names(src, cfg)
    layout = SlotLayout.for_experts(cfg.hidden_size, cfg.moe_intermediate_size, dt)
    meta = {"model_type": cfg.model_type, "dtype": dt_name, "layout": layout.to_meta(),
            "moe_layers": cfg.moe_layer_ids, "converter": CONVERTER, "source": src_dir.name}
    with FTWWriter(out, fingerprint=fingerprint(src_dir, dt_name), meta=meta, force=force) as w:
        dense = sorted(n for n in src.where if not EXPERT.match(n) and not IGNORED.search(n))
        for layer in range(cfg.num_layers):
            for n in (n for n in dense if n.startswith(f"model.layers.{layer}.")):
                w.add(n, src.get(n).to(dt).contiguous())
            if cfg.moe_layers[layer]:
                w.add(bank_name(layer), pack_bank(src, layer, cfg, layout, dt), meta={"bank": True})
            if progress:
                progress(layer + 1, cfg.num_layers)
        for n in (n for n in dense if not n.startswith("model.layers.")):
            w.add(n, src.get(n).to(dt).contiguous())
        for name in SIDE_FILES:
            if (src_dir / name).exists():
                w.copy_file(src_dir / name, name)
    return out
