"""What a conversion of an HF checkpoint depends on, without torch: `resolve` finds a model's
earlier conversion by it before torch is imported, `convert` writes it into the FTW index."""
from __future__ import annotations

import hashlib
from pathlib import Path

SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "vocab.json",
              "merges.txt", "tokenizer.model", "added_tokens.json")
CONVERTER = "freetoken-convert-1"  # a new converter that writes other bytes is a new fingerprint


def fingerprint(model_dir: Path, dtype: str, quant: tuple | None = None) -> str:
    """What a conversion of HF directory `model_dir` to `dtype` (and `quant`) depends on: its side
    files' bytes, its weight files' names and sizes, the converter."""
    h = hashlib.sha256()
    for name in SIDE_FILES:  # the files copied beside the weights (an edited template is a new model)
        if (model_dir / name).exists():
            h.update((model_dir / name).read_bytes())
    for f in sorted(model_dir.glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    h.update(f"{dtype}:{CONVERTER}".encode())
    if quant:
        h.update(f":{quant[0]}/{quant[1]}".encode())
    return h.hexdigest()
