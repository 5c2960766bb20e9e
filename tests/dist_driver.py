"""A group of ranks, for tests/test_dist.py: `python dist_driver.py SPEC` (JSON: world,
device, models, prompt, tokens, cases of [layers or null, policy, graph, prefill_mode], chat), run as rank 0
(which spawns the others) or by torchrun on every rank. Rank 0 loads each FTW model on every rank,
rebuilds every rank's expert cache for each case (a budget of `layers` layers of the rank's own
experts, null: all) and greedy-decodes the prompt, and for a hybrid model answers two agent turns
through the checkpoint cache; then answers `chat` with the demo model through the LLM facade,
resizes every rank's cache to two layers through the facade's budget and answers again; and
prints one JSON line: the tokens and the counters summed over ranks of each case, the agent
turns, the chat's tokens and GenStats, and the resized chat's tokens and server statistics."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch
from conftest import greedy

from engine.config import EngineConfig, SamplingParams
from engine.dist import cache_totals, load, on_ranks
from engine.kv.anchors import Anchors
from engine.llm import LLM
from engine.loader import load_runner, rebuild_experts
from engine.scheduler import Scheduler, Sequence

ANCHORS = Anchors(frozenset({1, 2}), frozenset())  # a made-up template's turn start and end


def setup(runner, config: EngineConfig, layers: int | None, policy: str, graph: bool, prefill_mode: str) -> None:
    """On every rank: this rank's cache for the case; q* held at 0.5, so both sides take misses."""
    store = runner.runtime.store
    budget = layers and layers * store.n_experts * store.layout.slot_bytes
    rebuild_experts(runner, store, replace(config, expert_budget=budget, moe_policy=policy, graph=graph,
                                           prefill_mode=prefill_mode))
    runner.runtime.qstar.start(1.0, 1.0, online=False)


def agent_turns(runner, tokens: int) -> dict:
    """Two turns of an agent conversation through the prefix cache with recurrent-state
    checkpoints at anchors (a hybrid model): the second restores a checkpoint of the first, whose
    partial KV page is copied -> each turn's greedy tokens and the checkpoints restored."""
    gen = torch.Generator().manual_seed(7)

    def turn(n: int) -> list[int]:
        return [1] + torch.randint(20, 256, (n,), generator=gen).tolist() + [2]

    def answer(prompt: list[int]) -> list[int]:
        seq = Sequence(prompt, SamplingParams(max_tokens=tokens, temperature=0))
        sched.add(seq)
        while not seq.finish:
            sched.step()
        return seq.output
    sched = Scheduler(runner, set(), 1, 16, anchors=ANCHORS)
    first = turn(30) + turn(11) + [1, 13]
    out = [answer(first)]
    out.append(answer(first + out[0] + [2] + turn(9) + [1, 13]))
    return {"tokens": out, "restored": sched.prefix.restored}


def main(spec: dict) -> dict:
    cases, agents = [], []
    for model in spec["models"]:
        config = EngineConfig(model=model, device=spec["device"], world_size=spec["world"])
        runner = load(config, load_runner, Path(model))
        for case in spec["cases"]:
            on_ranks(runner, setup, config, *case)
            tokens = greedy(runner, spec["prompt"], spec["tokens"])
            cases.append({"tokens": tokens, "stats": asdict(cache_totals(runner)["stats"])})
        agents.append(agent_turns(runner, spec["tokens"]) if runner.states else None)
    llm = LLM(EngineConfig(model=None, device=spec["device"], moe_policy="fetch", world_size=spec["world"]))
    ids = llm.tokenizer.chat([{"role": "user", "content": spec["chat"]}])
    params = SamplingParams(max_tokens=spec["tokens"])
    chat = {"tokens": list(llm.generate(ids, params)), "stats": llm.stats.as_dict()}
    store = llm.runner.runtime.store
    budget = 2 * store.n_experts * store.layout.slot_bytes  # two layers of each rank's experts
    llm.elastic.set_budget(budget)
    resized = {"tokens": list(llm.generate(ids, params)), "budget": budget, "layer_slots": store.n_experts,
               "server": llm.server_stats(), "describe": llm.elastic.describe()}
    return {"cases": cases, "agents": agents, "chat": chat, "resized": resized}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
