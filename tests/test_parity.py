"""Every architecture, in both expert layouts, against transformers itself (fp32)."""
import pytest
import torch
from conftest import ARCHS, greedy, load, prefill_logits

from engine.kv.batch import ForwardBatch


def prompt(n=64, seed=1):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def rel_err(a, b):
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_greedy_match_transformers(tiny_model, arch, fused):
    ref, _, ftw = tiny_model(arch, fused)
    runner = load(ftw)
    ids = prompt()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
        want_tokens = ref.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    assert rel_err(prefill_logits(runner, ids), want) < 1e-4
    assert greedy(runner, ids, 32) == want_tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decode_equals_full_prefill(tiny_model, arch):
    runner = load(tiny_model(arch)[2])
    ids = prompt(40, seed=2)
    full = prefill_logits(runner, ids)
    pages = runner.kv.alloc(3)
    sliding = [runner.kv.sliding.alloc(3)] if runner.kv.sliding else None
    states = [runner.states.alloc()] if runner.states else None
    step_logits = []
    # prefill 16 tokens in chunks of 7, 9, then decode the rest one token at a time
    cuts = [0, 7, 16] + list(range(17, 41))
    for a, b in zip(cuts, cuts[1:]):
        batch = ForwardBatch.build([(ids[a:b], a, pages)], runner.kv.page_size, runner.device, all_logits=True,
                                   states=states, sliding=sliding)
        step_logits.append(runner.model(batch, runner.kv))
    assert rel_err(torch.cat(step_logits), full) < 1e-5
