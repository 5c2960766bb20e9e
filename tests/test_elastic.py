"""Elastic expert memory: the cache resized at a safe point with requests in flight (the same
tokens, no leaked slots, the hottest experts kept in their order), the free-memory watcher driven
by a fake device, the admin endpoint and the chat's /budget."""
import time

import pytest
import torch
from conftest import DEVICE, load

from engine.config import EngineConfig, SamplingParams
from engine.elastic import ElasticExperts, resize_experts
from engine.errors import UserError
from engine.moe.tables import HostTables
from engine.scheduler import Scheduler, Sequence

PROMPTS = [[(7 * i + 3) % 256 for i in range(11)], [(5 * i + 1) % 256 for i in range(15)]]
KEY = "sekret"


def by_recency(t) -> list[int]:
    """Resident flat ids, least recently used first."""
    if isinstance(t, HostTables):
        return [t.owner_of[s] for s in t.lru if t.owner_of[s] >= 0]
    order = torch.argsort(t.last_use, stable=True).tolist()
    return [int(t.owner_of[s]) for s in order if t.owner_of[s] >= 0]


def check_cache(rt) -> None:
    """Tables agree with each other, every slot is accounted for, and every resident slot holds
    its expert's bytes."""
    c = rt.cache
    owner, slot_of = [int(o) for o in c.tables.owner_of], [int(s) for s in c.tables.slot_of]
    live = [(s, f) for s, f in enumerate(owner) if f >= 0]
    assert sorted(s for s in slot_of if s >= 0) == [s for s, _ in live]
    for s, f in live:
        assert slot_of[f] == s and torch.equal(c.pool[s].cpu(), rt.store.rows[f])
    if isinstance(c.tables, HostTables):
        assert sorted(c.tables.lru) == list(range(c.n_slots))
    else:
        assert int(c.tables.last_use.max()) < torch.iinfo(torch.int64).max  # nothing left reserved


def decode_two(runner, tokens: int = 12, at_step=None) -> list[list[int]]:
    """Two greedy sequences decoded together; at_step(sched, step) runs before every step."""
    sched = Scheduler(runner, set(), 2, 2048, prefix_cache=False)
    seqs = [Sequence(p, SamplingParams(max_tokens=tokens, ignore_eos=True)) for p in PROMPTS]
    for s in seqs:
        sched.add(s)
    step = 0
    while not all(s.finish for s in seqs):
        if at_step:
            at_step(sched, step)
        sched.step()
        step += 1
    return [s.output for s in seqs]


def engine(ftw, slots: int, graph: bool, device: str = DEVICE[0]):
    slot = load(ftw).runtime.store.layout.slot_bytes
    e = load(ftw, device=device, expert_budget=slots * slot, moe_policy="adaptive", graph=graph, max_running=2)
    e.runtime.qstar.start(1.0, 1.0, online=False)  # q* = 0.5: misses on both sides
    return e, slot


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])  # gpt_oss: expert biases in the slot
def test_resize_with_requests_in_flight(tiny_model, arch):
    _, _, ftw = tiny_model(arch)
    want = decode_two(engine(ftw, 16, False)[0])
    tables = []
    for graph in (False, True):
        e, slot = engine(ftw, 16, graph)
        seen = {}

        def at_step(sched, step):
            if step in (4, 8):
                n = {4: 9, 8: 20}[step]
                before = by_recency(e.runtime.cache.tables)
                sched.safe_point(lambda: resize_experts(e, n * slot, 2))
                assert e.runtime.cache.n_slots == n and sched.running  # resized, nothing dropped
                seen[step] = before, by_recency(e.runtime.cache.tables)
                check_cache(e.runtime)
        assert decode_two(e, at_step=at_step) == want
        before, after = seen[4]
        assert len(before) > 9 and after == before[-9:]  # shrink: the 9 hottest, in their order
        before, after = seen[8]
        assert after == before  # grow: every one kept
        e.runtime.sync_stats()
        st = e.runtime.cache.stats
        assert st.fetched > 0 and st.cpu > 0 and st.fetched + st.cpu == st.misses
        check_cache(e.runtime)
        tables.append(([int(s) for s in e.runtime.cache.tables.slot_of], by_recency(e.runtime.cache.tables)))
    assert tables[0] == tables[1]  # device-resident control decides as the eager path, resizes included


def test_resize_to_every_expert_and_below_one_layer(tiny_model):
    _, _, ftw = tiny_model("qwen3_moe")
    e, slot = engine(ftw, 12, True)
    decode_two(e, tokens=4)
    pool, tables = e.runtime.cache.pool, e.runtime.cache.tables
    with pytest.raises(UserError, match="raise --expert-budget"):
        resize_experts(e, 7 * slot, 2)
    assert e.runtime.cache.pool is pool and e.runtime.cache.tables is tables  # nothing changed
    resize_experts(e, 1 << 40, 2)  # more than every expert: all of them, all resident
    assert e.runtime.cache.n_slots == 24 and e.runtime.cache.tables.owned == 24
    check_cache(e.runtime)
    before = e.runtime.cache.stats.misses
    decode_two(e, tokens=4)
    assert e.runtime.cache.stats.misses == before


def test_memory_taken_during_a_resize_leaves_the_largest_cache_that_fits(tiny_model, monkeypatch):
    """Another program takes the memory the old pool freed before the new one is allocated: the
    cache gets the largest size that fits (never none), the error says so, decode goes on."""
    from engine.moe.cache import ExpertCache
    _, _, ftw = tiny_model("qwen3_moe")
    e, slot = engine(ftw, 16, False, device="cpu")
    decode_two(e, tokens=4)
    allocate = ExpertCache._allocate

    def tight(self, n):
        if n > 10:  # what the device holds after the other program's allocation
            raise torch.cuda.OutOfMemoryError("out of memory")
        allocate(self, n)
    monkeypatch.setattr(ExpertCache, "_allocate", tight)
    with pytest.raises(UserError, match="no room for .* the cache holds"):
        resize_experts(e, 20 * slot, 2)
    assert 8 <= e.runtime.cache.n_slots <= 10  # one layer's experts at least
    check_cache(e.runtime)
    assert len(decode_two(e, tokens=4)[0]) == 4

    # the pool fits, but the decode graphs' capture beside it does not: a smaller pool, captured
    import engine.elastic as elastic
    monkeypatch.setattr(ExpertCache, "_allocate", allocate)
    captured = []

    def capture(runner, max_running):
        if runner.runtime.cache.n_slots > 12:
            raise torch.cuda.OutOfMemoryError("out of memory")
        runner.graphs = captured.append(runner.runtime.cache.n_slots) or "graphs"
    monkeypatch.setattr(elastic, "capture_graphs", capture)
    monkeypatch.setattr(elastic, "release_graphs", lambda runner: setattr(runner, "graphs", None))
    e.graphs = "graphs"
    with pytest.raises(UserError, match="no room for .* the cache holds"):
        resize_experts(e, 20 * slot, 2)
    assert captured == [10] and e.runtime.cache.n_slots == 10 and e.graphs == "graphs"
    e.graphs = None
    check_cache(e.runtime)


class FakeGPU:
    """Free memory of one device shared by the engine's expert cache and another program."""

    def __init__(self, elastic: ElasticExperts, total: int):
        self.elastic, self.total, self.other = elastic, total, 0

    def __call__(self) -> int:
        return self.total - self.elastic.cache.nbytes - self.other


def elastic_for(runner, slot: int, ceiling: int, sched=None) -> tuple[ElasticExperts, FakeGPU]:
    """Budget `ceiling` slots, a reserve of 4 slots and a margin of 2; the fake device has the
    aim (reserve + margin / 2) free beside the cache."""
    sched = sched or Scheduler(runner, set(), 2, 2048, prefix_cache=False)
    e = ElasticExperts(runner, sched, ceiling * slot, reserve=4 * slot)
    e.margin, e.settle = 2 * slot, 1.0
    return e, FakeGPU(e, runner.runtime.cache.nbytes + 5 * slot)


def test_watcher_follows_free_memory(tiny_model):
    _, _, ftw = tiny_model("qwen3_moe")
    runner, slot = engine(ftw, 20, False)
    e, gpu = elastic_for(runner, slot, 20)
    now = [0.0]
    e.free, e.clock = gpu, lambda: now[0]
    poll = lambda: e.scheduler.safe_point(e.poll)  # noqa: E731
    poll()
    assert runner.runtime.cache.n_slots == 20 and e.resizes == 0  # in the dead band: nothing to do
    gpu.other = 6 * slot  # another program allocates: 1 slot short of nothing free
    poll()
    assert runner.runtime.cache.n_slots == 14 and gpu() == 5 * slot  # back to the aim
    gpu.other = 100 * slot
    poll()
    assert runner.runtime.cache.n_slots == 8  # never below one layer's experts
    gpu.other = 0  # released: grows once the surplus has lasted `settle` seconds
    poll()
    now[0] = 0.5
    poll()
    assert runner.runtime.cache.n_slots == 8
    now[0] = 1.5
    poll()
    assert runner.runtime.cache.n_slots == 20 and e.resizes == 3  # up to the budget, not beyond
    e.set_budget(16 * slot)  # the user's budget is the new ceiling
    assert runner.runtime.cache.n_slots == 16 and e.stats()["expert_budget"] == 16 * slot
    now[0] = 5.0
    poll()
    poll()
    assert runner.runtime.cache.n_slots == 16
    check_cache(runner.runtime)


def test_watcher_thread_with_requests_in_flight(tiny_model):
    _, _, ftw = tiny_model("qwen3_moe")
    want = decode_two(engine(ftw, 20, False)[0], tokens=40)
    runner, slot = engine(ftw, 20, False)
    sizes = []

    def at_step(sched, step):
        if step == 0:
            e, gpu = elastic_for(runner, slot, 20, sched)
            e.settle = 0.05
            e.watch(gpu, interval=0.002)
            sizes.append((e, gpu))
        e, gpu = sizes[0]
        if step == 3:
            gpu.other = 6 * slot  # the watcher shrinks the cache between two of the next steps
        if runner.runtime.cache.n_slots < 20:
            gpu.other = 0  # and grows it back once the memory is free
            sizes.append(runner.runtime.cache.n_slots)
        time.sleep(0.003)
    assert decode_two(runner, tokens=40, at_step=at_step) == want
    e, _ = sizes[0]
    assert 14 in sizes[1:]  # shrunk while the sequences ran
    deadline = time.time() + 30
    while runner.runtime.cache.n_slots < 20 or e.resizes < 2:  # idle now: the watcher runs it itself
        assert time.time() < deadline, e.stats()
        time.sleep(0.01)
    e.close()
    check_cache(runner.runtime)


@pytest.mark.gpu
def test_resize_recaptures_graphs(tiny_model):
    _, _, ftw = tiny_model("qwen3_moe")
    want = decode_two(engine(ftw, 16, True, "cuda")[0], tokens=24)
    e, slot = engine(ftw, 16, True, "cuda")

    def at_step(sched, step):
        if step in (4, 12):
            graphs = e.graphs
            sched.safe_point(lambda: resize_experts(e, {4: 9, 12: 20}[step] * slot, 2))
            assert e.graphs is not graphs and e.graphs is not None
    assert decode_two(e, tokens=24, at_step=at_step) == want
    assert e.graphs.replays > 0
    check_cache(e.runtime)


# ---- the triggers: admin endpoint, chat command, --elastic ---------------------------------------

@pytest.fixture(scope="module")
def demo():
    from engine.llm import LLM
    return LLM(EngineConfig(model=None, device="cpu"))


@pytest.fixture(scope="module")
def client(demo):
    TestClient = pytest.importorskip("fastapi.testclient", reason="the server extras are not installed").TestClient

    from engine.server.app import create_app
    app = create_app(lambda progress: demo, "demo", api_key=KEY)
    with TestClient(app, headers={"authorization": f"Bearer {KEY}"}) as c:
        deadline = time.time() + 60
        while c.get("/health").json()["status"] != "ok":
            assert time.time() < deadline
            time.sleep(0.02)
        yield c


def test_admin_expert_budget(client, demo):
    slot = demo.runner.runtime.store.layout.slot_bytes
    url = "/v1/admin/expert-budget"
    r = client.post(url, json={"expert_budget": "4MiB"}, headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    before = client.get("/v1/stats").json()
    for body, words in (({"expert_budget": "lots"}, "cannot read size"), ({"expert_budget": "1KiB"}, "raise"),
                        ({"expert_budget": 1.5}, "expert_budget"), ({}, "expert_budget")):
        r = client.post(url, json=body)
        err = r.json()["error"]
        assert r.status_code == 400 and words in err["message"], r.text
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert client.get("/v1/stats").json()["cache_slots"] == before["cache_slots"]  # nothing changed
    r = client.post(url, json={"expert_budget": "4MiB"})
    assert r.status_code == 200 and r.json()["cache_slots"] == (4 << 20) // slot
    st = client.get("/v1/stats").json()
    assert st["expert_budget"] == 4 << 20 and st["expert_cache_bytes"] == (4 << 20) // slot * slot
    assert st["expert_resizes"] >= 1 and st["elastic"] is False
    r = client.post("/v1/completions", json={"model": "demo", "prompt": "def f(x):", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    r = client.post(url, json={"expert_budget": "auto"})  # on the CPU: every expert
    assert r.status_code == 200 and r.json()["expert_budget"] is None
    assert r.json()["expert_cache_bytes"] == demo.runner.runtime.store.nbytes


def test_chat_budget_command(demo, capsys):
    from freetoken_cli.chat import Chat
    chat = Chat(demo, SamplingParams(max_tokens=3), None, False)
    assert chat.command("/budget 1KiB")
    assert "error: expert budget" in capsys.readouterr().out
    chat.command("/budget 3MiB")
    slot = demo.runner.runtime.store.layout.slot_bytes
    n = 3 * 2**20 // slot
    assert f"expert cache {n * slot / 2**20:.1f} MiB ({n} experts), budget 3.0 MiB" in capsys.readouterr().out
    assert demo.runner.runtime.cache.n_slots == n
    chat.answer("hello")
    chat.command("/stats")
    assert f"full of {n * slot / 2**20:.1f} MiB" in capsys.readouterr().out


def test_elastic_needs_cuda():
    from engine.llm import LLM
    with pytest.raises(UserError, match="needs a CUDA device"):
        LLM(EngineConfig(model=None, device="cpu", elastic=True))
