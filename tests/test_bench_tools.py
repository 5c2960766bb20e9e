"""The measurement scripts behind benchmarks/RESULTS.md run and report sane numbers on the CPU."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("quant,depth", [(None, 32), ("int4", 300)])
def test_step_profile_reports_each_policy(capsys, quant, depth):
    from engine.bench import step_profile
    step_profile.main("uniform", 2, "1MiB", None, "tiny", "cpu", quant, depth)
    out = capsys.readouterr().out
    for label in ("fetch 1MiB", "adaptive 1MiB", "cpu 1MiB", "all resident"):
        assert f"{label}: " in out and f"layers, depth {depth}" in out
    assert out.count("per step: GPU busy") == 4


def test_prefetch_signal_on_the_demo_model():
    """Layer l+1's router on layer l's input beats chance (K/E) on the trained demo model."""
    from engine.bench.prefetch_accuracy import accuracy
    from engine.config import EngineConfig
    from engine.loader import load_runner
    from engine.resolve import ensure_ftw
    from engine.tokenizer import Tokenizer
    path = ensure_ftw(None)
    runner = load_runner(EngineConfig(model="", device="cpu", graph=False), path)
    tokens = Tokenizer(path).encode("def add(a, b):\n    return a + b\n" * 20)
    acc = accuracy(runner, tokens)
    k, e = runner.cfg.router.top_k, runner.cfg.num_experts
    assert len(acc) == runner.cfg.num_layers - 1 and all(0 <= a <= 1 for a in acc)
    assert sum(acc) / len(acc) > 1.5 * k / e


def test_split_model_prices_whole_expert_splits():
    """Fresh experts every step at B_P = B_H: two misses split evenly (the ideal), three cannot
    (one side takes two experts: 2 expert-times against the ideal 1.5). The first two tokens fill
    the empty slots (fills there are always taken) and are not counted."""
    import numpy as np
    from engine.bench.split_model import Machine, price
    m = Machine(b_p=1e9, b_h=1e9, b_p_solo=1e9, b_h_solo=1e9, job_s=0.0, experts_s=0.0, expert_bytes=10**9)
    for k, ratio in [(2, 1.0), (3, 0.75)]:
        trace = np.arange(10 * k).reshape(10, 1, k)  # never a repeat: every route misses
        r = price(trace, slots=4, experts=64, m=m, warm_tokens=2)
        assert r["hit_rate"] == 0 and r["fetched"] + r["cpu"] == k
        assert r["ideal_s"] / r["split_s"] == ratio and r["ideal_s"] == k / 2
    assert price(np.arange(20).reshape(10, 2, 1), slots=128, experts=64, m=m, warm_tokens=0)["hit_rate"] == 1  # all fit: all loaded


def test_split_model_prefetches_into_the_idle_link():
    """Two layers, one route each: layer 0 always expert 0, layer 1 a fresh expert every token,
    fetched (q = 1) at 1 ms an expert. A window of 1.5 ms holds one fill: a right guess makes layer
    1 hit and the token's miss time 0; a window of 0.5 ms holds none. A wrong guess costs the link
    time only and enters as least recently used, so with two slots it, not expert 0, is the next
    victim: layer 0 keeps hitting. On the CPU (q = 0) the miss overlaps the GPU's expert kernels."""
    from dataclasses import replace

    import numpy as np
    from engine.bench.split_model import Guess, Machine, price, tok_s
    trace = np.array([[[0], [t + 1]] for t in range(20)])
    m = Machine(b_p=1e9, b_h=1e9, b_p_solo=1e9, b_h_solo=1e9, job_s=0.0, experts_s=0.0, gap_s=1.5e-3,
                expert_bytes=10**6)
    oracle = Guess(trace, 64, [1.0])
    plain = price(trace, 2, 64, m, q=1.0, warm_tokens=2)
    assert plain["split_s"] == pytest.approx(1e-3) and plain["hit_rate"] == 0.5
    assert tok_s(plain, 1e-3) == pytest.approx(500)
    right = price(trace, 2, 64, m, q=1.0, predict=oracle, warm_tokens=2)
    assert right["split_s"] == 0 and right["hit_rate"] == 1 and right["prefetched"] == right["used"] == 1
    short = price(trace, 2, 64, replace(m, gap_s=0.5e-3), q=1.0, predict=oracle, warm_tokens=2)
    assert short["prefetched"] == 0 and short["split_s"] == pytest.approx(1e-3)
    wrong = price(trace, 2, 64, m, q=1.0, predict=lambda tok, layer: [63], warm_tokens=2)
    assert wrong["prefetched"] == 1 and wrong["used"] == 0 and wrong["hit_rate"] == 0.5
    assert wrong["split_s"] == pytest.approx(1e-3)
    on_cpu = price(trace, 2, 64, replace(m, experts_s=0.4e-3, job_s=0.1e-3), q=0.0, warm_tokens=2)
    assert on_cpu["cpu"] == 2 and on_cpu["split_s"] == pytest.approx(1.4e-3)  # nothing cached: 2 x (1 + 0.1 - 0.4) ms


def test_split_model_prints_each_policy_and_prefetch(tmp_path, capsys):
    """The command prints a row per policy and prefetch at each budget; a budget that holds every
    expert estimates the all-resident tok/s; a --share of the wrong length is refused."""
    import json

    import numpy as np
    from engine.bench import split_model
    np.save(tmp_path / "t.npy", np.random.default_rng(0).integers(0, 8, (40, 3, 2)).astype(np.int16))
    prof = {"h2d_gbps": 50, "h2d_concurrent_gbps": 48, "cpu_expert_gbps": 100, "cpu_expert_concurrent_gbps": 90,
            "expert_bytes": split_model.EXPERT_BYTES}
    (tmp_path / "p.json").write_text(json.dumps(prof))
    args = [str(tmp_path / "t.npy"), "--profile", str(tmp_path / "p.json"), "--resident", "600,2700", "--experts", "8",
            "--budgets", "90MiB,1GiB", "--tokens", "8:"]
    split_model.main(args + ["--share", "0.5,0.9"])
    out = capsys.readouterr().out
    for name in ("adaptive", "fetch", "cpu", "adaptive + prefetch", "adaptive + oracle prefetch"):
        assert out.count(f"  {name}: ") == 2
    assert "24 slots, 100% of the experts" in out and "600.0 tok/s (1.000x adaptive), hit rate 100.0%" in out
    with pytest.raises(SystemExit, match="needs 2 values"):
        split_model.main(args + ["--share", "0.5"])


def test_guess_hits_its_share():
    """The modelled predictor: share 1 guesses the routed experts, share 0 none of them, share 0.5
    half of them on average; always K distinct guesses."""
    import numpy as np
    from engine.bench.split_model import Guess
    rng = np.random.default_rng(1)
    trace = np.stack([np.stack([rng.choice(32, 4, replace=False) for _ in range(2)]) for _ in range(500)])
    for share, want in [(1.0, 1.0), (0.0, 0.0), (0.5, 0.5)]:
        g = Guess(trace, 32, [share])
        got = [g(t, 1) for t in range(500)]
        assert all(len(set(x)) == 4 for x in got)
        hit = np.mean([len(set(x) & set(trace[t, 1].tolist())) / 4 for t, x in enumerate(got)])
        assert abs(hit - want) < 0.05


_BENCH = """
import multiprocessing as mp, os
from engine.bench.decode import memory_hog
if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    stop, ready = ctx.Event(), ctx.Semaphore(0)  # kept: start() drops the process's own references
    hog = ctx.Process(target=memory_hog, args=(stop, ready, 1 << 20, os.getpid()))
    hog.start()
    print(hog.pid, flush=True)
    os._exit(0 if ready.acquire(timeout=60) else 3)  # no cleanup, as under SIGKILL or SIGTERM
"""


def test_memory_hog_stops_when_its_bench_is_gone(tmp_path):
    """bench decode --contention: a bench killed by a time limit leaves no hog behind."""
    import subprocess
    import sys
    import time

    import psutil
    log = tmp_path / "bench.log"  # not a pipe: the hog would hold it open
    with open(log, "w") as f:
        bench = subprocess.run([sys.executable, "-c", _BENCH], stdout=f, stderr=subprocess.STDOUT, timeout=120)
    hog = psutil.Process(int(log.read_text().split()[0]))
    try:
        assert bench.returncode == 0, f"the hog did not start: {log.read_text()[-500:]}"
        deadline = time.time() + 30
        while hog.is_running() and hog.status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
            time.sleep(0.1)
        assert not hog.is_running() or hog.status() == psutil.STATUS_ZOMBIE
    finally:
        if hog.is_running():
            hog.kill()


def test_interleave_runs_each_variant_in_turn_with_its_settings(monkeypatch):
    """Every repeat runs every variant in the listed order, each with its attributes set while
    its runtime is built and decoded (and the defaults for the others), and the defaults come
    back afterwards; a variant naming a missing attribute is refused."""
    from engine.bench import interleave
    from engine.config import EngineConfig, parse_size
    from engine.loader import load_synthetic
    from engine.moe import runtime
    cfg = EngineConfig(model="synthetic", device="cpu", expert_budget=parse_size("1MiB"), cpu_threads=1,
                       max_context=256, moe_policy="adaptive")
    runner = load_synthetic(cfg, "tiny")
    seen, decode = [], interleave.decode_once
    monkeypatch.setattr(interleave, "decode_once",
                        lambda *a: seen.append(runtime.SHORT_ROUTES_PER_EXPERT) or decode(*a))
    default = runtime.SHORT_ROUTES_PER_EXPERT
    variants = [interleave.parse_variant("base"),
                interleave.parse_variant("wide:engine.moe.runtime.SHORT_ROUTES_PER_EXPERT=99")]
    runs = interleave.run(runner, cfg, "uniform", variants, tokens=3, repeats=2,
                          prof={"h2d_concurrent_gbps": None, "cpu_expert_concurrent_gbps": 10.0}, say=lambda m: None)
    assert seen == [default, default, 99, 99] * 2                  # warm-up and timed decode, per variant
    assert runtime.SHORT_ROUTES_PER_EXPERT == default
    assert {k: len(v) for k, v in runs.items()} == {"base": 2, "wide": 2} and all(t > 0 for v in runs.values() for t in v)
    with pytest.raises(SystemExit, match="no attribute"):
        interleave.parse_variant("typo:engine.moe.runtime.NO_SUCH_KNOB=1")


def test_synthetic_model_reports_its_progress():
    """Building a synthetic model's experts reports rising byte counts up to the store's size."""
    from engine.config import EngineConfig, parse_size
    from engine.loader import load_synthetic
    calls = []
    runner = load_synthetic(EngineConfig(model="synthetic", device="cpu", expert_budget=parse_size("1MiB")), "tiny",
                            progress=lambda stage, done, total: calls.append((stage, done, total)))
    total = runner.runtime.store.nbytes
    assert len(calls) == len(runner.runtime.store.banks) and calls[-1] == ("experts", total, total)
    assert all(a[1] < b[1] for a, b in zip(calls, calls[1:]))


@pytest.mark.parametrize("fmt", ["bfloat16", "int4"])
def test_threads_bench_times_small_jobs_on_both_paths(fmt):
    """engine.bench.threads' two paths, the executor alone and the poller's protocol, run jobs of
    k experts of a format (the one or two that adaptive decode leaves the CPU): both time them,
    the poller's by the wall clock (its Python driver too) and by its own, which is the shorter."""
    from engine.bench.threads import poller_gbps
    from engine.profile import Bench
    from freetoken_kernels.cpu_executor import cpu_executor_available
    if not cpu_executor_available():
        pytest.skip("needs the C++ CPU executor")
    bench = Bench(4, cuda=False, fmt=fmt)
    bench.use_threads(1)
    try:
        for k in (1, 2):
            assert 0 < bench.cpu_experts(0.05, k=k) < 1e4
            wall, own = poller_gbps(bench, 0.05, k)
            assert 0 < wall < own < 1e4
    finally:
        bench.cpu.close()
