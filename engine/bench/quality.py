"""Teacher-forced quality of a model against a reference, usually the same model in another
format (`freetoken bench quality`): over one text, the mean KL(ref || model) of the next-token
distributions, the share of positions whose most likely token agrees, the perplexity of both,
and the routed-expert bytes of both. The text is scored in windows of the model's context; the
default is held-out Python standard-library source the demo model never trained on."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.errors import UserError

HELDOUT = Path(__file__).resolve().parents[1] / "demo" / "heldout.txt"


def log_probs(runner, ids: list[int]) -> torch.Tensor:
    """log-softmax of the next-token logits at every position of `ids` (one sequence from position
    0), float32 [N, V] on the CPU, prefilled chunk by chunk."""
    from engine.kv.batch import ForwardBatch
    kv, out, chunk = runner.kv, [], runner.prefill_chunk
    pages = kv.alloc(-(-len(ids) // kv.page_size))
    sliding = []  # the sliding layers' pages, those behind the window given back chunk by chunk
    try:
        with torch.no_grad():
            for a in range(0, len(ids), chunk):
                end = min(len(ids), a + chunk)
                if kv.sliding:
                    kv.sliding.grow(sliding, end)
                b = ForwardBatch.build([(ids[a:end], a, pages)], kv.page_size, runner.device,
                                       all_logits=True, sliding=[sliding] if kv.sliding else None)
                out.append(torch.log_softmax(runner.model(b, kv).float(), -1).cpu())
                if kv.sliding:
                    kv.sliding.slide(sliding, a, end)
    finally:
        kv.release(pages)
        if kv.sliding:
            kv.sliding.release(sliding)
    return torch.cat(out)


def compare(logp: torch.Tensor, logp_ref: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per position of the next-token distributions logp, logp_ref [N, V], with the tokens that
    followed, targets [N]: [N, 4] of KL(ref || model), top-1 agreement, and both negative
    log-likelihoods."""
    def nll(lp):
        return -lp.gather(1, targets[:, None])[:, 0]
    return torch.stack([(logp_ref.exp() * (logp_ref - logp)).sum(-1),
                        (logp.argmax(-1) == logp_ref.argmax(-1)).float(), nll(logp), nll(logp_ref)], 1)


def quality(model: str | None, reference: str, config: EngineConfig, text: str, tokens: int) -> dict:
    """The report for MODEL against REF (each an FTW directory, a HF directory or a hub id; None =
    the demo model) over the first `tokens` tokens of `text` (MODEL's tokenizer), scored in
    windows of the model's context. Keys: kl_mean, top1_agree, ppl, ppl_ref, expert_bytes,
    expert_bytes_ref, tokens, format, format_ref."""
    from engine.loader import load_runner
    from engine.resolve import ensure_ftw
    from engine.tokenizer import Tokenizer
    paths = [ensure_ftw(m) for m in (model, reference)]
    ids = Tokenizer(paths[0]).tok(text, add_special_tokens=False, verbose=False)["input_ids"][:tokens]
    if len(ids) < 2:
        raise UserError("the text has fewer than 2 tokens; give a longer --text")
    res, logps, seqs = {}, [], []
    for key, path in (("", paths[0]), ("_ref", paths[1])):  # one model loaded at a time
        runner = load_runner(replace(config, model=str(path)), path)
        if not seqs:
            context = runner.max_context
            seqs = [ids[a:a + context] for a in range(0, len(ids), context) if len(ids) - a > 1]
        elif runner.cfg.vocab_size != logps[0][0].shape[-1]:
            raise UserError(f"{reference} has a vocabulary of {runner.cfg.vocab_size} tokens and "
                            f"{model or 'the demo model'} of {logps[0][0].shape[-1]}; compare two formats of one model")
        logps.append([log_probs(runner, s) for s in seqs])
        res["expert_bytes" + key] = runner.runtime.store.nbytes
        res["format" + key] = runner.runtime.store.layout.dtype
        runner.runtime.close()
        del runner
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    per = torch.cat([compare(lp[:-1], lr[:-1], torch.tensor(s[1:])) for lp, lr, s in zip(*logps, seqs)])
    kl, agree, nll, nll_ref = per.mean(0).tolist()
    return {"kl_mean": kl, "top1_agree": agree, "ppl": math.exp(nll), "ppl_ref": math.exp(nll_ref), **res,
            "tokens": len(ids)}
