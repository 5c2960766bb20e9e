"""Radix prefix cache: page-granular sharing, reference counts, LRU eviction under pressure."""
import pytest
import torch
from conftest import load, run, together

from engine.config import SamplingParams
from engine.errors import UserError
from engine.kv.paged import KVPool
from engine.kv.radix import RadixCache
from engine.scheduler import Scheduler, Sequence


def pool(n_pages=8, page=4):
    return KVPool(1, n_pages, page, 1, 2, torch.float32, torch.device("cpu"))


def test_match_insert_share_and_evict():
    kv = pool()
    tree = RadixCache(kv)
    toks = list(range(10))                      # 2 full pages + 2 tokens
    pages = kv.alloc(3)
    tree.insert(toks, pages)
    kv.release(pages)                            # the sequence is done; the tree keeps 2 pages
    assert tree.pages == 2 and kv.used == 2
    got = tree.match(toks + [99])                # shares both full pages
    assert got == pages[:2] and kv.refs[pages[0]] == 2
    assert tree.match(toks[:8]) == pages[:1]     # leaves at least one token to compute
    kv.release(got + pages[:1])
    assert tree.match([5] + toks) == []          # a different first page shares nothing
    assert tree.evict(1) == 1 and tree.pages == 1  # the leaf goes first
    assert tree.evict(5) == 1 and kv.used == 0


def test_referenced_pages_are_not_evicted():
    kv = pool()
    tree = RadixCache(kv)
    pages = kv.alloc(2)
    tree.insert(list(range(8)), pages)
    held = tree.match(list(range(9)))            # a running sequence uses both pages
    assert tree.evict(10) == 0
    kv.release(held + pages)
    assert tree.evict(10) == 2


def test_a_sequence_leaves_its_callers_prompt_alone():
    prompt = [5, 6, 7]
    seq = Sequence(prompt, SamplingParams(max_tokens=2))
    seq.tokens.append(8)
    assert prompt == [5, 6, 7] and seq.n_prompt == 3
    twin = Sequence(prompt, SamplingParams(max_tokens=2, repetition_penalty=1.2))
    other = Sequence(prompt, twin.params)
    twin.seen, other.seen = torch.ones(4, dtype=torch.bool), torch.ones(4, dtype=torch.bool)  # not compared
    assert twin != other and other not in [twin] and [twin, other].index(other) == 1


def test_a_sequences_page_array_follows_its_pages():
    """The int32 copy a step's batch reads grows with the pages list and is made anew for a new
    list; the batch's page table and KV slots are the same from it as from the list."""
    from engine.kv.batch import ForwardBatch
    seq = Sequence([1, 2, 3], SamplingParams(max_tokens=2))
    seq.pages += [7, 3]
    first = seq.page_array()
    assert first.tolist() == [7, 3] and seq.page_array() is first
    seq.pages += [9]
    assert seq.page_array().tolist() == [7, 3, 9]
    seq.pages = [4]
    assert seq.page_array().tolist() == [4]
    seq.pages = [7, 3, 9]
    steps = [([5, 6, 7, 8, 9], 6, seq.page_array()), ([1], 2, [2])]
    a, b = (ForwardBatch.build([(n, s, p if i else list(p)) for n, s, p in steps], 4, torch.device("cpu"))
            for i in (0, 1))
    assert torch.equal(a.page_table, b.page_table) and torch.equal(a.slots, b.slots)
    assert a.slots.tolist() == [3 * 4 + 2, 3 * 4 + 3, 9 * 4, 9 * 4 + 1, 9 * 4 + 2, 2 * 4 + 2]


def test_second_turn_reuses_prefix_and_side_request_keeps_it(tiny_model):
    e = load(tiny_model("qwen3_moe")[2], kv_tokens=256)
    sched = Scheduler(e, set(), 2, 64)
    convo = torch.randint(0, 256, (100,), generator=torch.Generator().manual_seed(5)).tolist()
    first = run(sched, convo)
    second = run(sched, convo + first.output + [7, 8, 9])
    assert second.cached >= 96
    side = run(sched, [1, 2, 3, 4, 5])           # e.g. a title request
    assert side.cached == 0
    third = run(sched, convo + first.output + [7, 8, 9] + second.output)
    assert third.cached >= second.cached
    # reuse is exact: the same prompt without the cache gives the same tokens
    fresh = Scheduler(e, set(), 1, 64, prefix_cache=False)
    assert run(fresh, convo + first.output + [7, 8, 9]).output == second.output


def test_shared_pool_preempts_newest_and_every_request_ends(tiny_model):
    """Three requests that together need more KV than the pool holds: the newest are preempted
    (their KV parked in the prefix cache) and resume; each answer equals its run alone."""
    e = load(tiny_model("qwen3_moe")[2], kv_tokens=256, max_running=3)
    base = e.kv.used  # (on CUDA the decode graphs hold a scratch page)
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 256, (90,), generator=g).tolist() for _ in range(3)]
    alone = [run(Scheduler(e, set(), 1, 64, prefix_cache=False), p, n=40).output for p in prompts]
    sched = Scheduler(e, set(), 3, 64)
    seqs = together(sched, prompts, 40)
    assert [s.output for s in seqs] == alone and all(s.finish == "length" for s in seqs)
    assert sched.totals["preempted"] > 0
    assert e.kv.used == sched.prefix.pages + base  # only the prefix cache holds pages now


def test_a_batch_of_mixed_samplers_gives_each_its_answer_alone(tiny_model):
    """Greedy rows take one argmax for the whole batch; a seeded sampler, a repetition penalty and
    forced tokens beside them still sample their own way: each answer equals its run alone."""
    e = load(tiny_model("qwen3_moe")[2], max_running=4)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 256, (20 + 7 * i,), generator=g).tolist() for i in range(4)]
    params = [dict(temperature=0), dict(temperature=1.0, seed=3), dict(temperature=0, repetition_penalty=1.5),
              dict(temperature=0, forced=(5, 6))]
    alone = [run(Scheduler(e, set(), 1, 64, prefix_cache=False), p, n=12, **k).output for p, k in zip(prompts, params)]
    sched = Scheduler(e, set(), 4, 64, prefix_cache=False)
    seqs = [Sequence(p, SamplingParams(max_tokens=12, **k)) for p, k in zip(prompts, params)]
    for s in seqs:
        sched.add(s)
    while not all(s.finish for s in seqs):
        sched.step()
    assert [s.output for s in seqs] == alone
    plain = [run(Scheduler(e, set(), 1, 64, prefix_cache=False), p, n=12, temperature=0).output for p in prompts[1:3]]
    assert alone[1] != plain[0] and alone[2] != plain[1] and alone[3][:2] == [5, 6]  # each sampled its own way


def test_context_full_is_its_own_finish(tiny_model):
    e = load(tiny_model("qwen3_moe")[2], max_context=64)
    seq = run(Scheduler(e, set(), 1, 64), list(range(1, 60)), n=100)
    assert seq.finish == "context" and len(seq.tokens) == 64


def test_request_the_pool_cannot_hold_fails_instead_of_waiting_forever(tiny_model):
    """A pool whose pages another scheduler keeps (a bench's second mode): the one running request
    cannot get room by preempting or evicting, so it says so rather than retrying each step."""
    e = load(tiny_model("qwen3_moe")[2], kv_tokens=128)
    keeper = Scheduler(e, set(), 1, 64)
    run(keeper, list(range(1, 100)), n=1)                 # its prefix cache keeps these pages
    with pytest.raises(UserError, match="KV cache is full"):
        run(Scheduler(e, set(), 1, 64, prefix_cache=False), list(range(101, 200)), n=1)


def test_decode_steps_run_one_ahead_and_end_where_they_should(tiny_model):
    """A plainly greedy decode launches its next step before reading the last one's tokens; a
    sequence that stops at an end token mid-way drops the step run ahead of it, keeps no page,
    and its answer is the one without the end token, cut there."""
    e = load(tiny_model("qwen3_moe")[2])
    prompt = list(range(3, 40))
    sched = Scheduler(e, set(), 2, 64)
    full = run(sched, prompt, n=16).output
    seq = Sequence(prompt, SamplingParams(max_tokens=4))
    sched.add(seq)
    ahead = 0
    while not seq.finish:
        sched.step()
        ahead += sched._ahead is not None
    assert ahead > 0 and seq.output == full[:4]
    sampled, ahead = [], 0
    for _ in range(2):  # a seeded sampler runs ahead too, its draws its own
        sched = Scheduler(e, set(), 2, 64, prefix_cache=False)
        seq = Sequence(prompt, SamplingParams(max_tokens=12, temperature=0.9, top_k=30, repetition_penalty=1.2, seed=5))
        sched.add(seq)
        while not seq.finish:
            sched.step()
            ahead += sched._ahead is not None
        sampled.append(seq.output)
    assert ahead > 0 and sampled[0] == sampled[1] != full[:12]
    eos = full[6]
    stop = run(Scheduler(e, {eos}, 2, 64), prompt, n=16)
    assert stop.finish == "stop" and stop.output == full[:full.index(eos) + 1]
    sched, held = Scheduler(e, {eos}, 2, 64, prefix_cache=False), e.kv.used  # the other schedulers' prefix trees
    run(sched, prompt, n=16)
    drained = 0
    while sched.busy:
        assert sched.step() == []  # the step run past the end: completed, nothing returned
        drained += 1
    assert drained == 1 and e.kv.used == held


def test_abort_and_safe_point_while_a_step_runs_ahead(tiny_model):
    """An abort while a step runs ahead drops that step's row; a safe point completes it first
    and the next step() returns its tokens: nothing is lost or doubled."""
    e = load(tiny_model("qwen3_moe")[2])
    base = e.kv.used  # (on CUDA the decode graphs hold a scratch page)
    prompts = [list(range(3, 30)), list(range(50, 71))]
    alone = [run(Scheduler(e, set(), 1, 64, prefix_cache=False), p, n=12).output for p in prompts]
    sched = Scheduler(e, set(), 2, 64, prefix_cache=False)
    seqs = [Sequence(p, SamplingParams(max_tokens=12)) for p in prompts]
    for s in seqs:
        sched.add(s)
    got = {s.id: [] for s in seqs}
    for i in range(40):
        if not sched.busy:
            break
        if i == 6:
            assert sched._ahead is not None
            assert sched.safe_point(lambda: sched._ahead) is None  # completed before fn ran
        if i == 9:
            sched.abort(seqs[1])
        for s, tok in sched.step():
            got[s.id].append(tok)
    assert got[seqs[0].id] == alone[0] and seqs[0].output == alone[0]
    assert got[seqs[1].id] == seqs[1].output == alone[1][:len(seqs[1].output)] and seqs[1].finish == "abort"
    assert e.kv.used == base


def test_a_steps_inputs_reach_the_device_without_waiting_for_the_stream(monkeypatch):
    """A blocking host-to-device copy waits for everything queued on the stream, so building the
    step launched ahead would wait for the one before it: the batch's tensors and the sampler's
    settings are copied with non_blocking=True (checked here by the calls, on any device)."""
    from engine.config import SamplingParams
    from engine.kv.batch import ForwardBatch
    from engine.sampling import sample
    calls, to = [], torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *a, **k: calls.append(k.get("non_blocking")) or to(t, *a, **k))
    ForwardBatch.build([([5, 6, 7], 0, [0]), ([8], 20, [1, 2])], 16, torch.device("cpu"), states=[0, 1],
                       sliding=[[3], [4, 5]])
    sample(torch.randn(2, 50), [SamplingParams(), SamplingParams(temperature=0.7, top_k=5)],
           [None, torch.Generator().manual_seed(0)], [None, None])
    assert len(calls) >= 8 and all(calls), calls
