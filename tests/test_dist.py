"""Experts across ranks (engine.dist) on gloo CPU ranks: every architecture (gpt-oss's expert biases
and the hybrids' recurrent states too) gives the single-process engine's greedy tokens with two
ranks spawned by rank 0 and three launched by torchrun, at a full and a one-layer budget, under
every miss policy, eager and with device-resident control, and so do a hybrid model's agent turns
through the checkpoint cache and a chat through the LLM facade, also after its budget resized
every rank's cache; the counters summed over ranks see each distinct expert demand once, as one
process does; `bench decode --world-size 2` measures; a rank killed in the middle of
`freetoken run --world-size 2` ends the run with one line within seconds. Then the pieces:
ownership, and plans that leave other ranks' routes alone. On two GPUs, the same over NCCL with
the all-reduce inside the decode graphs."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import torch
from conftest import ARCHS, greedy, load
from dist_driver import agent_turns

from engine.moe.shard import ExpertShard
from engine.moe.tables import HostTables
from freetoken_kernels import ref

DRIVER = Path(__file__).with_name("dist_driver.py")
# 24 tokens: long enough that prefill runs in scan mode (streamed or cold-fetched layers)
PROMPT = torch.randint(0, 256, (24,), generator=torch.Generator().manual_seed(5)).tolist()
TOKENS = 6
CHAT = "Tell me a story."
# [layers of the rank's own experts in the budget (None: all), policy, device-resident control, prefill mode]
CASES = ([[None, p, False, "adaptive"] for p in ("fetch", "cpu", "adaptive", "static:1")]
         + [[1, p, False, "adaptive"] for p in ("fetch", "cpu", "adaptive", "static:1", "static:auto")]
         + [[1, "adaptive", True, "adaptive"], [1, "cpu", True, "adaptive"], [None, "fetch", False, "stream"]])
CLI = [sys.executable, "-m", "freetoken_cli.main", "run", "--device", "cpu", "--moe-policy", "fetch"]


@pytest.fixture(scope="module")
def single(tiny_model):
    """device -> one process's answers there: (FTW dirs, [(tokens, counters, agent turns or None)]
    per architecture, chat tokens, the chat's counters)."""
    from engine.config import EngineConfig, SamplingParams
    from engine.llm import LLM
    made = {}

    def get(device: str):
        if device not in made:
            models = [tiny_model(arch)[2] for arch in ARCHS]
            want = []
            for ftw in models:
                runner = load(ftw, device=device)
                tokens, stats = greedy(runner, PROMPT, TOKENS), replace(runner.runtime.cache.stats)
                want.append((tokens, stats, agent_turns(runner, TOKENS) if runner.states else None))
            llm = LLM(EngineConfig(model=None, device=device, moe_policy="fetch"))
            ids = llm.tokenizer.chat([{"role": "user", "content": CHAT}])
            made[device] = models, want, list(llm.generate(ids, SamplingParams(max_tokens=TOKENS))), llm.stats.cache
        return made[device]
    return get


def check_ranks(single, world: int, launcher: str, device: str, cases: list) -> None:
    """The driver on `world` ranks gives one process's tokens in every case of every architecture,
    in a hybrid's agent turns (a checkpoint restored) and in the chat, before and after a resize
    of every rank's cache; the counters summed over ranks see each distinct demand once."""
    models, want, chat, chat_stats = single
    spec = json.dumps({"world": world, "device": device, "models": [str(m) for m in models], "prompt": PROMPT,
                       "tokens": TOKENS, "cases": cases, "chat": CHAT})
    launch = [] if launcher == "spawn" else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
    out = subprocess.run([sys.executable, *launch, str(DRIVER), spec], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout)
    for i, arch in enumerate(ARCHS):
        tokens, one, agent = want[i]
        assert got["agents"][i] == agent, arch
        assert agent is None or agent["restored"] >= 1, arch
        for case, g in zip(cases, got["cases"][i * len(cases):(i + 1) * len(cases)]):
            st = g["stats"]
            assert g["tokens"] == tokens, (arch, case)
            assert st["fetched"] + st["cpu"] == st["misses"], (arch, case)
            if not st["stream_layers"]:  # a streamed layer plans no demands
                assert st["hits"] + st["misses"] == one.hits + one.misses, (arch, case)
            if case[1].startswith("static") or case[:2] == [1, "cpu"]:  # misses that must run on the CPU
                assert st["cpu"] > 0, (arch, case)
    st = got["chat"]["stats"]
    assert got["chat"]["tokens"] == chat and st["world_size"] == world
    assert st["expert_hits"] + st["expert_misses"] == chat_stats.hits + chat_stats.misses
    r = got["resized"]
    srv, slots = r["server"], 2 * r["layer_slots"]
    assert r["tokens"] == chat and [x["cache_slots"] for x in srv["ranks"]] == [slots] * world
    assert srv["cache_slots"] == world * slots and srv["expert_budget"] == r["budget"]
    assert srv["expert_cache_bytes"] == world * r["budget"] and srv["expert_resizes"] == 1
    assert f"over {world} ranks" in r["describe"] and "per GPU" in r["describe"]


@pytest.mark.parametrize("world, launcher", [(2, "spawn"), (3, "torchrun")])
def test_ranks_give_single_process_tokens(single, world, launcher):
    """Two ranks spawned by rank 0, three launched by torchrun (on two cores: fewer cases, those
    of a one-layer budget where the CPU must work, and streaming)."""
    cases = CASES if world == 2 else [c for c in CASES if c[:2] in ([1, "cpu"], [1, "static:auto"]) or c[3] == "stream"]
    check_ranks(single("cpu"), world, launcher, "cpu", cases)


@pytest.mark.gpu
def test_nccl_ranks_give_single_process_tokens(single):
    """Two GPUs over NCCL, the all-reduce inside the captured decode graphs (graph None: on)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    cases = ([[b, p, None, "adaptive"] for b in (None, 1) for p in ("fetch", "cpu", "adaptive", "static:1")]
             + [[1, "adaptive", False, "adaptive"], [None, "fetch", None, "stream"]])
    check_ranks(single("cuda"), 2, "spawn", "cuda", cases)


def test_killed_rank_ends_the_run():
    """SIGKILL to rank 1 mid-answer: rank 0 ends within seconds, non-zero, with one line naming
    rank 1, and no rank is left behind."""
    p = subprocess.Popen([*CLI, "--world-size", "2", "--prompt", "Count to a thousand.", "--max-tokens", "1900",
                          "--ignore-eos"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.read(1), "no answer started"  # rank 1 is in the decode loop now
        ranks = [c for c in psutil.Process(p.pid).children()
                 if "spawn_main" in " ".join(c.cmdline()) and "resource_tracker" not in " ".join(c.cmdline())]
        assert len(ranks) == 1
        t0 = time.perf_counter()
        ranks[0].kill()
        _, err = p.communicate(timeout=30)
        elapsed = time.perf_counter() - t0
    finally:
        p.kill()
    lines = [line for line in err.splitlines() if line.strip()]
    assert p.returncode == 1 and elapsed < 10, (p.returncode, elapsed, err[-2000:])
    assert "Traceback" not in err and len([x for x in lines if x.startswith("error:")]) == 1, err[-2000:]
    assert lines[-1].startswith("error: rank 1 of 2") and "SIGKILL" in lines[-1], lines[-1]
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in ranks)


def test_bench_decode_over_ranks():
    """`bench decode --world-size 2`: rows of both policies, counters summed over the ranks."""
    cmd = [sys.executable, "-m", "freetoken_cli.main", "bench", "decode", "--synthetic", "tiny", "--world-size", "2",
           "--device", "cpu", "--tokens", "4", "--repeats", "1", "--moe-policy", "fetch,cpu", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)["rows"]
    assert [r["policy"] for r in rows] == ["fetch", "cpu"] and all(r["world_size"] == 2 for r in rows)
    assert all(r["fetched"] + r["cpu"] == pytest.approx(r["misses"]) and r["tok_s"] > 0 for r in rows)
    assert rows[0]["cpu"] == 0 and rows[1]["fetched"] == 0 and rows[1]["cpu"] > 0


@pytest.mark.parametrize("experts", [8, 12, 16])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_ownership_covers_every_expert_once(experts, world):
    owner = {}
    for rank in range(world):
        shard = ExpertShard(rank, world, experts, reduce=lambda out: out)
        for layer in range(4):
            owned = shard.owned(layer)
            assert len(owned) in (experts // world, -(-experts // world))   # balanced in every layer
            ids = torch.arange(experts).view(1, -1)
            local = shard.local(layer, ids)[0]
            assert local[owned].tolist() == list(range(len(owned)))          # dense local ids, in order
            assert (local[[e for e in range(experts) if e not in owned]] == -1).all()
            for e in owned:
                assert (layer, e) not in owner
                owner[layer, e] = rank
    assert len(owner) == 4 * experts


def test_host_plan_skips_routes_of_other_ranks():
    """The eager tables make freetoken_kernels.ref.plan's decisions when some routes are another rank's."""
    L, E, S, K = 3, 8, 10, 3
    gen = torch.Generator().manual_seed(4)
    host = HostTables(S, L * E, L)
    tables = [torch.full((n,), -1, dtype=torch.int64) for n in (L * E, S, S, L * E)]
    for step in range(1, 80):
        T = int(torch.randint(1, 4, (1,), generator=gen))
        ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
        ids = ids.masked_fill(torch.rand(ids.shape, generator=gen) < 0.4, -1)
        layer, q = step % L, [0.0, 0.5, 1.0][step % 3]
        route, vic, fetch, hits, misses = host.plan(ids, layer * E, q)
        r_route, r_vic, r_fetch, r_hits, r_misses = ref.plan(ids, layer, E, *tables, step, q)
        assert route.tolist() == r_route.flatten().tolist() and vic == r_vic.tolist() and fetch == r_fetch.tolist()
        assert (hits, misses) == (r_hits, r_misses) == (hits, len({e for e in ids.flatten().tolist() if e >= 0}) - hits)


def test_elastic_watcher_refused_over_ranks(monkeypatch):
    """--elastic follows one GPU's free memory: refused with several ranks in one line, also when
    torchrun gives the group's size (explicit resizes go to every rank: the chat case above)."""
    from engine.config import EngineConfig
    from engine.elastic import check_elastic
    from engine.errors import UserError
    cuda = torch.device("cuda")
    check_elastic(EngineConfig(model=None, elastic=True), cuda)
    with pytest.raises(UserError, match="cannot drive several ranks; drop --elastic") as e:
        check_elastic(EngineConfig(model=None, elastic=True, world_size=2), cuda)
    assert "\n" not in str(e.value)
    for k, v in dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UserError, match="several ranks"):
        check_elastic(EngineConfig(model=None, elastic=True), cuda)
    check_elastic(EngineConfig(model=None, elastic=None), cuda)  # the default: the watcher is just off
