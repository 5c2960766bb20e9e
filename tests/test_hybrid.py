"""Hybrid models (Qwen3-Next, Qwen3.5 MoE): every miss policy at full and one-layer budgets,
batched decode, and the recurrent-state checkpoints of the prefix cache: a request after a
context edit restores the deepest checkpoint its prompt continues and gets the logits of a full
re-prefill; the pool's bound and LRU eviction; preemption on the shared KV pool."""
import pytest
import torch
from conftest import greedy, load, prefill_logits, run, together
from test_parity import rel_err

from engine.kv.anchors import Anchors
from engine.kv.batch import ForwardBatch
from engine.scheduler import Scheduler

POLICIES = ["fetch", "cpu", "adaptive", "static:1"]
IM_START, IM_END, THINK, END_THINK, CALL, END_CALL, RESP, END_RESP, NL = range(1, 10)
ANCHORS = Anchors(frozenset({IM_START, IM_END, THINK, CALL, RESP}), frozenset({END_THINK, END_CALL, END_RESP}))


def words(n, seed):
    return torch.randint(20, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def turn(role_seed, n, seed):
    return [IM_START, role_seed] + words(n, seed) + [IM_END, NL]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "device-control"])
@pytest.mark.parametrize("layers", [3, 1], ids=["full-budget", "one-layer-budget"])
@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_5_moe"])
def test_every_policy_gives_the_tokens_of_transformers(tiny_model, arch, layers, graph):
    ref, _, ftw = tiny_model(arch)
    ids = words(24, 3)
    with torch.no_grad():
        want = ref.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(ids):].tolist()
    slot_bytes = load(ftw).runtime.store.layout.slot_bytes
    moe_layers = len(load(ftw).cfg.moe_layer_ids)
    for policy in POLICIES:
        e = load(ftw, expert_budget=8 * min(layers, moe_layers) * slot_bytes, moe_policy=policy, graph=graph)
        e.runtime.qstar.start(1.0, 1.0, online=False)
        assert greedy(e, ids, 32) == want, policy


def test_batched_decode_equals_one_at_a_time(tiny_model):
    e = load(tiny_model("qwen3_next")[2], max_running=3)
    free = len(e.states.free)  # (on CUDA the decode graphs hold a scratch slot)
    prompts = [words(30, 4), words(9, 5), words(45, 6)]
    solo = [run(Scheduler(e, set(), 1, 16, prefix_cache=False), p, 12).output for p in prompts]
    sched = Scheduler(e, set(), 3, 16, prefix_cache=False)
    seqs = together(sched, prompts, 12)
    assert [s.output for s in seqs] == solo
    assert len(e.states.free) == free  # every slot back


@pytest.mark.parametrize("checkpoints", [16, 0], ids=["resume-from-checkpoint", "re-prefill"])
def test_preempted_sequences_resume_with_their_state(tiny_model, checkpoints):
    """Three requests that together need more KV than the shared pool holds: the newest are
    preempted, give their state slot back and resume from a checkpoint taken where they stopped
    (without a checkpoint pool: by prefilling again); each answer equals its run alone."""
    e = load(tiny_model("qwen3_next")[2], kv_tokens=128, max_running=3, state_checkpoints=checkpoints)
    free = len(e.states.free)
    prompts = [words(45, s) for s in (7, 8, 9)]
    alone = [run(Scheduler(e, set(), 1, 32, prefix_cache=False), p, 40).output for p in prompts]
    sched = Scheduler(e, set(), 3, 32)
    seqs = together(sched, prompts, 40)
    assert [s.output for s in seqs] == alone
    assert sched.totals["preempted"] > 0 and len(e.states.free) == free   # every slot back
    assert (sched.prefix.restored > 0) == bool(checkpoints)


def restored_logits(sched, tokens):
    """Logits of tokens[n:] after restoring the deepest checkpoint (n tokens), as the scheduler does."""
    e = sched.runner
    slot = e.states.alloc()
    pages, n = sched.prefix.restore(tokens, slot)
    pages += e.kv.alloc(-(-len(tokens) // e.kv.page_size) - len(pages))
    try:
        b = ForwardBatch.build([(tokens[n:], n, pages)], e.kv.page_size, e.device, all_logits=True, states=[slot])
        return e.model(b, e.kv), n
    finally:
        e.kv.release(pages)
        e.states.release(slot)


@pytest.fixture(params=["qwen3_next", "qwen3_5_moe"])
def agent(tiny_model, request):
    """A scheduler with the checkpoint cache and turn 1 of an agent conversation done: prompt,
    then thinking, a tool call and the end of the turn (forced, so the anchors are known)."""
    e = load(tiny_model(request.param)[2], kv_tokens=1024, max_running=2)
    sched = Scheduler(e, set(), 2, 32, anchors=ANCHORS)
    system, user = turn(11, 40, 1), turn(12, 13, 2)
    head = [IM_START, 13, NL]
    prompt = system + user + head
    think, answer, call = [THINK] + words(21, 3) + [END_THINK], words(10, 4), [CALL] + words(9, 5) + [END_CALL]
    out = think + answer + call + [IM_END]
    first = run(sched, prompt, len(out), forced=tuple(out))
    assert first.output == out
    return sched, dict(system=system, user=user, head=head, think=think, answer=answer, call=call)


def check_edit(sched, tokens, want_n):
    full = prefill_logits(sched.runner, tokens)
    got, n = restored_logits(sched, tokens)
    assert n == want_n
    assert rel_err(got, full[n:]) < 1e-5
    assert got[-1].argmax() == full[-1].argmax()


def test_restore_after_each_kind_of_edit(agent):
    sched, t = agent
    base = t["system"] + t["user"] + t["head"]
    resp = [NL, IM_START, 14, NL, RESP] + words(17, 6) + [END_RESP, IM_END, NL] + t["head"]
    # the history resent as it was, plus a tool response: resume after the tool call's end
    kept = base + t["think"] + t["answer"] + t["call"]
    check_edit(sched, kept + [IM_END] + resp, len(kept))
    # earlier thinking dropped (Claude Code, Qwen templates): resume at the end of the user's turn
    # (before its <|im_end|>: the anchors after it, up to <think>, are too close to need their own)
    user_end = len(t["system"] + t["user"]) - 2
    check_edit(sched, base + t["answer"] + t["call"] + [IM_END] + resp, user_end)
    # the assistant turn rewritten from its header on: the same
    check_edit(sched, base[:-3] + [IM_START, 15, NL] + t["answer"] + resp, user_end)
    # the tool call rewritten: resume where it started (the anchor before <tool_call>)
    before_call = base + t["think"] + t["answer"]
    check_edit(sched, before_call + [CALL] + words(9, 7) + [END_CALL, IM_END] + resp, len(before_call))
    # the system prompt changed: nothing to restore, a full prefill
    check_edit(sched, [IM_START, 11] + words(40, 9) + base[42:], 0)


def test_scheduler_reports_restored_tokens_and_matches_a_fresh_prefill(agent):
    sched, t = agent
    prompt = t["system"] + t["user"] + t["head"] + t["answer"] + t["call"] + [IM_END, NL] + turn(12, 5, 8) + t["head"]
    second = run(sched, prompt, 8)
    assert second.cached == len(t["system"] + t["user"]) - 2       # the end of turn 1's user message
    fresh = Scheduler(sched.runner, set(), 1, 32, prefix_cache=False)
    assert run(fresh, prompt, 8).output == second.output
    stats = sched.prefix.stats()
    assert stats["state_checkpoints_restored"] >= 1 and stats["state_checkpoint_bytes"] > 0


def test_a_follow_up_resumes_at_the_end_of_the_prompt_before_it(agent):
    sched, _ = agent
    prompt = words(50, 20)  # no anchor inside: only its end
    run(sched, prompt, 4)
    follow = prompt + words(12, 21)
    assert run(sched, follow, 4).cached == len(prompt)
    fresh = Scheduler(sched.runner, set(), 1, 32, prefix_cache=False)
    assert run(fresh, follow, 4).output == run(sched, follow, 4).output


def test_without_anchor_tokens_a_follow_up_still_resumes_at_the_prompts_end(tiny_model):
    """A scheduler given no anchors (no chat template: a synthetic model, a bench) checkpoints the
    prompt's end all the same, so a follow-up prefills only its own tokens."""
    e = load(tiny_model("qwen3_5_moe")[2], kv_tokens=1024)
    sched = Scheduler(e, set(), 1, 32)
    prompt = words(50, 20)
    run(sched, prompt, 2)
    assert run(sched, prompt + words(12, 21), 2).cached == len(prompt)


def test_pool_is_bounded_and_evicts_least_recently_used(tiny_model):
    e = load(tiny_model("qwen3_next")[2], kv_tokens=1024, state_checkpoints=2)
    base = e.kv.used  # (on CUDA the decode graphs hold a scratch page)
    sched = Scheduler(e, set(), 1, 32, anchors=ANCHORS)
    a = turn(11, 20, 1) + turn(12, 20, 2) + turn(12, 20, 4) + [IM_START, 13, NL]   # anchors 22, 46, 70
    run(sched, a, 1, forced=(30,))
    assert len(sched.prefix.lru) == 2 and not sched.prefix.free_slots          # the deepest two kept
    assert restored_logits(sched, a[:30])[1] == 0 and restored_logits(sched, a[:60])[1] == 46
    used = e.kv.used
    b = turn(11, 20, 3) + turn(12, 20, 5) + [IM_START, 13, NL]                  # another conversation: 22, 46
    run(sched, b, 1, forced=(30,))
    assert len(sched.prefix.lru) == 2
    assert restored_logits(sched, a + [5])[1] == 0                              # a's were least recently used
    assert restored_logits(sched, b + [5])[1] == 46
    sched.prefix.evict(10**6)                                                   # dropping the tree drops its checkpoints
    assert not sched.prefix.lru and len(sched.prefix.free_slots) == 2
    assert used > base and e.kv.used == base                                    # and releases their tail pages


@pytest.mark.parametrize("ahead", [True, False], ids=["launched-ahead", "one-at-a-time"])
def test_output_anchors_are_checkpointed_with_their_own_state(tiny_model, monkeypatch, ahead):
    """A decode step launched before the last one's tokens are read writes each sequence's other
    state slot, so an anchor in the output is checkpointed with the state after it, not the state
    of the step ahead: restoring it gives a full prefill's logits, at the same position as when
    every step waits for the one before."""
    e = load(tiny_model("qwen3_5_moe")[2], kv_tokens=1024)
    prompt = words(20, 30)
    out = run(Scheduler(e, set(), 1, 32, prefix_cache=False), prompt, 24).output  # the model's own greedy output
    k = next(i for i in range(12, 20) if out[i] not in out[:i])  # a token first output at k: an anchor after it
    sched = Scheduler(e, set(), 1, 32, anchors=Anchors(frozenset(), frozenset({out[k]})))
    launched, launch = [], sched._launch_ahead
    monkeypatch.setattr(sched, "_launch_ahead", lambda cur: launched.append(launch(cur) if ahead else None) or launched[-1])
    assert run(sched, prompt, 24).output == out
    assert any(launched) == ahead
    anchor = len(prompt) + k + 1
    tokens = prompt + out[:k + 1] + words(6, 31)
    got, n = restored_logits(sched, tokens)
    assert n == anchor
    assert rel_err(got, prefill_logits(e, tokens)[n:]) < 1e-5


def test_a_half_precision_hybrid_on_cuda_without_fla_says_so(monkeypatch, caplog):
    """Only where flash-linear-attention's kernels would run: a hybrid, in half precision, on CUDA."""
    import logging

    from engine import loader
    from engine.synthetic import synthetic_config
    hybrid, dense = synthetic_config("tiny-hybrid"), synthetic_config("tiny")
    monkeypatch.setattr(loader.linear_attn, "fla_available", lambda: False)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    with caplog.at_level(logging.WARNING, logger="freetoken.loader"):
        for cfg, device, dtype in ((hybrid, cuda, torch.bfloat16), (hybrid, cuda, torch.float32),
                                   (hybrid, cpu, torch.bfloat16), (dense, cuda, torch.bfloat16)):
            loader.note_missing_kernels(cfg, device, dtype)
    assert len(caplog.records) == 1 and "pip install 'freetoken[cuda]'" in caplog.records[0].getMessage()
    monkeypatch.setattr(loader.linear_attn, "fla_available", lambda: True)
    caplog.clear()
    loader.note_missing_kernels(hybrid, cuda, torch.bfloat16)
    assert not caplog.records
