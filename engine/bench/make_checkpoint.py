"""A random-weight HuggingFace checkpoint of a real model's shape (engine.synthetic's shapes),
built with transformers' own config class and saved with one tensor per expert, as the tests
build theirs, with the demo model's tokenizer: for measuring what runs from disk (`freetoken
convert`, then `bench startup` or `run`). Usage: python3 -m engine.bench.make_checkpoint OUT
[--shape qwen3-30b-a3b] [--layers 8]."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from engine.resolve import DEMO
from engine.synthetic import SHAPES


def build(out: Path, shape: str, layers: int | None = None) -> None:
    import transformers as tf
    hf = dict(SHAPES[shape], tie_word_embeddings=False)
    hf["num_hidden_layers"] = layers or hf["num_hidden_layers"]
    hf.setdefault("intermediate_size", 4 * hf["hidden_size"])
    cfg = tf.AutoConfig.for_model(hf.pop("model_type"), **hf)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init: minutes on the CPU
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out)
    for f in DEMO.iterdir():
        if f.name.startswith(("tokenizer", "chat_template")):
            shutil.copy(f, out / f.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=list(SHAPES))
    ap.add_argument("--layers", type=int)
    a = ap.parse_args()
    build(a.out, a.shape, a.layers)


if __name__ == "__main__":
    main()
