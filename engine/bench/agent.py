"""`freetoken bench agent`: an agent session replayed through the engine, turn by turn, with
reuse on (the prefix cache; for hybrid models its recurrent-state checkpoints) and off, taking
turns on one model. The session is a coding agent's: a system prompt, user queries, each
answered by a loop of thinking + tool call, then the tool's response; the history is re-rendered
every turn the way Qwen templates and agent clients edit it (earlier thinking dropped at a new
query; old tool results cleared every `clear_every` turns). Each turn's answer is forced, so
both runs see the same tokens. Rows: per turn, prompt tokens, and per mode tokens reused, TTFT
and what the prefill moved."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.bench.prefill import first_token
from engine.config import SamplingParams
from engine.kv.anchors import Anchors
from engine.runner import ModelRunner
from engine.scheduler import Scheduler, Sequence


@dataclass(frozen=True)
class Shape:
    system: int = 16000         # tokens of the system prompt (a coding agent's, with its tools)
    queries: int = 2            # user queries
    steps: int = 3              # tool calls per query
    user: int = 40
    think: int = 60
    text: int = 20
    call: int = 30
    response: int = 300         # tokens of a tool response
    clear_every: int = 4        # every n-th turn old tool results are cleared (0 = never)


class Vocab:
    """Token ids of the session: ids 0-7 stand for <|im_start|>, <|im_end|>, <think>, </think>,
    <tool_call>, </tool_call>, <tool_response>, </tool_response> (the bench's scheduler takes
    them as its anchors, whatever the model's tokenizer), words are random ids above."""

    def __init__(self, size: int, seed: int = 0):
        (self.start, self.end, self.think, self.end_think, self.call, self.end_call, self.resp,
         self.end_resp) = range(8)
        self.size, self.gen = size, torch.Generator().manual_seed(seed)

    def words(self, n: int) -> list[int]:
        return torch.randint(8, self.size, (n,), generator=self.gen).tolist()

    def anchors(self) -> Anchors:
        return Anchors(frozenset({self.start, self.end, self.think, self.call, self.resp}),
                       frozenset({self.end_think, self.end_call, self.end_resp}))


def session(v: Vocab, s: Shape) -> list[tuple[list[int], list[int]]]:
    """(prompt, forced answer) per turn."""
    system, roles = [v.start] + v.words(s.system) + [v.end], v.words(3)   # roles: user, assistant, tool
    msgs, turns = [], []                # (kind, thinking, body); kind: user | assistant | tool

    def render(last_query: int, cleared: int) -> list[int]:
        out = list(system)
        for i, (kind, think, body) in enumerate(msgs):
            if kind == "assistant":
                keep = think if i > last_query else []                     # earlier thinking dropped
                out += [v.start, roles[1]] + keep + body + [v.end]
            elif kind == "tool":
                out += [v.start, roles[2], v.resp] + (body if i >= cleared else body[:4]) + [v.end_resp, v.end]
            else:
                out += [v.start, roles[0]] + body + [v.end]
        return out + [v.start, roles[1]]

    cleared = 0
    for q in range(s.queries):
        msgs.append(("user", [], v.words(s.user)))
        last_query = len(msgs) - 1
        for step in range(s.steps + 1):
            if s.clear_every and len(turns) % s.clear_every == s.clear_every - 1:
                cleared = len(msgs) - 1                                    # keep only the latest result
            think = [v.think] + v.words(s.think) + [v.end_think]
            body = v.words(s.text) + ([v.call] + v.words(s.call) + [v.end_call] if step < s.steps else [])
            turns.append((render(last_query, cleared), think + body + [v.end]))
            msgs.append(("assistant", think, body))
            if step < s.steps:
                msgs.append(("tool", [], v.words(s.response)))
    return turns


def context(shape: Shape) -> tuple[int, int]:
    """(tokens of the session's longest turn, prompt and answer; distinct tokens of all turns: what
    a prefix cache holding every turn keeps)."""
    seen, longest, distinct = [], 0, 0
    for prompt, answer in session(Vocab(16), shape):
        t = prompt + answer
        shared = max((next((i for i, (a, b) in enumerate(zip(t, u)) if a != b), min(len(t), len(u)))
                      for u in seen), default=0)
        seen.append(t)
        longest, distinct = max(longest, len(t)), distinct + len(t) - shared
    return longest, distinct


def replay_turn(runner: ModelRunner, sched: Scheduler, prompt: list[int], answer: list[int]) -> dict:
    """-> the time to the first answer token, prompt tokens reused, and what the prompt's prefill
    moved: expert GiB over the link, GiB the CPU read for its routes, layers streamed and their passes."""
    seq = Sequence(prompt, SamplingParams(max_tokens=len(answer), forced=tuple(answer), ignore_eos=True))
    before = replace(runner.runtime.cache.stats)  # a copy: record() counts in place
    ttft = first_token(runner, sched, seq)
    d = runner.runtime.cache.stats - before
    while not seq.finish:
        sched.step()
    return {"ttft_s": ttft, "reused": seq.cached, "moved_gib": d.bytes_filled / 2**30,
            "cpu_gib": d.bytes_cpu / 2**30, "streamed": d.stream_layers, "passes": d.stream_passes}


def run(runner: ModelRunner, shape: Shape, say=lambda row: None) -> list[dict]:
    """Both modes take turns on each turn of one session, their schedulers on one KV pool (room for
    every turn's pages in the reuse mode's cache beside one turn without: `context`); say(row)
    after each turn."""
    v = Vocab(runner.cfg.vocab_size)
    hybrid = runner.states is not None
    modes = {"on": Scheduler(runner, set(), 1, runner.prefill_chunk, anchors=v.anchors()),
             "off": Scheduler(runner, set(), 1, runner.prefill_chunk, prefix_cache=False)}
    # an earlier request, untimed: the first turn's first mode would otherwise meet an expert cache
    # that no prefill has filled yet, where a serving engine's holds the last request's experts
    other = Vocab(runner.cfg.vocab_size, seed=1)  # (the session's own words stay those of seed 0)
    replay_turn(runner, modes["off"], other.words(512), other.words(1))
    rows = []
    for i, (prompt, answer) in enumerate(session(v, shape)):
        row = {"turn": i + 1, "prompt_tokens": len(prompt), "reuse": "state checkpoints" if hybrid else "prefix cache"}
        for mode, sched in modes.items():
            row.update({f"{k}_{mode}": v for k, v in replay_turn(runner, sched, prompt, answer).items()})
        rows.append(row)
        say(row)
    return rows
