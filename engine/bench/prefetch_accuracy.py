"""How well layer l's MoE input predicts layer l+1's experts: the share of layer l+1's top-k that
layer l+1's router picks from layer l's input (the cross-layer prefetch signal), over a prompt's
tokens. The routing proxy of scripts/train_demo.py applies `predicted_share` to its own model.
Usage: python3 -m engine.bench.prefetch_accuracy [demo | SHAPE LAYERS] (CPU is enough)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import torch

from engine.config import EngineConfig


def predicted_share(inputs: list[torch.Tensor], route: Callable[[int, torch.Tensor], torch.Tensor]) -> list[float]:
    """Per layer pair (l, l+1): mean over tokens of |predicted & routed| / K, where layer l+1's
    router predicts from layer l's MoE input. inputs[l] is layer l's MoE input [tokens, hidden];
    route(l, x) gives layer l's router's top-k expert ids [tokens, K] for x."""
    out = []
    for layer in range(1, len(inputs)):
        pred, real = route(layer, inputs[layer - 1]), route(layer, inputs[layer])
        out.append(float((pred[:, :, None] == real[:, None, :]).any(-1).float().mean()))
    return out


def accuracy(runner, tokens: list[int]) -> list[float]:
    """`predicted_share` of an engine model over a prompt's tokens."""
    from engine.kv.batch import ForwardBatch
    blocks = runner.model.moe_blocks()
    inputs: dict[int, torch.Tensor] = {}
    hooks = [b.register_forward_pre_hook(lambda m, args: inputs.__setitem__(m.moe_index, args[0].clone()))
             for b in blocks]
    kv = runner.kv
    try:
        with kv.scratch(len(tokens)) as (pages, sliding):
            runner.model(ForwardBatch.build([(tokens, 0, pages)], kv.page_size, runner.device,
                                            sliding=None if sliding is None else [sliding]), kv)
    finally:
        for h in hooks:
            h.remove()
    return predicted_share([inputs[i] for i in range(len(blocks))], lambda layer, x: blocks[layer].route(x)[1])


def main(args: list[str]) -> None:
    from engine.loader import load_runner, load_synthetic
    from engine.resolve import ensure_ftw
    cfg = EngineConfig(model="", device="cpu", graph=False)
    if not args or args[0] == "demo":
        from engine.tokenizer import Tokenizer
        path = ensure_ftw(None)
        runner = load_runner(cfg, path)
        text = Path(torch.__file__).with_name("functional.py").read_text()[:6000]
        tokens = Tokenizer(path).encode(text)[:1024]
    else:
        runner = load_synthetic(cfg, args[0], int(args[1]))
        tokens = torch.randint(0, runner.cfg.vocab_size, (256,), generator=torch.Generator().manual_seed(0)).tolist()
    acc = accuracy(runner, tokens)
    print(f"{len(tokens)} tokens, top-{runner.cfg.router.top_k} of {runner.cfg.num_experts}: "
          f"predicted share per layer pair {[round(a, 3) for a in acc]}, mean {sum(acc) / len(acc):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
