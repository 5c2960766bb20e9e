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
    s = SHAPES[shape]
    cfg = tf.Qwen3MoeConfig(vocab_size=s["vocab_size"], hidden_size=s["hidden_size"],
                            intermediate_size=4 * s["hidden_size"], num_hidden_layers=layers or s["num_layers"],
                            num_attention_heads=s["num_heads"], num_key_value_heads=s["num_kv_heads"],
                            head_dim=s["head_dim"], num_experts=s["num_experts"], num_experts_per_tok=s["top_k"],
                            moe_intermediate_size=s["moe_intermediate_size"], max_position_embeddings=40960,
                            norm_topk_prob=True, tie_word_embeddings=False)
    tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(out)
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
