"""Requests and steps: each step decodes every running sequence by one token and, when a
prompt is waiting, adds one prefill chunk of it to the same batch (chunked prefill), so a long
prompt never freezes other streams. Hybrid models also hold a recurrent-state slot per running
sequence and checkpoint it at semantic anchors (engine.kv.anchors, engine.kv.checkpoints): the
last PROMPT_ANCHORS anchors of each prompt's new part, and the anchors of the output (each at
least anchors.GAP tokens after the sequence's previous checkpoint)."""
from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from engine.config import SamplingParams
from engine.kv.anchors import GAP, Anchors
from engine.kv.batch import ForwardBatch
from engine.kv.checkpoints import HybridPrefixCache
from engine.kv.radix import RadixCache
from engine.sampling import generator, sample_row

_ids = itertools.count()
PROMPT_ANCHORS = 8


@dataclass
class Sequence:
    tokens: list[int]                    # prompt + generated
    params: SamplingParams
    n_prompt: int = 0
    n_cached: int = 0                    # tokens whose KV is written
    cached: int = 0                      # prompt tokens reused from the prefix cache
    pages: list[int] = field(default_factory=list)
    state: int = -1                      # recurrent-state slot (hybrid models)
    anchors: list[int] = field(default_factory=list)  # prompt positions to checkpoint
    checkpointed: int = 0                # the position of the last checkpoint taken
    finish: str | None = None            # stop | length | abort | error
    error: Exception | None = None
    id: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self):
        self.n_prompt = len(self.tokens)
        self.gen = generator(self.params)

    @property
    def output(self) -> list[int]:
        return self.tokens[self.n_prompt:]

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.n_cached


class Scheduler:
    def __init__(self, runner, eos_ids: set[int], max_running: int, prefill_chunk: int,
                 prefix_cache: bool = True, anchors: Anchors | None = None):
        self.runner, self.kv, self.eos, self.states = runner, runner.kv, eos_ids, runner.states
        self.max_running, self.chunk, self.max_context = max_running, prefill_chunk, runner.max_context
        self.prefix = None if not prefix_cache else \
            HybridPrefixCache(self.kv, self.states) if self.states else RadixCache(self.kv)
        self.anchors = anchors if self.states and self.prefix and self.states.n_saved else None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.totals = dict(prefill_tokens=0, prefill_s=0.0, decode_tokens=0, decode_s=0.0, steps=0)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        seq.finish = seq.finish or "abort"
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._retire(seq)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_running:
            seq = self.waiting.popleft()
            if self.states:
                seq.state = self.states.alloc()
            seq.pages, seq.n_cached = self._reuse(seq)
            seq.cached = seq.checkpointed = seq.n_cached
            if self.anchors:
                seq.anchors = self.anchors.positions(seq.tokens, seq.n_cached, seq.n_prompt - 1)[-PROMPT_ANCHORS:]
            self.running.append(seq)

    def _reuse(self, seq: Sequence) -> tuple[list[int], int]:
        """KV pages of the cached prefix and its length; hybrid models restore a state checkpoint."""
        if self.prefix is None:
            return [], 0
        if self.states:
            return self.prefix.restore(seq.tokens, seq.state)
        pages = self.prefix.match(seq.tokens)
        return pages, len(pages) * self.kv.page_size

    def _plan(self) -> list[tuple[Sequence, int]]:
        """(sequence, tokens to feed) for this step: all decodes plus one prefill chunk."""
        plan = [(s, 1) for s in self.running if s.pending == 1]
        prefill = next((s for s in self.running if s.pending > 1), None)
        if prefill:
            plan.append((prefill, min(prefill.pending, self.chunk)))
        return plan

    def _reserve(self, seq: Sequence, n: int) -> None:
        need = -(-(seq.n_cached + n) // self.kv.page_size) - len(seq.pages)
        if need > 0:
            if need > len(self.kv.free) and self.prefix:
                self.prefix.evict(need - len(self.kv.free))
            seq.pages += self.kv.alloc(need)

    def step(self) -> list[tuple[Sequence, int]]:
        """Run one forward; returns (sequence, new token) for every sequence that sampled."""
        self._admit()
        plan = self._plan()
        if not plan:
            return []
        t0 = time.perf_counter()
        for s, n in plan:
            self._reserve(s, n)
        inside, ends = self._snapshots(plan)
        batch = ForwardBatch.build([(s.tokens[s.n_cached:s.n_cached + n], s.n_cached, s.pages) for s, n in plan],
                                   self.kv.page_size, self.runner.device,
                                   states=[s.state for s, _ in plan] if self.states else None, snapshots=inside)
        logits = self.runner.forward(batch, self.kv)
        self._attach([(plan[row][0], plan[row][0].n_cached + off, slot) for row, off, slot in inside], ends)
        out = []
        for (s, n), row in zip(plan, logits):
            s.n_cached += n
            if s.pending == 0:
                forced = s.params.forced
                tok = forced[len(s.output)] if len(s.output) < len(forced) else sample_row(row, s.params, s.gen)
                s.tokens.append(tok)
                out.append((s, tok))
                if self.anchors and self.anchors.at(s.tokens, s.n_cached) and s.n_cached - s.checkpointed >= GAP:
                    self._checkpoint(s)
                self._check_finish(s, tok)
        self._account(plan, time.perf_counter() - t0)
        return out

    def _snapshots(self, plan: list[tuple[Sequence, int]]):
        """Prompt anchors this step reaches: (row, offset, slot) inside a sequence's new tokens,
        saved by the linear layers, and (sequence, position, slot) at their end, saved after."""
        inside, ends = [], []
        for row, (s, n) in enumerate(plan):
            while s.anchors and s.anchors[0] <= s.n_cached + n:
                p = s.anchors.pop(0)
                if p <= s.n_cached or (slot := self.prefix.take()) is None:
                    continue
                if p < s.n_cached + n:
                    inside.append((row, p - s.n_cached, slot))
                else:
                    ends.append((s, p, slot))
        return tuple(inside), ends

    def _attach(self, saved: list[tuple[Sequence, int, int]], ends: list[tuple[Sequence, int, int]]) -> None:
        """After the forward: save the states at the chunks' ends, then hang every checkpoint of
        this step (sequence, position, slot) in the prefix tree."""
        for s, _, slot in ends:
            self.states.save(s.state, slot)
        for s, p, slot in saved + ends:
            self.prefix.attach(s.tokens[:p], s.pages, slot)
            s.checkpointed = max(s.checkpointed, p)

    def _checkpoint(self, s: Sequence) -> None:
        """Checkpoint the state after s.tokens[:n_cached] (an anchor of the output)."""
        if (slot := self.prefix.take()) is not None:
            self.states.save(s.state, slot)
            self.prefix.attach(s.tokens[:s.n_cached], s.pages, slot)
            s.checkpointed = s.n_cached

    def _account(self, plan: list[tuple[Sequence, int]], seconds: float) -> None:
        tot, chunk = self.totals, sum(n for _, n in plan if n > 1)
        tot["steps"] += 1
        if chunk:
            tot["prefill_tokens"] += chunk
            tot["prefill_s"] += seconds
        else:
            tot["decode_tokens"] += len(plan)
            tot["decode_s"] += seconds

    def _check_finish(self, s: Sequence, tok: int) -> None:
        if tok in self.eos and not s.params.ignore_eos:
            s.finish = "stop"
        elif len(s.output) >= s.params.max_tokens or len(s.tokens) >= self.max_context:
            s.finish = "length"
        if s.finish:
            self._retire(s)

    def _retire(self, s: Sequence) -> None:
        if s in self.running:
            self.running.remove(s)
        if self.prefix:
            self.prefix.insert(s.tokens[:s.n_cached], s.pages)
        self.kv.release(s.pages)
        s.pages = []
        if s.state >= 0:
            self.states.release(s.state)
            s.state = -1
