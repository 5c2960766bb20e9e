"""A group of ranks, for tests/test_dist.py: `python dist_driver.py SPEC` (JSON: world,
device, models, prompt, tokens, cases of [layers or null, policy, graph, prefill_mode], chat), run as rank 0
(which spawns the others) or by torchrun on every rank. Rank 0 loads each FTW model on every rank,
rebuilds every rank's expert cache for each case (a budget of `layers` layers of the rank's own
experts, null: all) and greedy-decodes the prompt; then answers `chat` with the demo model
through the LLM facade; and prints one JSON line: the tokens and the counters summed over ranks
of each case, and the chat's tokens and GenStats."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from conftest import greedy

from engine.config import EngineConfig, SamplingParams
from engine.dist import cache_totals, load, on_ranks
from engine.llm import LLM
from engine.loader import load_runner, rebuild_experts


def setup(runner, config: EngineConfig, layers: int | None, policy: str, graph: bool, prefill_mode: str) -> None:
    """On every rank: this rank's cache for the case; q* held at 0.5, so both sides take misses."""
    store = runner.runtime.store
    budget = layers and layers * store.n_experts * store.layout.slot_bytes
    rebuild_experts(runner, store, replace(config, expert_budget=budget, moe_policy=policy, graph=graph,
                                           prefill_mode=prefill_mode))
    runner.runtime.qstar.start(1.0, 1.0, online=False)


def main(spec: dict) -> dict:
    cases = []
    for model in spec["models"]:
        config = EngineConfig(model=model, device=spec["device"], world_size=spec["world"])
        runner = load(config, load_runner, Path(model))
        for case in spec["cases"]:
            on_ranks(runner, setup, config, *case)
            tokens = greedy(runner, spec["prompt"], spec["tokens"])
            cases.append({"tokens": tokens, "stats": asdict(cache_totals(runner)["stats"])})
    llm = LLM(EngineConfig(model=None, device=spec["device"], moe_policy="fetch", world_size=spec["world"]))
    ids = llm.tokenizer.chat([{"role": "user", "content": spec["chat"]}])
    tokens = list(llm.generate(ids, SamplingParams(max_tokens=spec["tokens"])))
    return {"cases": cases, "chat": {"tokens": tokens, "stats": llm.stats.as_dict()}}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
