"""Miss policies on the CPU cache tier: identical tokens whatever the split, counters that show
where each miss ran, online q* re-estimation, and `profile --json` without a GPU."""
import json

import pytest
import torch
from conftest import greedy, load

from engine.moe.qstar import BandwidthEstimator

POLICIES = ["fetch", "cpu", "adaptive", "static:1", "static:3"]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "device-control"])
@pytest.mark.parametrize("slots", [8, 13])
def test_policies_give_identical_tokens(tiny_model, slots, graph):
    _, _, ftw = tiny_model("qwen3_moe")
    prompt = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(7)).tolist()
    want = greedy(load(ftw), prompt, 16)
    slot_bytes = load(ftw).runtime.store.layout.slot_bytes
    for policy in POLICIES:
        e = load(ftw, expert_budget=slots * slot_bytes, moe_policy=policy, graph=graph)
        e.runtime.qstar.start(1.0, 1.0, online=False)  # q* = 0.5: half the misses on each side
        assert greedy(e, prompt, 16) == want, policy
        e.runtime.sync_stats()
        st = e.runtime.cache.stats
        assert st.fetched + st.cpu == st.misses
        if policy == "fetch":
            assert st.cpu == 0
        else:
            assert st.cpu > 0
        if policy == "static:3":  # every MoE layer on the CPU: nothing is ever cached
            assert st.fetched == 0 and st.hits == 0
        if policy.startswith("static"):
            n = int(policy[7:])
            assert all(int(s) == -1 for s in e.runtime.cache.tables.slot_of[:n * 8])


def test_device_control_matches_eager_decisions(tiny_model):
    """Graph-path control (device tables, padded plan outputs, fill and CPU-branch buffers) on
    the CPU makes the same residency decisions as the eager path, step by step."""
    _, _, ftw = tiny_model("qwen3_moe")
    prompt = torch.randint(0, 256, (10,), generator=torch.Generator().manual_seed(9)).tolist()
    runs = []
    for graph in (False, True):
        e = load(ftw, expert_budget=9 * load(ftw).runtime.store.layout.slot_bytes, moe_policy="adaptive", graph=graph)
        e.runtime.qstar.start(1.0, 2.0, online=False)
        out = greedy(e, prompt, 20)
        e.runtime.sync_stats()
        t = e.runtime.cache.tables
        runs.append((out, [int(s) for s in t.slot_of], [int(o) for o in t.owner_of], e.runtime.cache.stats))
    assert runs[0] == runs[1]
    assert runs[1][3].cpu > 0 and runs[1][3].fetched > 0


def test_adaptive_split_follows_q(tiny_model):
    _, _, ftw = tiny_model("qwen3_moe")
    prompt = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(8)).tolist()
    shares = []
    for q_bp in (0.25, 4.0):  # q* = 0.2, then 0.8
        e = load(ftw, expert_budget=8 * load(ftw).runtime.store.layout.slot_bytes, moe_policy="adaptive")
        e.runtime.qstar.start(q_bp, 1.0, online=False)
        greedy(e, prompt, 4)  # fills the empty slots (fills that evict nothing are always taken)
        assert e.runtime.cache.tables.owned == e.runtime.cache.n_slots
        before = (e.runtime.cache.stats.fetched, e.runtime.cache.stats.cpu)
        greedy(e, prompt, 24)
        st = e.runtime.cache.stats
        fetched, cpu = st.fetched - before[0], st.cpu - before[1]
        shares.append(fetched / max(1, fetched + cpu))
    assert shares[0] < 0.5 < shares[1]


def test_estimator_moves_q_under_contention():
    est = BandwidthEstimator(50e9, 50e9)
    assert est.q_star == pytest.approx(0.5)
    for _ in range(30):  # the CPU branch slows down (another program hammers memory)
        est.cpu(40 << 20, (40 << 20) / 10e9)
        est.fill(40 << 20, (40 << 20) / 50e9)
    assert est.q_star > 0.75
    est.cpu(100, 1e-9)  # too small to time: ignored
    assert est.q_star > 0.75


def test_q_star_starts_from_the_profile_and_follows_or_holds():
    """A profile's concurrent bandwidths (or the solo ones) start q*; without a GPU B_P starts
    at 1 B/s, so a recurring miss is still fetched; follow(False) holds the start's q*,
    follow(True) resumes the online estimates."""
    from engine.moe.qstar import QStar
    from freetoken_kernels.ref import split_fetch
    qs = QStar(store=None, cpu=None)
    assert qs.value == 1.0 and qs.estimator is None                  # no bandwidths yet: fetch
    prof = {"h2d_gbps": 50.0, "cpu_expert_gbps": 30.0, "h2d_concurrent_gbps": 40.0, "cpu_expert_concurrent_gbps": 10.0}
    qs.use_profile(prof, concurrent=False)
    assert qs.value == pytest.approx(50 / 80)
    qs.use_profile(prof)
    assert qs.value == pytest.approx(0.8)
    qs.estimator.cpu(40 << 20, (40 << 20) / 40e9)                    # the CPU got faster
    qs.update()
    online = qs.value
    assert online < 0.8
    qs.follow(False)
    assert qs.value == pytest.approx(0.8) and qs.estimator is None
    qs.follow(True)
    assert qs.value == online
    qs.use_profile({**prof, "h2d_concurrent_gbps": None})
    assert 0 < qs.value < 1e-9 and split_fetch(3, qs.value, least=1) == 1


def test_probe_times_the_cpu_when_no_step_uses_it(tiny_model):
    """Graph decode whose steps send nothing to the CPU (its B_H looked too low) times one expert
    there after PROBE_STEPS steps, off the critical path, and folds it into B_H; steps with CPU
    jobs never probe."""
    from types import SimpleNamespace

    from engine.moe import qstar as qstar_mod
    _, _, ftw = tiny_model("qwen3_moe")
    rt = load(ftw, moe_policy="adaptive").runtime
    qs = rt.qstar
    qs.estimator = BandwidthEstimator(50e9, 1e3, min_bytes=0)          # the CPU looked almost stalled
    experts = [0]
    rt.device_ctl = SimpleNamespace(poller=SimpleNamespace(stats=lambda: (experts[0], experts[0], 1.0, 0, 0.0)),
                                    set_q=lambda: None, close=lambda: None, branch=True)
    for _ in range(qstar_mod.PROBE_STEPS):
        rt.before_step()
    assert qs._probe is not None and qs.estimator.b_h == 1e3          # submitted, not yet folded in
    q0 = qs.value
    qs._probe.wait()
    rt.before_step()
    assert qs._probe is None and qs.estimator.b_h > 1e3 and qs.value < q0
    experts[0] = 1                                                      # a CPU job every step
    for _ in range(3 * qstar_mod.PROBE_STEPS):
        rt.before_step()
        assert qs._probe is None


def test_profile_json():
    from typer.testing import CliRunner

    from freetoken_cli.main import app
    r = CliRunner().invoke(app, ["profile", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("h2d_gbps", "cpu_expert_gbps", "h2d_concurrent_gbps", "cpu_expert_concurrent_gbps", "q_star", "machine"):
        assert key in res
    if torch.cuda.is_available():
        assert res["h2d_gbps"] > 1 and 0 < res["q_star"] < 1 and res["machine"]["gpu"]
    else:
        assert res["h2d_gbps"] is None and res["h2d_concurrent_gbps"] is None and res["q_star"] == 0
    assert res["cpu_expert_gbps"] > 0.05
    assert {"gpu", "cpu", "physical_cores", "ram_gib", "pcie_gen", "pcie_width"} <= set(res["machine"])


def test_thread_count_from_the_profile(monkeypatch, tmp_path):
    """A profile sweeps a handful of thread counts up to the executor's cap and picks the fewest
    within 3% of the fastest; the engine's pool takes that count unless one is asked for (on an
    8-core machine without a profile: all 6 that the host threads leave), and a rebuild keeps
    the pool only when the count stays."""
    from dataclasses import replace

    from engine.config import EngineConfig, parse_size
    from engine.loader import load_synthetic, rebuild_experts
    from engine.profile import default_threads, machine, pick_threads, save, thread_candidates
    from freetoken_kernels import cpu_executor
    assert thread_candidates(14) == [7, 8, 10, 12, 14] and thread_candidates(6) == [3, 4, 6]
    assert thread_candidates(1) == [1]
    sweep = [{"threads": n, "gbps": g} for n, g in [(8, 87.6), (10, 91.2), (12, 104.7), (14, 118.3), (16, 119.1)]]
    assert pick_threads(sweep) == 14 and pick_threads(sweep[:3]) == 12
    monkeypatch.setenv("FREETOKEN_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_executor, "_core_cpus", lambda: list(range(8)))
    cfg = EngineConfig(model="synthetic", device="cpu", expert_budget=parse_size("1MiB"), max_context=256)
    runner = load_synthetic(cfg, "tiny")
    try:
        assert default_threads() is None and runner.runtime.cpu.threads == 6
        save({"machine": machine(), "cpu_threads": 3})
        assert default_threads() == 3
        rebuild_experts(runner, runner.runtime.store, replace(cfg, cpu_threads=2))
        pool = runner.runtime.cpu
        assert pool.threads == 2
        assert rebuild_experts(runner, runner.runtime.store, replace(cfg, cpu_threads=2)).cpu is pool
        assert rebuild_experts(runner, runner.runtime.store, cfg).cpu.threads == 3 and pool._pool is None
        save({"machine": machine(), "format": "int4", "cpu_threads": 5})  # int4's own sweep picked 5
        assert default_threads("int4") == 5 and default_threads("mxfp4") == default_threads() == 3
        quantized = load_synthetic(cfg, "tiny", quant="int4")
        assert quantized.runtime.cpu.threads == 5
        quantized.runtime.cpu.close()
    finally:
        runner.runtime.cpu.close()


def test_profile_takes_the_median_run():
    """A pair comes from one run (the one with the median sum), not mixed across runs."""
    from engine.profile import median_run
    runs = iter([(50.0, 68.0), (49.0, 54.0), (52.0, 56.0)])
    assert median_run(lambda: next(runs), 3, key=sum) == (52.0, 56.0)
    runs = iter([3.0, 9.0, 1.0])
    assert median_run(lambda: next(runs), 3) == 3.0


def test_profile_working_set_exceeds_the_last_level_cache(tmp_path):
    """B_H is measured over 3x the L3 (summed over the caches that distinct CPU sets share)."""
    from engine.profile import llc_bytes

    def cache(cpu: int, index: int, level: int, size: str, shared: str) -> None:
        d = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
        d.mkdir(parents=True)
        for name, text in (("level", level), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(f"{text}\n")
    cache(0, 2, 2, "2048K", "0")
    cache(0, 3, 3, "32768K", "0-1")
    cache(1, 3, 3, "32768K", "0-1")          # the same L3, seen from its second CPU
    cache(2, 3, 3, "1M", "2-3")              # another socket
    assert llc_bytes(tmp_path) == (32 << 20) + (1 << 20)
    assert llc_bytes(tmp_path / "none") == 0


def test_trace_replay_follows_tokens(tmp_path):
    """Every MoE layer sees the trace row of each token, in order, cycling at the end."""
    import numpy as np

    from engine.moe.replay import make_routing
    trace = np.random.default_rng(0).integers(0, 16, (5, 3, 2)).astype(np.int16)   # [tokens, layers, K]
    np.save(tmp_path / "t.npy", trace)
    replay = make_routing(f"trace:{tmp_path / 't.npy'}", 2, 16, 2)
    token = 0
    for t in (3, 1, 2):  # a prefill chunk, then decode steps, past the end of the trace
        ids = torch.zeros(t, 2, dtype=torch.int64)
        for layer in range(2):
            want = trace[[(token + i) % 5 for i in range(t)], layer]
            assert replay(layer, ids).tolist() == want.tolist()
        token += t


def test_decode_bound_splits_the_misses_ideally():
    """The bound does not reward a lopsided split: both sides' bytes at the two bandwidths together."""
    from engine.bench.decode import bound
    prof = {"h2d_gbps": 50.0, "h2d_concurrent_gbps": 40.0, "cpu_expert_gbps": 70.0, "cpu_expert_concurrent_gbps": 60.0}
    hbm = 1e9  # GB/s: the GPU's own bytes cost ~nothing here
    lopsided, even = ({"bytes_filled": f, "bytes_cpu": 10e9 - f, "hit_bytes": 0, "kv_bytes": 0, "batch": 1}
                      for f in (9e9, 4e9))
    assert bound(lopsided, prof, 0, hbm) == pytest.approx(bound(even, prof, 0, hbm), rel=1e-6)
    assert bound(even, prof, 0, hbm) == pytest.approx(10.0, rel=1e-6)          # 10 GB at 100 GB/s
    fetch_only = {"bytes_filled": 10e9, "bytes_cpu": 0, "hit_bytes": 0, "kv_bytes": 0, "batch": 1}
    assert bound(fetch_only, prof, 0, hbm) == pytest.approx(5.0, rel=1e-6)    # solo B_P
    # a step of B streams reads the dense weights once: with nothing else, B times the tokens
    one, four = ({"bytes_filled": 0, "bytes_cpu": 0, "hit_bytes": 0, "kv_bytes": 0, "batch": b} for b in (1, 4))
    assert bound(four, prof, 1e9, hbm) == pytest.approx(4 * bound(one, prof, 1e9, hbm), rel=1e-6)
    # a side whose own steps ran faster than the profile says is bounded at that rate
    faster = dict(even, b_p_online_gbps=60.0, b_h_online_gbps=50.0)
    assert bound(faster, prof, 0, hbm) == pytest.approx(12.0, rel=1e-6)       # 10 GB at 60 + 60 GB/s
