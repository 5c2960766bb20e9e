"""The embedded demo model: it loads from the repository, answers deterministically at
temperature 0 exactly as transformers does, is a real language model of Python (its
held-out loss is far below a unigram model's), and does not loop on the README's prompts."""
import importlib.util
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import load

from engine.kv.batch import ForwardBatch
from engine.resolve import DEMO, ensure_ftw

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def demo():
    return load(ensure_ftw(None))


def test_demo_greedy_matches_transformers_and_is_stable(demo):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.config import SamplingParams
    from engine.scheduler import Scheduler, Sequence
    tok = AutoTokenizer.from_pretrained(DEMO)
    ids = tok.apply_chat_template([{"role": "user", "content": "Return the number of items in the queue."}],
                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    def greedy(penalty: float) -> list[int]:
        sched = Scheduler(demo, {2}, 1, 2048, prefix_cache=False)
        seq = Sequence(ids, SamplingParams(max_tokens=24, repetition_penalty=penalty))
        sched.add(seq)
        while not seq.finish:
            sched.step()
        return seq.output
    outs = [greedy(1.0), greedy(1.0)]
    ref = AutoModelForCausalLM.from_pretrained(DEMO, dtype=torch.float32).eval()
    want = ref.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,  # not the model's penalty
                        repetition_penalty=1.0)[0, len(ids):].tolist()
    assert outs[0] == outs[1] == want
    assert "def" in tok.decode(outs[0])
    # a penalty over the prompt and every token sampled so far, the scheduler's mask kept step by step
    want = ref.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                        repetition_penalty=1.5)[0, len(ids):].tolist()
    assert greedy(1.5) == want != outs[0]


def train_demo():
    spec = importlib.util.spec_from_file_location("train_demo", ROOT / "scripts" / "train_demo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_demo_answers_the_readme_prompts_without_looping(demo):
    """At the model's default sampling (generation_config.json), 160 tokens at most: each prompt's
    answer has a distinct 4-gram ratio >= 0.6 and parses as Python up to its last complete line."""
    import json

    from engine.config import SamplingParams
    from engine.sampling import model_defaults
    from engine.scheduler import Scheduler, Sequence
    from engine.tokenizer import Tokenizer
    if "corpus" not in json.loads((DEMO / "training_metrics.json").read_text()):
        pytest.skip("the committed demo model predates the corpus retrain (benchmarks/h200.sh train)")
    td, tok = train_demo(), Tokenizer(DEMO)
    for prompt in td.PROMPTS:
        ids = tok.chat([{"role": "user", "content": prompt}])
        sched = Scheduler(demo, tok.eos_ids, 1, 2048, prefix_cache=False)
        seq = Sequence(ids, SamplingParams(max_tokens=160, seed=0, **model_defaults(DEMO)))
        sched.add(seq)
        while not seq.finish:
            sched.step()
        out = [t for t in seq.output if t not in tok.eos_ids]
        text = tok.decode(out)
        assert td.distinct_4gram_ratio(out) >= 0.6, (prompt, text)
        assert td.parses(text, finished=seq.finish == "stop"), (prompt, text)


def heldout_text(n_files: int = 3) -> str:
    mod = train_demo()
    files = [text for rel, text in mod.stdlib_files() if mod.is_heldout(rel)]
    assert files, "no held-out files found"
    return "\n".join(files[:n_files])


def test_demo_beats_unigram_on_heldout_code(demo):
    from transformers import AutoTokenizer
    ids = AutoTokenizer.from_pretrained(DEMO).encode(heldout_text(), add_special_tokens=False)[:3 * 512 + 1]
    nll, n = 0.0, 0
    pages = demo.kv.alloc(512 // demo.kv.page_size)
    for start in range(0, len(ids) - 1, 512):  # independent 512-token windows
        chunk = ids[start:start + 513]
        b = ForwardBatch.build([(chunk[:-1], 0, pages)], demo.kv.page_size, demo.device, all_logits=True)
        logp = torch.log_softmax(demo.model(b, demo.kv), -1)
        nll -= float(logp.gather(1, torch.tensor(chunk[1:])[:, None]).sum())
        n += len(chunk) - 1
    demo.kv.release(pages)
    loss = nll / n
    counts = Counter(ids[1:])  # the unigram model fitted on these very tokens: an optimistic baseline
    unigram = -sum(c / n * math.log(c / n) for c in counts.values())
    assert loss < 0.7 * unigram, (loss, unigram)


def test_repetition_penalty_matches_transformers():
    """The sampler's penalty is transformers' RepetitionPenaltyLogitsProcessor over the prompt and
    output tokens (repeats counted once), greedy and sampled alike."""
    from transformers import RepetitionPenaltyLogitsProcessor

    from engine.config import SamplingParams
    from engine.sampling import sample, seen_mask

    def one(logits, p, gen=None):
        return int(sample(logits[None], [p], [gen], [seen])[0])
    torch.manual_seed(0)
    logits, ids = torch.randn(50), [3, 7, 7, 12, 40, 3]
    seen = seen_mask(ids, 50, logits.device)
    want = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([ids]), logits[None].clone())[0]
    assert one(logits, SamplingParams(repetition_penalty=1.3)) == int(want.argmax())
    logits[7] = logits.max() + 0.1  # a seen token on top: the penalty moves the greedy pick
    assert one(logits, SamplingParams()) == 7
    assert one(logits, SamplingParams(repetition_penalty=5.0)) != 7
    p = SamplingParams(temperature=1.0, top_k=1, repetition_penalty=5.0)
    want = RepetitionPenaltyLogitsProcessor(5.0)(torch.tensor([ids]), logits[None].clone())[0]
    assert one(logits, p, torch.Generator().manual_seed(0)) == int(want.argmax())


def test_sampler_draws_from_transformers_warped_distribution():
    """Temperature, top-k and top-p as transformers' logits warpers apply them: over many draws a
    row's tokens follow the softmax of the warped logits (none outside its kept set, every tie of
    the k-th logit in it); rows with different settings share a batch (one without top-k: the whole
    row sorted; all with it: only their top logits), and a row's draws depend on its own generator."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from engine.config import SamplingParams
    from engine.sampling import sample
    torch.manual_seed(1)
    V, n = 12, 20000
    logits = torch.randn(4, V) * 2
    logits[3] = torch.tensor([2.0, 1.0, 0.5, 0.5, 0.5, -1.0, 0.0, -2.0, 0.25, -0.5, 0.3, -3.0])  # a tie at the 3rd
    params = [SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.3, top_p=0.8),
              SamplingParams(temperature=1.0, top_k=6, top_p=0.6), SamplingParams(temperature=1.0, top_k=3, top_p=0.95)]
    want = []
    for row, p in zip(logits, params):
        x = TemperatureLogitsWarper(p.temperature)(None, row[None].clone())
        if p.top_k:
            x = TopKLogitsWarper(p.top_k)(None, x)
        if p.top_p < 1.0:
            x = TopPLogitsWarper(p.top_p)(None, x)
        want.append(x[0].softmax(-1))
    assert (want[3] > 0).sum() == 5  # the tie kept whole
    drawn = {}
    for rows in ([0, 1, 2, 3], [0, 2, 3], [3]):  # the last: two of the tie beyond its top 3
        gens = [torch.Generator().manual_seed(i) for i in rows]
        draws = torch.stack([sample(logits[rows], [params[i] for i in rows], gens, [None] * len(rows))
                             for _ in range(n)])
        for j, i in enumerate(rows):
            freq = torch.bincount(draws[:, j], minlength=V).float() / n
            assert torch.all(freq[want[i] == 0] == 0), i
            assert (freq - want[i]).abs().max() < 0.015, (i, freq, want[i])
        drawn[len(rows)] = draws
    g = torch.Generator().manual_seed(1)
    alone = [sample(logits[1:2], params[1:2], [g], [None]) for _ in range(50)]
    assert torch.cat(alone).tolist() == drawn[4][:50, 1].tolist()
