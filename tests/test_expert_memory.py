"""Two-level expert memory on the CPU cache tier: hits, misses, fills, LRU eviction, and output
invariance to the expert budget."""
import os
import re

import pytest
import torch
from conftest import greedy, load

from engine.errors import UserError
from freetoken_kernels import ref


def test_budget_invariance_and_counters(tiny_model):
    _, _, ftw = tiny_model("qwen3_moe")
    ids = torch.randint(0, 256, (24,), generator=torch.Generator().manual_seed(3)).tolist()
    full = load(ftw)
    slot = full.runtime.store.layout.slot_bytes
    n_total = 3 * 8
    want = greedy(full, ids, 24)
    assert full.runtime.cache.stats.misses == 0  # everything resident from the start
    results = {}
    for slots in (8, 12, 20, n_total - 1):
        e = load(ftw, expert_budget=slots * slot)
        assert e.runtime.cache.n_slots == slots
        assert greedy(e, ids, 24) == want
        results[slots] = e.runtime.cache.stats
    for slots, st in results.items():
        assert st.misses > 0 and st.hits > 0 and st.cpu == 0
        assert st.fetched == st.misses and st.bytes_filled == st.fetched * slot
    # a bigger cache misses no more often than a smaller one (LRU inclusion for this trace)
    misses = [results[s].misses for s in sorted(results)]
    assert misses == sorted(misses, reverse=True) and misses[0] > misses[-1]


def test_budget_below_one_layer_is_refused(tiny_model):
    _, _, ftw = tiny_model("qwen3_moe")
    slot = load(ftw).runtime.store.layout.slot_bytes
    with pytest.raises(UserError, match="raise --expert-budget") as e:
        load(ftw, expert_budget=7 * slot)
    suggested = int(re.search(r"at least (\d+)MiB", str(e.value)).group(1))
    assert suggested >= 1 and load(ftw, expert_budget=suggested << 20).runtime.cache.n_slots >= 8


def tables(S, L, E):
    return (torch.full((L * E,), -1, dtype=torch.int64), torch.full((S,), -1, dtype=torch.int64),
            torch.full((S,), -1, dtype=torch.int64), torch.full((L * E,), -1, dtype=torch.int64))


def test_plan_invariants_random():
    g = torch.Generator().manual_seed(0)
    S, L, E, K = 10, 3, 8, 3
    slot_of, owner_of, last_use, seen = tables(S, L, E)
    for clock in range(1, 300):
        layer = int(torch.randint(0, L, (), generator=g))
        T = int(torch.randint(1, 5, (), generator=g))
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
        q = float(torch.rand((), generator=g))
        resident_before, seen_before, room = slot_of.clone(), seen.clone(), int((owner_of < 0).sum())
        route, victims, fetch, hits, misses = ref.plan(ids, layer, E, slot_of, owner_of, last_use, seen, clock, q)
        flat = ids + layer * E
        assert hits + misses == flat.unique().numel()
        missed = [f for f in flat.unique().tolist() if resident_before[f] < 0]
        recurring = any(ref.recurs(int(seen_before[f]), clock, L) for f in missed)
        assert len(victims) == ref.split_fetch(misses, q, max(room, recurring))  # empty slots lead the LRU order
        # no slot double-booked; tables agree with each other
        live = owner_of[owner_of >= 0]
        assert live.unique().numel() == live.numel()
        assert (slot_of[live] == (owner_of >= 0).nonzero().flatten()).all()
        # every route placed exactly once: on a slot holding its expert, or on the CPU (-1)
        on_gpu = route >= 0
        assert (owner_of[route[on_gpu]] == flat[on_gpu]).all()
        assert (resident_before[flat[~on_gpu]] < 0).all()  # only misses go to the CPU
        # a hit's slot was never taken as a victim
        assert not set(victims.tolist()) & set(resident_before[flat][resident_before[flat] >= 0].tolist())


def test_plan_evicts_least_recently_used():
    S, L, E = 4, 1, 8
    slot_of, owner_of, last_use, seen = tables(S, L, E)
    for clock, e in enumerate([0, 1, 2, 3], start=1):
        ref.plan(torch.tensor([[e]]), 0, E, slot_of, owner_of, last_use, seen, clock, 1.0)
    ref.plan(torch.tensor([[0]]), 0, E, slot_of, owner_of, last_use, seen, 5, 1.0)  # refresh 0
    ref.plan(torch.tensor([[4]]), 0, E, slot_of, owner_of, last_use, seen, 6, 1.0)
    assert slot_of[1] == -1 and slot_of[0] >= 0 and slot_of[4] >= 0  # 1 was the LRU


@pytest.mark.parametrize("q", [0.0, 0.13, 0.3, 0.5, 0.61, 0.77, 0.9, 1.0])
def test_split_fetch_matches_brute_force(q):
    for m in range(0, 40):
        f = ref.split_fetch(m, q)
        assert 0 <= f <= m
        if 0 < q < 1:
            cost = [max(c / q, (m - c) / (1 - q)) for c in range(m + 1)]
            assert cost[f] == pytest.approx(min(cost))
        else:
            assert f == (m if q == 1 else 0)


def test_recurring_miss_is_cached():
    """A miss left to the CPU is never cached: with q < 0.5 a lone miss would run on the CPU at
    every step. When it recurs (demanded at its layer's previous step) it is fetched once and
    hits from then on; a first demand into a full cache still follows the split."""
    S, L, E = 4, 2, 8
    slot_of, owner_of, last_use, seen = tables(S, L, E)
    ref.plan(torch.tensor([[4, 5, 6, 7]]), 1, E, slot_of, owner_of, last_use, seen, 1, 1.0)  # a full cache
    got = []
    for clock in range(2, 10):  # two layers per token, the same experts every token
        layer = clock % L
        _, victims, _, hits, misses = ref.plan(torch.tensor([[1 if layer == 0 else 4]]), layer, E, slot_of,
                                               owner_of, last_use, seen, clock, 0.3)
        if layer == 0:
            got.append((len(victims), hits))
    assert got == [(0, 0), (1, 0), (0, 1), (0, 1)]  # first demand: F = 0 of M = 1; recurring: fetched; hits
    assert ref.split_fetch(1, 0.3) == 0 and ref.split_fetch(1, 0.3, 1) == 1
    assert ref.split_fetch(5, 0.0, 1) == 0 and ref.split_fetch(0, 0.3, 1) == 0  # cpu policy; no miss


def test_empty_slots_take_the_misses():
    """A fill into an empty slot evicts nothing: first demands are fetched into the empty slots
    first in line (a cache larger than the steps' misses fills up), and split once none is left."""
    S, E = 3, 8
    t = tables(S, 1, E)
    fills = [len(ref.plan(torch.tensor([e]), 0, E, *t, clock, 0.3)[1]) for clock, e in enumerate([[0, 1], [2, 3], [4]], 1)]
    assert fills == [2, 1, 0]  # the split alone: F = 0 of M = 2 and of M = 1 at q = 0.3
    assert ref.split_fetch(2, 0.3) == 0 and ref.split_fetch(2, 0.3, 5) == 2


def test_host_tables_match_reference_plan():
    """The eager path's O(K) planner makes exactly the reference's decisions."""
    from engine.moe.tables import HostTables
    g = torch.Generator().manual_seed(1)
    for S, q in ((9, 1.0), (12, 0.4), (10, 0.0), (16, 0.75)):
        L, E, K = 3, 8, 3
        host = HostTables(S, L * E, L)
        slot_of, owner_of, last_use, seen = tables(S, L, E)
        for clock in range(1, 200):
            layer = int(torch.randint(0, L, (), generator=g))
            ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(int(torch.randint(1, 4, (), generator=g)))])
            cold = bool(torch.rand((), generator=g) < 0.3)
            want = ref.plan(ids, layer, E, slot_of, owner_of, last_use, seen, clock, q, cold)
            got = host.plan(ids, layer * E, q, cold)
            assert got[0].tolist() == want[0].flatten().tolist()
            assert (got[1], got[2], got[3], got[4]) == (want[1].tolist(), want[2].tolist(), want[3], want[4])
            assert host.slot_of == slot_of.tolist() and host.owner_of == owner_of.tolist()


def test_cache_stats_record_and_delta():
    """record() derives the CPU share and the bytes; `after - before` is the span's own counts."""
    from dataclasses import replace

    from engine.moe.cache import CacheStats
    st = CacheStats()
    st.record(slot_bytes=10, hits=3, misses=4, fetched=1)
    st.record(slot_bytes=10, streamed=8, passes=2)
    st.record(scan=True)
    assert st == CacheStats(hits=3, misses=4, fetched=1, cpu=3, bytes_filled=90, bytes_cpu=30, scan_steps=1,
                            stream_layers=1, stream_passes=2)
    before = replace(st)
    st.record(slot_bytes=10, hits=1, misses=2, fetched=2)
    assert st - before == CacheStats(hits=1, misses=2, fetched=2, bytes_filled=20)
    assert before + (st - before) == st and (st - before).hit_rate == pytest.approx(1 / 3)


def test_host_and_device_tables_share_one_interface():
    """Both residency tables implement ResidencyTables with the same results for loading,
    reserving (none too) and releasing prefill buffers and reading a layer's residency."""
    from engine.moe.tables import DeviceTables, HostTables, ResidencyTables
    L, E, S = 2, 4, 6
    got = []
    for t in (HostTables(S, L * E, L), DeviceTables(S, L * E, E, torch.device("cpu"))):
        assert isinstance(t, ResidencyTables)
        t.install_block(0, 0, E)
        t.release(t.reserve(0))  # nothing to reserve: nothing to release
        steps = [t.owned, t.resident(0, E).tolist(), t.resident(E, E).tolist()]
        reserved = t.reserve(3)  # none used yet: the lowest slots, owners evicted
        steps += [sorted(reserved), t.owned, t.resident(0, E).tolist()]
        t.release(reserved)
        route, *rest = t.plan(torch.tensor([[0, 1]]), E, 1.0)  # fills go to the released slots first
        steps += [route.tolist(), rest]
        got.append(steps)
    assert got[0] == got[1]


def test_host_tables_match_the_device_tables_through_buffers():
    """Mixed plans (cold or not) and prefill buffers reserved and released, then the experts
    adopted by smaller tables (an elastic resize) and more plans: the host tables decide exactly
    as the device tables (the reference's plan) every time, and never fill a reserved slot (the
    misses beyond the other slots stay on the CPU)."""
    from engine.moe.tables import DeviceTables, HostTables
    g = torch.Generator().manual_seed(5)
    L, E, S, K = 3, 8, 12, 3
    host, dev = HostTables(S, L * E, L), DeviceTables(S, L * E, E, torch.device("cpu"))
    held, short = [], 0
    for step in range(400):
        if step == 300:  # resize: every buffer given back first, as the engine does at a safe point
            if held:
                host.release(held), dev.release(held)
                held = []
            small_h, small_d = HostTables(S - 3, L * E, L), DeviceTables(S - 3, L * E, E, torch.device("cpu"))
            assert small_h.adopt(host) == small_d.adopt(dev)
            host, dev = small_h, small_d
        op = int(torch.randint(0, 10, (), generator=g))
        if op < 8:
            layer = int(torch.randint(0, L, (), generator=g))
            ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(int(torch.randint(1, 3, (), generator=g)))])
            cold = bool(torch.rand((), generator=g) < 0.5)
            a, b = host.plan(ids, layer * E, 1.0, cold), dev.plan(ids, layer * E, 1.0, cold)
            assert a[0].tolist() == b[0].tolist() and a[1:] == b[1:]
            assert not set(a[1]) & set(held)  # misses that do not fit beside the buffers go to the CPU
            assert len(a[1]) == min(a[4], len(host.owner_of) - len(held) - a[3])
            short += len(a[1]) < a[4]
        elif not held:
            n = int(torch.randint(2, 9, (), generator=g))  # up to 8 of 12: a plan may not fit beside them
            held = host.reserve(n)
            assert held == dev.reserve(n)
        else:
            host.release(held), dev.release(held)
            held = []
        assert host.slot_of == dev.slot_of.tolist() and host.owner_of == dev.owner_of.tolist()
    assert short > 10  # plans that did not fit beside the buffers


def test_long_prefill_keeps_the_decode_working_set(tiny_model):
    """A long prompt scans nearly every expert; its fills enter cold, so the experts the running
    decode uses stay resident. A short prompt runs like decode (here: the q* split, once the
    chat's first misses have filled the cache's 12 slots, half the experts)."""
    from engine.config import SamplingParams
    from engine.scheduler import Scheduler, Sequence
    _, _, ftw = tiny_model("qwen3_moe")
    e = load(ftw, expert_budget=12 * load(ftw).runtime.store.layout.slot_bytes, moe_policy="adaptive")
    e.runtime.qstar.start(1.0, 1.0, online=False)
    sched = Scheduler(e, set(), 2, 512, prefix_cache=False)
    g = torch.Generator().manual_seed(11)
    chat = Sequence(torch.randint(0, 256, (6,), generator=g).tolist(), SamplingParams(max_tokens=40))
    sched.add(chat)
    for _ in range(12):
        sched.step()
    c = e.runtime.cache
    hot = {f for f in range(3 * 8) if c.tables.slot_of[f] >= 0 and c.tables.seen[f] >= c.tables.clock - 3 * 3}
    assert hot and c.stats.scan_steps == 0 and c.stats.cpu > 0  # short prompt: like decode
    long = Sequence(torch.randint(0, 256, (200,), generator=g).tolist(), SamplingParams(max_tokens=1))
    sched.add(long)
    while not long.n_cached:  # the decode step launched ahead, then the long prompt's prefill batched
        sched.step()          # with the chat's next decode step
    assert c.stats.scan_steps == 3
    assert all(c.tables.slot_of[f] >= 0 for f in hot)


def test_store_loads_in_the_background():
    """load() returns at once with the store's addresses; wait() gives the contents, or raises the
    reader's error; stop() abandons the read once the bank in flight is done. The read takes
    only the shard's experts of each bank (rank 1 of 2 here: rows 1, 3 of layer 0, then 0, 2),
    and the padding row of a shard's smaller layer stays zero."""
    import threading
    from concurrent.futures import Future
    from engine.moe.layout import SlotLayout
    from engine.moe.shard import ExpertShard
    from engine.moe.store import HostExpertStore, bank_name
    layout = SlotLayout.for_experts(8, 4, torch.float32)

    class Reader:
        path = "/no/such/ftw"  # no early read began for it (ftw.early)

        def __init__(self, fail=None):
            self.reads, self.fail, self.go, self.inside = [], fail, threading.Event(), threading.Event()

        def read_rows(self, name, rows, out):
            self.inside.set()
            assert self.go.wait(10)
            self.reads.append((name, rows))
            if name == self.fail:
                raise OSError("the disk went away")
            return out.fill_(len(self.reads))

    r, one = Reader(), ExpertShard(0, 1, 2)
    store = HostExpertStore.load(r, [1, 3], one, layout)
    ptr = store.rows.data_ptr()
    assert r.reads == [] and len(store.banks) == 2  # the read waits; the addresses are there
    r.go.set()
    store.wait()
    assert r.reads == [(bank_name(1), [0, 1]), (bank_name(3), [0, 1])]
    assert store.rows.data_ptr() == ptr and store.read_seconds > 0
    assert (store.banks[0] == 1).all() and (store.banks[1] == 2).all()
    r = Reader()
    r.go.set()
    store = HostExpertStore.load(r, [1, 3], ExpertShard(1, 2, 3, lambda out: out), layout)  # 3 experts, 2 ranks
    store.wait()
    assert r.reads == [(bank_name(1), [1]), (bank_name(3), [0, 2])] and store.n_experts == 2
    assert (store.banks[0][0] == 1).all() and (store.banks[0][1] == 0).all() and (store.banks[1] == 2).all()
    bad = Reader(fail=bank_name(3))
    bad.go.set()
    with pytest.raises(OSError, match="went away"):
        HostExpertStore.load(bad, [1, 3], one, layout).wait()
    r = Reader()
    store = HostExpertStore.load(r, [1, 3], one, layout)
    assert r.inside.wait(10)
    threading.Timer(0.05, r.go.set).start()
    store.stop()
    assert r.reads == [(bank_name(1), [0, 1])]
    store.wait()  # nothing left to wait for
    r, first = Reader(), Future()  # after another read (the dense weights'): not before it is done
    r.go.set()
    store = HostExpertStore.load(r, [1, 3], one, layout, after=first)
    assert not r.inside.wait(0.2) and r.reads == []
    first.set_result(None)
    store.wait()
    assert len(r.reads) == 2

    class Stepped(Reader):  # reads a bank each time it is let
        def __init__(self, fail=None):
            super().__init__(fail)
            self.go.set()
            self.steps = threading.Semaphore(0)

        def read_rows(self, name, rows, out):
            assert self.steps.acquire(timeout=10)
            return super().read_rows(name, rows, out)
    r = Stepped()
    store = HostExpertStore.load(r, [1, 3], one, layout)
    waiters = [threading.Thread(target=store.wait_bank, args=(i,)) for i in (0, 1)]
    for t in waiters:
        t.start()
    r.steps.release()
    waiters[0].join(10)
    assert not waiters[0].is_alive() and waiters[1].is_alive()  # bank 0 is there, bank 1 is not yet
    r.steps.release()
    waiters[1].join(10)
    assert not waiters[1].is_alive()
    store.wait()
    bad = Stepped(fail=bank_name(1))
    bad.steps.release()
    store = HostExpertStore.load(bad, [1, 3], one, layout)
    store.wait_bank(1)  # a failed read holds no one
    with pytest.raises(OSError, match="went away"):
        store.wait()



def test_expert_read_started_before_torch_is_adopted_by_the_load(tiny_model):
    """ftw.early reads the banks of an FTW directory without torch (a process that imports it and
    the CLI's helpers has not imported torch); the load adopts that buffer instead of reading
    again, once, and greedy tokens are those of a load that read the banks itself."""
    import subprocess
    import sys
    from ftw import FTWReader, early
    _, _, ftw = tiny_model("qwen3_moe")
    code = ("import sys, ftw.early, freetoken_cli.common, engine.resolve; "
            f"r = ftw.early.start({str(ftw)!r}); r.wait(); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
    prompt = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(4)).tolist()
    want = greedy(load(ftw), prompt, 8)
    read = early.start(ftw)
    assert early.start(ftw) is read                       # one read per directory
    e = load(ftw)
    store = e.runtime.store
    assert store._early is read and early.take(ftw) is None
    store.wait()
    assert read.faulted.is_set()                          # every page zeroed ahead of its read
    with FTWReader(ftw) as r:  # the same bytes as the reader's, bank by bank
        for bank, layer in zip(store.banks, e.cfg.moe_layer_ids):
            assert torch.equal(bank, r.read(f"model.layers.{layer}.mlp.experts"))
    assert greedy(e, prompt, 8) == want
    assert not read.fits([0], (1, 1)) and early.start(ftw / "nowhere") is None
    assert all(t.daemon for t in read._workers)  # a process that never adopts it does not wait for it


def test_an_early_read_of_a_cut_shard_fails_where_it_is_waited_for(tiny_model, tmp_path):
    import shutil
    from ftw import FTWError, early
    _, _, ftw = tiny_model("qwen3_moe")
    cut = tmp_path / "ftw"
    shutil.copytree(ftw, cut)
    for shard in cut.glob("*.ftw"):
        os.truncate(shard, shard.stat().st_size // 2)
    read = early.start(cut)
    with pytest.raises(FTWError, match="ended early"):
        read.wait()


def test_an_early_read_yields_the_disk_to_the_dense_read(tiny_model, monkeypatch):
    """yield_to(dense): no piece starts until the dense read is done (those already started end);
    then the rest are read."""
    import threading
    import time
    from concurrent.futures import Future
    from ftw import early
    from ftw import io as ftw_io
    _, _, ftw = tiny_model("qwen3_moe")
    real, hold, calls = early.pread, threading.Event(), []

    def pread(fd, dst, offset):
        hold.wait()
        calls.append(offset)
        real(fd, dst, offset)
    monkeypatch.setattr(ftw_io, "PIECE_BYTES", 4096)
    monkeypatch.setattr(early, "pread", pread)
    read, dense = early.start(ftw), Future()
    read.yield_to(dense)
    pieces = sum(len(futs) for _, futs in read._banks)
    assert pieces > early.READ_THREADS
    hold.set()
    time.sleep(0.3)
    assert len(calls) <= early.READ_THREADS               # only those past the gate before it closed
    dense.set_result(None)
    read.wait()
    assert len(calls) == pieces and early.take(ftw) is read


def test_prefill_with_every_expert_resident_plans_nothing(tiny_model):
    """With every expert resident a prefill maps its routes to slots where they are (no plan, so
    no wait for each layer's router): the same logits and hits as the planned path; a budget
    short of every expert plans as before."""
    from conftest import prefill_logits
    _, _, ftw = tiny_model("qwen3_moe")
    ids = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(2)).tolist()
    e = load(ftw)
    rt = e.runtime
    plans, plan = [], rt.cache.tables.plan
    rt.cache.tables.plan = lambda *a, **k: plans.append(1) or plan(*a, **k)
    before = rt.cache.stats.hits
    fast = prefill_logits(e, ids)
    rt.sync_stats()  # graph mode counts the hits on the device
    hits = rt.cache.stats.hits - before
    assert plans == [] and hits > 0
    rt._resident_slots = lambda: None  # the planned path
    before = rt.cache.stats.hits
    slow = prefill_logits(e, ids)
    rt.sync_stats()
    assert len(plans) == 3 and torch.equal(fast, slow) and rt.cache.stats.hits - before == hits
    short = load(ftw, expert_budget=20 * rt.store.layout.slot_bytes).runtime
    assert short._resident_slots() is None
