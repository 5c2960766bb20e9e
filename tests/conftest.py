"""Shared fixtures: tiny converted checkpoints (built once per session) and engine helpers."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import tiny  # noqa: E402

ARCHS = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "deepseek_v3", "deepseek_v2", "glm4_moe", "qwen3_next",
         "qwen3_5_moe", "gpt_oss"]


def pytest_addoption(parser):
    parser.addoption("--engine-device", default="cpu", help="device for engine tests: cpu or cuda")


DEVICE = ["cpu"]


def pytest_configure(config):
    DEVICE[0] = config.getoption("--engine-device")
    # Tiny models: one intra-op thread avoids OpenMP barrier stalls on a shared 2-core machine
    # (measured 13x faster decode here while another process was busy).
    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Converted models and profiles go to a per-session cache, not the user's."""
    import os
    os.environ["FREETOKEN_CACHE"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session", autouse=True)
def _no_server():
    """`run` looks for a `freetoken serve` where FREETOKEN_HOST/PORT say: a free port, so that a
    server someone runs on the default port never answers the tests."""
    import os
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["FREETOKEN_PORT"] = str(s.getsockname()[1])
    for name in ("FREETOKEN_HOST", "FREETOKEN_API_KEY"):
        os.environ.pop(name, None)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """(arch, fused) -> (transformers model, HF dir, FTW dir), built and converted once."""
    from engine.convert import convert
    made = {}

    def get(arch: str, fused: bool = False):
        if (arch, fused) not in made:
            d = tmp_path_factory.mktemp(f"{arch}-{'fused' if fused else 'split'}")
            ref = tiny.build(arch, d / "hf", fused=fused)
            convert(d / "hf", d / "ftw")
            made[arch, fused] = (ref, d / "hf", d / "ftw")
        return made[arch, fused]
    return get


def load(ftw: Path, **kw):
    from engine.config import EngineConfig
    from engine.loader import load_runner
    return load_runner(EngineConfig(model=str(ftw), device=kw.pop("device", DEVICE[0]), **kw), ftw)


def together(sched, prompts: list[list[int]], n: int, **params) -> list:
    """The prompts as sequences of n new tokens each (params: more SamplingParams), added to
    `sched` at once and stepped until every one ends."""
    from engine.config import SamplingParams
    from engine.scheduler import Sequence
    seqs = [Sequence(p, SamplingParams(max_tokens=n, **params)) for p in prompts]
    for s in seqs:
        sched.add(s)
    while not all(s.finish for s in seqs):
        sched.step()
    return seqs


def run(sched, tokens: list[int], n: int = 6, **params):
    """One sequence of n new tokens through `sched`, to its end."""
    return together(sched, [tokens], n, **params)[0]


def greedy(runner, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens through the scheduler (no tokenizer needed)."""
    from engine.scheduler import Scheduler
    seq = run(Scheduler(runner, set(), 1, 2048, prefix_cache=False), prompt, n, temperature=0)
    runner.runtime.sync_stats()  # graph decode counts on the device
    return seq.output


def prefill_logits(runner, ids: list[int], step: bool = False) -> torch.Tensor:
    """Logits of every position of `ids`, prefilled in one step (pages released after), on the
    host beside the references they are compared with, whatever the engine device. step: through
    runner.step, as the scheduler runs it (else the model's forward alone)."""
    from engine.kv.batch import ForwardBatch
    kv = runner.kv
    states = [runner.states.alloc()] if runner.states else None
    try:
        with kv.scratch(len(ids)) as (pages, sliding):
            b = ForwardBatch.build([(ids, 0, pages)], kv.page_size, runner.device, all_logits=True, states=states,
                                   sliding=None if sliding is None else [sliding])
            return (runner.step(b, kv) if step else runner.model(b, kv)).cpu()
    finally:
        if states:
            runner.states.release(states[0])
