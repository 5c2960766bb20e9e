"""The fill kernel against its reference, and CUDA-graph decode against eager decode."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from conftest import greedy, load  # noqa: E402

from freetoken_kernels import ref  # noqa: E402


def test_fill_kernel_matches_reference():
    from freetoken_kernels.fill_triton import fill_rows
    cuda = torch.cuda.is_available()
    src = torch.randint(0, 255, (12, 4096 * 3), dtype=torch.uint8)
    if cuda:
        src = src.pin_memory()  # read by the kernel over UVA
    dev = "cuda" if cuda else "cpu"
    want = torch.zeros(6, src.shape[1], dtype=torch.uint8)
    got = want.to(dev)
    victims = torch.tensor([4, 1, -1, -1], device=dev)
    fetch = torch.tensor([2, 5, -1, -1], device=dev)
    ref.fill_rows(src, want, victims.cpu(), fetch.cpu(), base=4)
    fill_rows(src, got, victims, fetch, base=4, chunk_words=1024)
    assert torch.equal(got.cpu(), want)
    assert torch.equal(want[4], src[6]) and torch.equal(want[1], src[9]) and not want[0].any()
    # with a signal, the last program to finish writes the flag and re-arms the counter
    count, flag = torch.zeros(1, dtype=torch.int32, device=dev), torch.zeros(1, dtype=torch.int32)
    if cuda:
        flag = flag.pin_memory()
    got.zero_()
    for value in (7, 9):
        fill_rows(src, got, victims, fetch, base=4, chunk_words=1024, signal=(count, flag, value))
        if cuda:
            torch.cuda.synchronize()
        assert torch.equal(got.cpu(), want) and flag.item() == value and count.item() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["fetch", "adaptive", "cpu", "static:1"])
def test_graph_decode_matches_eager(tiny_model, policy):
    _, _, ftw = tiny_model("qwen3_moe")
    prompt = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(4)).tolist()
    slot = load(ftw, device="cuda", graph=False).runtime.store.layout.slot_bytes
    outs = []
    for graph in (False, True):
        e = load(ftw, device="cuda", graph=graph, expert_budget=9 * slot, moe_policy=policy)
        e.runtime.qstar.start(1.0, 1.0, online=False)
        outs.append(greedy(e, prompt, 24))
        e.runtime.sync_stats()
        if graph:
            assert e.graphs.replays >= 23
            st = e.runtime.cache.stats
            assert st.fetched + st.cpu == st.misses
            assert (st.cpu > 0) == (policy != "fetch")
        e.runtime.close()
    assert outs[0] == outs[1]


@pytest.mark.gpu
def test_graphs_capture_batch_sizes_on_first_use(tiny_model):
    """Batch sizes 1 and max_running are captured at load, the others on their first step; streams
    joining and leaving decode as eager decode does, and no capture's warm-up steps (dummy tokens)
    reach the counters or the live sequences' KV."""
    from engine.config import SamplingParams
    from engine.scheduler import Scheduler, Sequence
    _, _, ftw = tiny_model("qwen3_moe")
    prompts = [torch.randint(0, 256, (12 + i,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(3)]
    outs, routed = [], []
    for graph in (False, True):
        e = load(ftw, device="cuda", graph=graph, max_running=4, moe_policy="fetch")
        if graph:
            assert sorted(e.graphs.graphs) == [1, 4]
        sched = Scheduler(e, set(), 4, 2048, prefix_cache=False)
        seqs = [Sequence(p, SamplingParams(max_tokens=8 + 4 * i)) for i, p in enumerate(prompts)]
        for s in seqs:
            sched.add(s)
        while sched.busy:
            sched.step()
        outs.append([s.output for s in seqs])
        e.runtime.sync_stats()
        routed.append(e.runtime.cache.stats.hits + e.runtime.cache.stats.misses)  # distinct experts per layer step
        if graph:
            assert sorted(e.graphs.graphs) == [1, 2, 3, 4] and e.graphs.replays > 0
        e.runtime.close()
    assert outs[0] == outs[1] and routed[0] == routed[1]


@pytest.mark.parametrize("arch,budget", [("qwen3_moe", None), ("qwen3_moe", 3), ("gpt_oss", 3), ("qwen3_next", 3)])
def test_prefill_warm_up_leaves_no_trace(tiny_model, arch, budget):
    """The load's prefill warm-up (run before the capture on CUDA; here directly, with the device
    tables on the CPU): its scratch page (and a hybrid's scratch state slot) goes back, the
    counters and the streamer's estimate are reset, and once the capture empties the tables,
    answers are those of a fresh load."""
    from engine.loader import warm_prefill
    _, _, ftw = tiny_model(arch)
    prompt = torch.randint(0, 256, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    kw = dict(device="cpu", graph=True, moe_policy="fetch")
    e = load(ftw, **kw)
    if budget:
        e = load(ftw, expert_budget=budget * e.runtime.store.n_experts * e.runtime.store.layout.slot_bytes, **kw)
    want = greedy(e, prompt, 6)
    e = load(ftw, **kw) if budget is None else load(ftw, expert_budget=e.runtime.cache.nbytes, **kw)
    used, free_states = e.kv.used, e.states and list(e.states.free)
    warm_prefill(e)
    st = e.runtime.cache.stats
    assert (e.states and list(e.states.free)) == free_states
    assert e.kv.used == used and st.hits == st.misses == st.scan_steps == 0 and e.runtime.streamer.compute_tokens == 0
    if budget:
        assert e.runtime.cache.tables.owned > 0  # it filled: the capture's clear() is what empties them
        e.runtime.cache.tables.clear()
    assert greedy(e, prompt, 6) == want


def test_gemm_warm_up_runs_each_distinct_projection_at_every_row_count(tiny_model):
    """The load's GEMM warm-up: each distinct dense projection of the layers (shape, dtype, bias)
    runs once at every row count from 1 to `rows`; a projection of a shape already warmed and the
    LM head (its rows are the sampled ones) do not run; a later prefill warm-up (a rebuild of the
    experts) does not run it again."""
    from engine.loader import WARM_GEMM_ROWS, warm_gemms, warm_prefill
    _, _, ftw = tiny_model("qwen3_moe")
    e = load(ftw, device="cpu", graph=False)
    calls = []
    mods = [m for m in e.model.modules() if isinstance(m, torch.nn.Linear)]
    hooks = [m.register_forward_hook(lambda m, i, o: calls.append((m, i[0].shape[0]))) for m in mods]
    warm_gemms(e.model, 5)
    for h in hooks:
        h.remove()
    keys = {(m.in_features, m.out_features, m.weight.dtype, m.bias is not None) for m in e.model.model.layers.modules()
            if isinstance(m, torch.nn.Linear)}
    assert len(keys) < len([m for m in e.model.model.layers.modules() if isinstance(m, torch.nn.Linear)])
    assert sorted(n for _, n in calls) == sorted(list(range(1, 6)) * len(keys))
    assert len({m for m, _ in calls}) == len(keys) and e.model.lm_head not in {m for m, _ in calls}
    qkv = e.model.model.layers[0].self_attn.qkv_proj
    seen = []
    for _ in range(2):  # the second warm-up runs only the prefills
        calls.clear()
        hook = qkv.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
        warm_prefill(e)
        hook.remove()
        seen.append(list(calls))
    assert seen[0] == list(range(1, WARM_GEMM_ROWS + 1)) + seen[1] and 0 < len(seen[1]) <= 3


def test_no_cpu_branch_while_the_cache_holds_every_expert(tiny_model):
    """Device-controlled decode (here with the device tables on the CPU) of a cache that holds
    every expert has no CPU branch, whatever the policy: a miss (the load's first steps) is
    fetched, and the answers are eager decode's. Resized to hold fewer, it has the branch again."""
    _, _, ftw = tiny_model("qwen3_moe")
    prompt = torch.randint(0, 256, (10,), generator=torch.Generator().manual_seed(6)).tolist()
    want = greedy(load(ftw, device="cpu", graph=False, moe_policy="adaptive"), prompt, 6)
    e = load(ftw, device="cpu", graph=True, moe_policy="adaptive")
    rt = e.runtime
    rt.qstar.start(1.0, 1.0, online=False)                          # q* 0.5: the policy would split
    rt.device_ctl.set_q()
    assert rt.cache.holds_all and not rt.device_ctl.branch and set(rt.device_ctl.q_host) == {1.0}
    rt.cache.tables.clear()                                         # cold, as before the experts are in
    assert greedy(e, prompt, 6) == want
    st = rt.cache.stats
    assert st.misses > 0 and st.cpu == 0 and st.fetched == st.misses
    from engine.elastic import resize_experts
    resize_experts(e, 2 * rt.store.n_experts * rt.store.layout.slot_bytes, 1)    # two layers' experts
    rt.device_ctl.set_q()
    assert not rt.cache.holds_all and rt.device_ctl.branch and set(rt.device_ctl.q_host) == {0.5}
