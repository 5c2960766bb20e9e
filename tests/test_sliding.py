"""gpt-oss's sliding-window layers keep only their window of KV: their own page pool, pages behind
each sequence's window given back after every step, and prefix reuse only where the window before
the reused prefix was kept (a prompt's end, where a sequence stopped)."""
import pytest
import torch
from conftest import load, prefill_logits, run, together
from test_parity import prompt, rel_err

from engine.config import SamplingParams
from engine.kv.paged import SlidingPool
from engine.scheduler import Scheduler, Sequence


def reference(ref, seq: Sequence) -> torch.Tensor:
    """transformers' logits over the whole sequence, after checking that its output is their greedy
    continuation (generate's sliding cache in transformers 5 does not match its own forward)."""
    with torch.no_grad():
        logits = ref(torch.tensor([seq.tokens])).logits[0]
    assert logits[seq.n_prompt - 1:-1].argmax(-1).tolist() == seq.output
    return logits


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "device-control"])
def test_tokens_and_logits_unchanged_while_pages_behind_the_window_go(tiny_model, graph):
    """A 70-token prompt in chunks of 24 and 60 decoded tokens (window 20, pages of 16): the
    tokens and every sampled row's logits are transformers', and the sliding layers never hold
    more than their window's pages, while the full-attention layers hold the whole context."""
    ref, _, ftw = tiny_model("gpt_oss")
    e = load(ftw, prefill_chunk=24, graph=graph)
    kv, sl, ps = e.kv, e.kv.sliding, e.kv.page_size
    base = kv.used  # (on CUDA the decode graphs hold a scratch page)
    w = e.cfg.sliding_window
    ids = prompt(70, seed=4)
    rows, held = [], []
    forward = e.forward

    def recording(batch, pool, **kw):
        out = forward(batch, pool, **kw)
        rows.append((int(batch.positions[-1]), out[-1].clone()))  # (a graph's output is reused)
        return out
    e.forward = recording
    seq = Sequence(ids, SamplingParams(max_tokens=60))
    sched = Scheduler(e, set(), 1, e.prefill_chunk, prefix_cache=False)
    sched.add(seq)
    ahead = 0
    while not seq.finish:
        sched.step()
        held.append(len(set(seq.sliding) - {sl.dummy}))
        ahead += sched._ahead is not None  # decode steps launched before the last one's tokens were read
    assert ahead > 50
    want = reference(ref, seq)
    assert rel_err(torch.stack([r for _, r in rows]), want[[p for p, _ in rows]]) < 1e-4
    # memory: after each step the sequence holds the window's pages (a page more at most), the
    # pool is sized by windows (not by the prefill chunk), and it gets every page back
    assert max(held) <= -(-w // ps) + 1 < 130 // ps
    assert sl.n_pages == 4 * SlidingPool.held(w, ps) + 1 < kv.n_pages
    assert sl.used == 1 and kv.used == base


def test_one_step_prefill_outside_the_scheduler_holds_only_the_window(tiny_model):
    """KVPool.scratch (the benches' and tests' one-step prefill) grows the sliding pages as the
    scheduler does: a 300-token sequence, longer than the whole sliding pool holds, prefills in
    one step with transformers' logits, and every page comes back."""
    ref, _, ftw = tiny_model("gpt_oss")
    e = load(ftw)
    sl, ids = e.kv.sliding, prompt(300, seed=6)
    used = (e.kv.used, sl.used)
    assert -(-len(ids) // e.kv.page_size) > sl.n_pages  # (all of them would not fit)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    assert rel_err(prefill_logits(e, ids), want) < 1e-4
    assert (e.kv.used, sl.used) == used


def test_kv_memory_saved_at_long_context(tiny_model):
    """A 400-token sequence: the full-attention layer holds 25 pages, the sliding layers 3 (5 at
    most, in a 128-token prefill chunk). The sliding pool has 17 pages to the main pool's 33
    (windows for the running sequence, the one in a prefill chunk and the prefix cache, and the
    dummy), so the model's KV is 68% of one pool for every layer; with a longer context the main
    pool grows and the sliding one does not (gpt-oss, half its layers sliding, tends to half)."""
    ref, _, ftw = tiny_model("gpt_oss")
    e = load(ftw, prefill_chunk=128, max_context=512)
    kv, sl = e.kv, e.kv.sliding
    base = kv.used  # (on CUDA the decode graphs hold a scratch page)
    sched = Scheduler(e, set(), 1, e.prefill_chunk, prefix_cache=False)
    seq = Sequence(prompt(300, seed=6), SamplingParams(max_tokens=100))
    sched.add(seq)
    peak, forward = [], e.forward
    e.forward = lambda batch, pool, **kw: peak.append(sl.used - 1) or forward(batch, pool, **kw)  # the dummy is the pool's
    while not seq.finish:
        sched.step()
        if not seq.finish:
            live = (kv.used, sl.used - 1)
    most = max(peak)
    assert live == (25 + base, 3) and most == 5
    assert (kv.n_pages, sl.n_pages) == (33, 17)
    one_pool = kv.bytes * (len(e.cfg.attention_layer_ids) + len(e.cfg.sliding_layer_ids))
    assert round((kv.bytes + sl.bytes) / one_pool, 2) == 0.68


def test_quality_log_probs_free_the_window_chunk_by_chunk(tiny_model):
    """bench quality's teacher-forced pass gives back the sliding pages as it goes, with the
    logits of one prefill."""
    from engine.bench.quality import log_probs
    e = load(tiny_model("gpt_oss")[2], prefill_chunk=24)
    ids = prompt(100, seed=8)
    want = torch.log_softmax(prefill_logits(e, ids), -1)
    assert rel_err(log_probs(e, ids), want) < 1e-5 and e.kv.sliding.used == 1


def test_follow_up_turns_reuse_the_kept_windows(tiny_model):
    """A follow-up that continues the previous prompt (the reasoning of the answer dropped) resumes
    at the prompt's end; one that continues the whole turn at the turn's end; one that leaves the
    turn between the two backs off to the prompt's end; once the windows are dropped, nothing is
    reused. Every answer is transformers'."""
    ref, _, ftw = tiny_model("gpt_oss")
    e = load(ftw, prefill_chunk=24)
    sched = Scheduler(e, set(), 1, e.prefill_chunk)
    convo = prompt(70, seed=7)
    first = run(sched, convo, n=30)                       # 99 tokens in KV when it ends
    reference(ref, first)
    for follow, cached in [(convo + [3, 1, 4], 64), (first.tokens + [5, 9], 96), (first.tokens[:90] + [2, 6], 64)]:
        seq = run(sched, follow, n=8)
        assert seq.cached == cached
        reference(ref, seq)
    sched.prefix.make_room(0, e.kv.sliding.n_pages)       # drops every window
    assert not sched.prefix.windows and e.kv.sliding.used == 1
    seq = run(sched, first.tokens + [5, 9], n=8)
    assert seq.cached == 0
    reference(ref, seq)


def test_preempted_sequences_resume_from_their_windows(tiny_model):
    """Three requests that together need more KV than either pool holds: the newest are preempted
    and resume at their kept windows; each answer equals its run alone."""
    e = load(tiny_model("gpt_oss")[2], kv_tokens=192, max_running=3, prefill_chunk=32)
    base = e.kv.used  # (on CUDA the decode graphs hold a scratch page)
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 256, (60,), generator=g).tolist() for _ in range(3)]
    alone = [run(Scheduler(e, set(), 1, 32, prefix_cache=False), p, n=40).output for p in prompts]
    sched = Scheduler(e, set(), 3, 32)
    seqs = together(sched, prompts, 40)
    assert [s.output for s in seqs] == alone
    assert sched.totals["preempted"] > 0 and sched.prefix.hit_tokens > 0
    assert e.kv.used == sched.prefix.pages + base



def test_a_model_whose_every_layer_slides(tmp_path):
    """A checkpoint with `sliding_window` and no `layer_types` (a Mixtral with a window): every
    layer's KV is in the sliding pool, the main pool holds no layer; tokens are transformers'
    across the window and after a follow-up that resumes at the kept window."""
    import tiny

    from engine.convert import convert
    ref = tiny.build("mixtral", tmp_path / "hf", sliding_window=20)
    convert(tmp_path / "hf", tmp_path / "ftw")
    e = load(tmp_path / "ftw", prefill_chunk=24)
    assert e.kv.k.shape[0] == 0 and len(e.cfg.sliding_layer_ids) == e.cfg.num_layers
    sched = Scheduler(e, set(), 1, 24)
    first = run(sched, prompt(70, seed=3), n=30)
    reference(ref, first)
    follow = run(sched, first.tokens + [5, 7], n=8)
    assert follow.cached == 96
    reference(ref, follow)

@pytest.mark.gpu
def test_graph_decode_past_the_window_matches_eager(tiny_model):
    """CUDA graphs read the sliding layers through their own static table: the same tokens as eager
    decode, 60 tokens past a 20-token window."""
    _, _, ftw = tiny_model("gpt_oss")
    ids = prompt(70, seed=4)
    outs = []
    for graph in (False, True):
        e = load(ftw, device="cuda", graph=graph, prefill_chunk=24)
        outs.append(run(Scheduler(e, set(), 1, 24, prefix_cache=False), ids, n=60).output)
        if graph:
            assert e.graphs.replays >= 59
        e.runtime.close()
    assert outs[0] == outs[1]
