"""Prefill of long chunks: streamed (double-buffered layers: the experts not resident), routed, or
chosen per layer by the bandwidth model; every mode gives the logits of plain prefill."""
import pytest
import torch
from conftest import greedy, load, prefill_logits


def empty_cache(runner):
    """Evict every expert (the budget holds them all, so they were preloaded)."""
    t = runner.runtime.cache.tables
    t.release(t.reserve(runner.runtime.cache.n_slots))


@pytest.mark.parametrize("mode", ["stream", "routed", "adaptive"])
def test_prefill_modes_match_plain_prefill(tiny_model, mode):
    _, _, ftw = tiny_model("qwen3_moe")
    ids = torch.randint(0, 256, (96,), generator=torch.Generator().manual_seed(12)).tolist()
    want = prefill_logits(load(ftw), ids)
    e = load(ftw, prefill_mode=mode, moe_policy="fetch")
    empty_cache(e)
    e.runtime.qstar.start(1e6, 1.0)  # a fast link: adaptive streams whenever a layer misses
    first = prefill_logits(e, ids)
    second = prefill_logits(e, ids)  # buffers were returned and reused
    assert torch.equal(first, want) and torch.equal(second, want)
    st = e.runtime.cache.stats
    assert st.scan_steps == 6
    assert (st.stream_layers > 0) == (mode != "routed")
    assert e.runtime.streamer.slots is None  # buffers given back after each chunk


def test_adaptive_streams_missing_experts_that_the_chunk_routes_to_whatever_the_link(tiny_model):
    """A long chunk routes to every expert: streaming a layer's missing experts moves nothing in
    vain, so adaptive streams them even over a slow link (the scripted test below covers the
    link's part); a layer with every expert resident is not streamed."""
    _, _, ftw = tiny_model("qwen3_moe")
    ids = torch.randint(0, 256, (96,), generator=torch.Generator().manual_seed(13)).tolist()
    streamed = []
    for evicted in (0, 12):  # none; layer 0's 8 experts and half of layer 1's
        e = load(ftw, prefill_mode="adaptive", moe_policy="fetch")
        t = e.runtime.cache.tables
        t.release(t.reserve(evicted))
        e.runtime.qstar.start(1e-6, 1.0)  # GB/s: moving an expert takes forever
        prefill_logits(e, ids)
        streamed.append(e.runtime.cache.stats.stream_layers)
    assert streamed == [0, 2], streamed  # layer 0 too: it decides on its own routes


def test_a_streamed_layer_moves_only_its_experts_that_are_not_resident(tiny_model, monkeypatch):
    """Forced streaming with some experts resident (layer 0 runs on the CPU, so the buffers come
    from the empty slots and the coldest experts; the few a short request used stay): a buffered
    layer reads those from their cache slots, moves the others, and the logits are the same."""
    _, _, ftw = tiny_model("qwen3_moe")
    ids = torch.randint(0, 256, (96,), generator=torch.Generator().manual_seed(14)).tolist()
    want = prefill_logits(load(ftw, prefill_mode="routed", moe_policy="static:1"), ids)
    e = load(ftw, prefill_mode="stream", moe_policy="static:1")
    greedy(e, [5, 6, 7], 2)  # a short request: a few experts of every layer become the most recent
    moved, record = [], e.runtime.cache.stats.record
    monkeypatch.setattr(e.runtime.cache.stats, "record", lambda **kw: (moved.append(kw["streamed"])
                                                                        if "streamed" in kw else None, record(**kw)))
    assert torch.equal(prefill_logits(e, ids), want)
    E = e.runtime.cache.n_experts
    assert len(moved) == 2 and 0 < min(moved) and max(moved) < E, moved  # layers 1, 2: partly resident


def test_prefill_chunk_is_sized_from_free_memory(tiny_model):
    """Half the free memory per chunk token, a power of two in [256, 16384], at most the context;
    an explicit --prefill-chunk wins."""
    from engine.loader import prefill_chunk_for
    from engine.synthetic import synthetic_config
    cfg = synthetic_config("qwen3-30b-a3b")
    sizes = [prefill_chunk_for(free << 20, cfg, 32768, torch.bfloat16) for free in (0, 1300, 1500, 3000, 10**6)]
    assert sizes[0] == 256 and sizes[-1] == 16384
    assert sizes == sorted(sizes) and len(set(sizes)) == 5 and all(s & (s - 1) == 0 for s in sizes)
    assert prefill_chunk_for(10**12, cfg, 4096, torch.bfloat16) == 4096
    _, _, ftw = tiny_model("qwen3_moe")
    assert load(ftw).prefill_chunk >= 256
    assert load(ftw, prefill_chunk=100).prefill_chunk == 100


def test_stream_decision_uses_compute_time_only(tiny_model, monkeypatch):
    """With a scripted clock: a layer's compute is its window less its own transfers (its fills,
    or its wait for a streamed buffer), measured for streamed layers too, so a chunk stops
    streaming when its layers get cheap; a new chunk starts from the last measurement scaled by
    its tokens. What streaming would move in vain is the next layer's non-resident experts that
    this layer's share of routed experts leaves out (a chunk's first layer: its own routes')."""
    import engine.moe.prefill as prefill
    _, _, ftw = tiny_model("qwen3_moe")
    e = load(ftw, prefill_mode="adaptive", moe_policy="fetch")
    rt = e.runtime
    per_expert = 1e-3                                     # s to fetch one expert
    rt.qstar.start(rt.store.layout.slot_bytes / per_expert / 1e9, 1.0)
    st, E, now, loaded = rt.streamer, rt.cache.n_experts, [0.0], []
    monkeypatch.setattr(st, "cuda", False)  # the host clock, scripted, instead of CUDA events
    monkeypatch.setattr(prefill, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: now[0])}))
    monkeypatch.setattr(st, "_load", lambda layer, held: loaded.append(layer))

    def layer(routed: int, compute: float, wait: float, missing: int | None = E) -> None:
        """A layer step routing to `routed` distinct experts, `missing` experts of the next layer
        not resident (None: that layer is not cacheable)."""
        now[0] += compute / 2
        with st.transfer():
            now[0] += wait
        now[0] += compute / 2
        st.maybe_prefetch(1, torch.arange(routed).view(-1, 1), None if missing is None else torch.arange(E) - missing)

    st.begin(100, torch.zeros(100, 1, dtype=torch.int64))  # every expert resident: nothing to stream
    layer(2, compute=1e-3, wait=2 * per_expert)           # 6 of 8 streamed in vain = 6 ms > 1 ms: fetch
    assert loaded == [] and st.compute == pytest.approx(1e-3)
    layer(E - 1, compute=20e-3, wait=(E - 1) * per_expert)  # 1 in vain (1 ms) hides behind 20 ms: stream
    assert loaded == [1]
    layer(E - 1, compute=20e-3, wait=0.5)                 # a long stream wait is not compute
    assert st.compute == pytest.approx(20e-3) and loaded == [1, 1]
    layer(E - 1, compute=0.5e-3, wait=0.0)                # a streamed layer got cheap: fetch again
    assert loaded == [1, 1]
    layer(E, compute=0.5e-3, wait=0.0)                    # every expert routed: nothing in vain, stream
    assert loaded == [1, 1, 1]
    layer(E, compute=20e-3, wait=0.0, missing=0)          # nothing to move: fetch (all hits)
    layer(E, compute=20e-3, wait=0.0, missing=None)       # never stream a layer that is not cached
    assert loaded == [1, 1, 1]
    st.end()
    # a chunk of 10 tokens after one of 100: its first layer decides on its own routes, against
    # the last measurement scaled by its tokens (2 ms), its experts no longer resident
    monkeypatch.setattr(rt.cache.tables, "resident", lambda first, n: torch.full((n,), -1))
    st.begin(10, torch.arange(2).repeat(5).view(10, 1))  # 6 in vain = 6 ms > 2 ms: fetch
    assert st.estimate() == pytest.approx(2e-3) and loaded == [1, 1, 1]
    st.end()
    st.begin(10, torch.arange(10).remainder(E).view(10, 1))  # every expert routed: stream layer 0
    assert loaded == [1, 1, 1, 0]


def test_a_long_chunk_queues_its_first_layers_loads_before_its_first_attention(tiny_model, monkeypatch):
    """A chunk of more than SMALL_GROUP_ROUTES routes an expert routes to every expert of a layer:
    the first layer's loads are decided before the forward and queued at its first layer's step
    (before the wait for its router), so that they run behind its attention instead of after its
    router; a shorter chunk decides at its first layer, on its routes. Either way a layer's loads
    are queued after the attention before them, and which experts are resident is read once for
    the chunk (no layer plans against the cache). The logits are plain prefill's either way."""
    from engine.moe.block import MoEBlock
    from engine.moe.prefill import SMALL_GROUP_ROUTES
    _, _, ftw = tiny_model("qwen3_moe")
    e = load(ftw, prefill_mode="adaptive", moe_policy="fetch")
    rt, events = e.runtime, []
    K, E = e.cfg.router.top_k, rt.cache.n_experts
    load_, go, route = rt.streamer._load, rt.streamer.go, MoEBlock.route
    monkeypatch.setattr(rt.streamer, "_load", lambda layer, held: (events.append(f"load {layer}"), load_(layer, held)))
    monkeypatch.setattr(rt.streamer, "go", lambda: (events.append("go"), go()))
    queued = []  # copies queued by each layer's router: none before the first layer's step
    resident, reads = rt.cache.tables.resident, []
    monkeypatch.setattr(rt.cache.tables, "resident", lambda base, n: (reads.append(base), resident(base, n))[1])
    monkeypatch.setattr(MoEBlock, "route", lambda self, x: (events.append(f"route {self.moe_index}"),
                                                            queued.append(rt.streamer.loaded), route(self, x))[2])
    g = torch.Generator().manual_seed(16)
    long, short = SMALL_GROUP_ROUTES * E // K + 1, SMALL_GROUP_ROUTES * E // K
    # a long chunk decides before the forward and queues the copies at the first layer's step
    for n, first in ((long, ["load 0", "route 0", "go"]), (short, ["route 0", "load 0", "load 1"])):
        ids = torch.randint(0, 256, (n,), generator=g).tolist()
        want = prefill_logits(load(ftw), ids)
        empty_cache(e)
        rt.qstar.start(1e6, 1.0)  # a fast link: streams whenever a layer misses
        events.clear(), queued.clear(), reads.clear()
        assert torch.equal(prefill_logits(e, ids, step=True), want)
        assert reads == [0] and rt.streamer.held is None, reads
        assert n == short or (queued[0] == 0 and queued[1] > 0), queued
        assert events[:3] == first and "load 1" in events, (n, events)
        assert not rt.streamer.active and rt.streamer.slots is None


def test_a_prefill_forward_reads_whether_every_expert_is_resident_once(tiny_model, monkeypatch):
    """Stepped by the runner, a prefill forward reads it before its work is queued and its first
    layer takes that; a forward not stepped by the runner reads it at its first layer."""
    _, _, ftw = tiny_model("qwen3_moe")
    from engine.moe.prefill import SMALL_GROUP_ROUTES
    e = load(ftw)  # the budget holds every expert
    rt, reads = e.runtime, []
    n = SMALL_GROUP_ROUTES * rt.cache.n_experts // e.cfg.router.top_k + 1  # (long enough to stream, were any missing)
    ids = torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(3)).tolist()
    resident_slots = rt._resident_slots
    monkeypatch.setattr(rt, "_resident_slots", lambda: (reads.append(1), resident_slots())[1])
    want = prefill_logits(e, ids)
    assert reads == [1]
    assert torch.equal(prefill_logits(e, ids, step=True), want) and reads == [1, 1]
    assert rt.cache.stats.misses == 0


def test_buffers_hold_a_layer_when_three_fit_else_an_even_share_of_it():
    from engine.moe.prefill import group_size
    assert [group_size(128, n) for n in (384, 383, 250, 192, 128, 96, 48, 47)] == [128, 64, 64, 64, 32, 32, 16, 0]
    assert group_size(8, 24) == 8 and group_size(8, 12) == 4 and group_size(8, 6) == 2
    # where the link sets the pace (a short chunk): the smallest groups instead of whole layers
    assert [group_size(128, n, link_bound=True) for n in (384, 128, 48, 47)] == [16, 32, 16, 0]


def test_a_short_chunk_whose_layers_move_slower_than_they_compute_takes_small_buffers(tiny_model):
    """A chunk's group size: the largest that fits while a whole layer moves faster than the last
    measured compute (scaled to the chunk), the smallest once it moves slower, if the chunk is
    short; the largest while nothing is measured, and for a long chunk."""
    from engine.moe.prefill import SMALL_GROUP_ROUTES
    _, _, ftw = tiny_model("qwen3_moe")
    e = load(ftw, prefill_mode="adaptive", moe_policy="fetch")
    rt = e.runtime
    st, E, layer_s = rt.streamer, rt.cache.n_experts, 1e-3  # a whole layer over the link: 1 ms
    assert rt.cache.n_slots >= 3 * E
    rt.qstar.start(E * rt.store.layout.slot_bytes / layer_s / 1e9, 1.0)
    short, long = (torch.zeros(n, 1, dtype=torch.int64) for n in (100, SMALL_GROUP_ROUTES * E + 1))
    got = []
    for compute, ids in ((0.0, short), (2e-3, short), (0.5e-3, short), (0.5e-3, long)):
        st.compute, st.compute_tokens = compute, ids.shape[0] if compute else 0  # measured at this length
        st.begin(ids.shape[0], ids)
        got.append(st.G)
        st.end()
    assert got == [E, E, -(-E // 8), E], got


@pytest.mark.parametrize("layers_of_slots", [4, 1.5])
def test_streaming_over_many_layers_with_a_partial_cache_matches_plain_prefill(tmp_path, layers_of_slots):
    """Seven layers, a cache of four layers' experts (every chunk reserves the two buffers from it,
    so layers alternate between buffered with some experts resident and routed), or of one and a
    half layers' (each streamed layer runs in passes over groups of its experts, two buffers of
    a group each), a short request between prompts: every prompt's logits, and a follow-up's, are
    plain prefill's."""
    import tiny

    from engine.convert import convert
    tiny.build("qwen3_moe", tmp_path / "hf", num_hidden_layers=7)
    convert(tmp_path / "hf", tmp_path / "ftw")
    full = load(tmp_path / "ftw")
    slot = full.runtime.store.layout.slot_bytes
    g = torch.Generator().manual_seed(15)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (96, 160, 80)]
    for mode in ("adaptive", "stream"):
        e = load(tmp_path / "ftw", prefill_mode=mode, moe_policy="fetch", expert_budget=int(8 * layers_of_slots) * slot)
        passes, each = [], e.runtime.streamer.passes

        def counted(layer):  # the passes of each streamed layer
            passes.append(0)
            for slots in each(layer):
                passes[-1] += 1
                yield slots
        e.runtime.streamer.passes = counted
        e.runtime.qstar.start(1e6, 1.0)  # a fast link: adaptive streams whenever an expert misses
        for p in prompts:
            assert torch.equal(prefill_logits(e, p), prefill_logits(full, p)), (mode, len(p))
            greedy(e, p[:5], 2)
        assert e.runtime.cache.stats.stream_layers > 0 and e.runtime.streamer.slots is None
        assert (e.runtime.streamer.G, max(passes)) == ((8, 1) if layers_of_slots == 4 else (4, 2))
        assert e.runtime.cache.stats.stream_passes == sum(passes)
