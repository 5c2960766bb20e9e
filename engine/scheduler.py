"""Requests and steps: each step decodes every running sequence by one token and, when a
prompt is waiting, adds one prefill chunk of it to the same batch (chunked prefill), so a long
prompt never freezes other streams.

The running sequences share one KV pool (--max-context tokens by default, so running more
requests costs no memory up front). When a step needs pages the pool does not have, the prefix
cache gives back unused pages first; then the most recently admitted sequences are preempted:
their pages go to the prefix cache and they wait at the head of the queue, to resume (mostly
from that cache) when there is room. The oldest sequence always fits, so every request ends.

Hybrid models also hold two recurrent-state slots per running sequence, a decode step reading one
and writing the other (so a step launched ahead leaves its predecessor's state for a checkpoint),
and checkpoint the state at semantic anchors (engine.kv.anchors, engine.kv.checkpoints): the last
PROMPT_ANCHORS anchors of the part of a sequence it has yet to prefill (its end counts as one),
and the anchors of the output (each at least anchors.GAP tokens after the sequence's previous
checkpoint). A preempted sequence gives its slots back and is checkpointed where it stopped, to
resume from there.

Models with sliding-window layers (gpt-oss) give back those layers' pages behind each sequence's
window after every step (engine.kv.paged.SlidingPool); the prefix cache keeps the window at each
prompt's end and where a sequence stops (engine.kv.windows), and a request resumes at the deepest
kept window its prompt continues.

Tokens are sampled on the device, and while every running sequence only decodes, the next step
is launched with them before the host reads them (Scheduler._launch_ahead), so the GPU does not
wait for the host's books; a sequence that ends drops the step launched past its end.

Between two steps is a safe point: work that changes what a step runs on (resizing the expert
cache) waits for it, from any thread; a step launched ahead completes first."""
from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.config import SamplingParams
from engine.constrain import Constraint, Grammars
from engine.errors import UserError
from engine.kv.anchors import GAP, Anchors
from engine.kv.batch import ForwardBatch
from engine.kv.checkpoints import HybridPrefixCache
from engine.kv.radix import RadixCache
from engine.kv.windows import SlidingPrefixCache
from engine.sampling import GREEDY, generator, sample, seen_mask

_ids = itertools.count()
PROMPT_ANCHORS = 8


@dataclass(eq=False)  # a sequence is itself: compared (in, remove) by identity, never by its fields
class Sequence:
    tokens: list[int]                    # prompt + generated
    params: SamplingParams
    n_prompt: int = 0
    n_cached: int = 0                    # tokens whose KV is written
    cached: int = 0                      # prompt tokens reused from the prefix cache
    pages: list[int] = field(default_factory=list)
    sliding: list[int] = field(default_factory=list)  # its pages in the sliding layers' pool, by the same index
    state: int = -1                      # recurrent-state slot (hybrid models): the newest state
    spare: int = -1                      # and the slot its next decode step writes
    anchors: list[int] = field(default_factory=list)  # positions to checkpoint while prefilling
    checkpointed: int = 0                # the position of the last checkpoint taken
    finish: str | None = None            # stop | length (max_tokens) | context (window full) | abort | error
    error: Exception | None = None
    admitted: bool = False
    constraint: Constraint | None = None  # the grammar's state, when params.grammar is set
    seen: torch.Tensor | None = None     # with a repetition penalty: its tokens' mask (sampling.seen_mask)
    gen: torch.Generator | None = None   # a sampler's generator, on the device that samples
    id: int = field(default_factory=lambda: next(_ids))
    _page_array: tuple | None = field(default=None, repr=False)  # (the pages list, its int32 copy)

    def __post_init__(self):
        self.tokens = list(self.tokens)  # its own list: the caller's prompt stays as it was
        self.n_prompt = len(self.tokens)

    def page_array(self) -> np.ndarray:
        """`pages` as int32, kept beside the list as it grows (only appended to in place; a new
        list is copied anew): a step's batch then copies it instead of converting the whole list,
        22 us a step at 32k tokens and 45 at 64k on the CPU machine."""
        held, arr = self._page_array or (None, None)
        if held is not self.pages:
            arr = np.array(self.pages, np.int32)
        elif len(arr) < len(held):
            arr = np.concatenate([arr, np.array(held[len(arr):], np.int32)])
        self._page_array = (self.pages, arr)
        return arr

    @property
    def output(self) -> list[int]:
        return self.tokens[self.n_prompt:]

    @property
    def n_output(self) -> int:
        return len(self.tokens) - self.n_prompt

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.n_cached


@dataclass(eq=False)
class _Launched:
    """A step queued on the device, its tokens not yet read."""
    plan: list[tuple[Sequence, int]]
    samples: list[bool]            # the rows that sample a token (a prompt's last chunk, a decode)
    top: torch.Tensor | None       # their tokens, on the device
    host: torch.Tensor | None      # the same, copied to the host in stream order
    done: object = None            # a blocking CUDA event after both
    cached: list[int] = field(default_factory=list)  # per row: its tokens in KV after this step
    states: list[int] = field(default_factory=list)  # and the state slot this step wrote (hybrid models)


class Scheduler:
    def __init__(self, runner, eos_ids: set[int], max_running: int, prefill_chunk: int,
                 prefix_cache: bool = True, grammars: Grammars | None = None, anchors: Anchors | None = None):
        self.runner, self.kv, self.eos, self.grammars = runner, runner.kv, eos_ids, grammars
        self.states, self.sliding = runner.states, self.kv.sliding
        self.max_running, self.chunk, self.max_context = max_running, prefill_chunk, runner.max_context
        self.prefix = None if not prefix_cache else HybridPrefixCache(self.kv, self.states) if self.states \
            else SlidingPrefixCache(self.kv) if self.sliding else RadixCache(self.kv)
        # without anchor tokens (no template) a prompt's end is still checkpointed, for its follow-up
        self.anchors = (anchors or Anchors(frozenset(), frozenset())) if self.states and self.prefix \
            and self.states.n_saved else None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.totals = dict(prefill_tokens=0, prefill_s=0.0, decode_tokens=0, decode_s=0.0, steps=0, preempted=0)
        self._lock = threading.RLock()  # held by a step (and an abort): free between steps
        self._pending: deque[tuple] = deque()
        self._ahead: _Launched | None = None  # a decode step launched before the last one's tokens were read
        self._ready: list[tuple[Sequence, int]] = []  # tokens of a step completed early (_drain), not yet returned
        # where a step's tokens land on the host: two buffers, for the step read and the one ahead of it
        self._host_top = [torch.empty(max_running + 1, dtype=torch.int64, pin_memory=True) for _ in range(2)] \
            if runner.device.type == "cuda" else None

    def safe_point(self, fn):
        """Run fn() between two steps, from any thread, and return its result (or raise its
        error): the thread that steps runs it before its next step; while none steps, the
        calling thread does."""
        fut = Future()
        self._pending.append((fn, fut))
        while not fut.done():
            if self._lock.acquire(timeout=0.05):
                try:
                    self._run_pending()
                finally:
                    self._lock.release()
        return fut.result()

    def _run_pending(self) -> None:
        if self._pending:  # what runs at a safe point sees no step in flight
            self._drain()
        while self._pending:
            fn, fut = self._pending.popleft()
            try:
                fut.set_result(fn())
            except Exception as e:  # the caller of safe_point raises it
                fut.set_exception(e)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        with self._lock:
            seq.finish = seq.finish or "abort"
            if seq in self.waiting:
                self.waiting.remove(seq)
            self._retire(seq)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self._ahead or self._ready)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_running:
            seq = self.waiting[0]
            if self.running and self._short(seq):
                return  # wait for room rather than preempt the sequences already running
            self.waiting.popleft()
            if self.states:
                seq.state, seq.spare = self.states.alloc(), self.states.alloc()
            seq.pages, seq.n_cached = self._reuse(seq)
            seq.checkpointed = seq.n_cached
            if self.anchors:
                end = len(seq.tokens)  # the prompt's end too: a follow-up or a retry may continue it
                ps = self.anchors.positions(seq.tokens, seq.n_cached, end - 1)
                seq.anchors = (ps + [end] * (end - (ps[-1] if ps else seq.n_cached) >= GAP))[-PROMPT_ANCHORS:]
            if not seq.admitted:
                seq.cached, seq.admitted = seq.n_cached, True
                if seq.params.grammar and seq.constraint is None:
                    seq.constraint = self.grammars.matcher(seq.params.grammar)
            self.running.append(seq)

    def _reuse(self, seq: Sequence) -> tuple[list[int], int]:
        """KV pages of the cached prefix and its length; hybrid models restore a state checkpoint,
        models with sliding layers take the pages of its window too (seq.sliding)."""
        if self.prefix is None:
            return [], 0
        if self.states:
            return self.prefix.restore(seq.tokens, seq.state)
        if self.sliding:
            pages, seq.sliding = self.prefix.resume(seq.tokens)
        else:
            pages = self.prefix.match(seq.tokens)
        return pages, len(pages) * self.kv.page_size

    def _short(self, seq: Sequence) -> bool:
        """True if the pool (with what the prefix cache could give back) lacks the pages of the
        sequence's first chunk."""
        first = min(len(seq.tokens), self.chunk) + 1
        if self.sliding and self.sliding.wanted([], first) > len(self.sliding.free) + \
                (self.prefix.evictable_windows() if self.prefix else 0):
            return True
        return -(-first // self.kv.page_size) > len(self.kv.free) + (self.prefix.evictable() if self.prefix else 0)

    def _plan(self) -> list[tuple[Sequence, int]]:
        """(sequence, tokens to feed) for this step: all decodes plus one prefill chunk."""
        plan = [(s, 1) for s in self.running if s.pending == 1]
        prefill = next((s for s in self.running if s.pending > 1), None)
        if prefill:
            plan.append((prefill, min(prefill.pending, self.chunk)))
        return plan

    def _wanted(self, seq: Sequence, n: int) -> tuple[int, int]:
        """Pages (and sliding-window pages) that n more tokens of seq take beyond those it holds."""
        end = seq.n_cached + n
        sliding = self.sliding.wanted(seq.sliding, end) if self.sliding else 0
        return -(-end // self.kv.page_size) - len(seq.pages), sliding

    def _reserve(self, seq: Sequence, n: int) -> bool:
        """Pages for n more tokens of seq, preempting newer sequences if needed; False if even
        that is not enough (seq is then preempted itself)."""
        end = seq.n_cached + n
        need, sliding = self._wanted(seq, n)
        while need > len(self.kv.free) or (self.sliding and sliding > len(self.sliding.free)):
            if self.prefix and self.prefix.make_room(need, sliding):
                continue
            newer = self.running[self.running.index(seq) + 1:]
            if not newer:
                if seq is self.running[0]:  # alone, with nothing to evict: it would wait forever
                    raise UserError(f"KV cache is full ({self.kv.n_pages} pages of {self.kv.page_size} tokens) "
                                    f"and cannot hold {end} tokens of one request; raise --max-context")
                self._preempt(seq)
                return False
            self._preempt(newer[-1])
        if need > 0:
            seq.pages += self.kv.alloc(need)
        if self.sliding:
            self.sliding.grow(seq.sliding, end)
        return True

    def _preempt(self, s: Sequence) -> None:
        self.running.remove(s)
        if self.states and self.prefix and s.n_cached > s.checkpointed:
            self._checkpoint(s, s.state, s.n_cached)  # its state where it stopped, which no KV page can give back
        self._donate(s)
        s.n_cached = 0
        self.waiting.appendleft(s)
        self.totals["preempted"] += 1

    def step(self) -> list[tuple[Sequence, int]]:
        """Run one forward; returns (sequence, new token) for every sequence that sampled."""
        with self._lock:
            self._run_pending()
            if self._ready:
                out, self._ready = self._ready, []
                return out
            try:
                return self._step()
            except BaseException:
                self._ahead = None
                raise

    def _step(self) -> list[tuple[Sequence, int]]:
        """Complete one step: the one launched ahead by the last call, else a new one. Before
        reading its tokens, the next decode step is launched when it can be (_launch_ahead), so
        the GPU runs it while the host reads these tokens and keeps its books."""
        t0 = time.perf_counter()
        cur, self._ahead = self._ahead, None
        if cur is None:
            self._admit()
            plan = self._plan()
            # a reservation may preempt sequences planned before or after it: keep the survivors
            reserved = [s for s, n in plan if s in self.running and self._reserve(s, n)]
            plan = [(s, n) for s, n in plan if s in reserved and s in self.running]
            if not plan:
                return []
            cur = self._launch(plan)
        self._ahead = self._launch_ahead(cur)
        out = self._complete(cur)
        self._account(cur.plan, time.perf_counter() - t0)
        return out

    def _drain(self) -> None:
        """Complete the step launched ahead, keeping its tokens for the next step() to return."""
        if self._ahead is not None:
            cur, self._ahead = self._ahead, None
            self._ready += self._complete(cur)

    def _launch(self, plan: list[tuple[Sequence, int]], ids: torch.Tensor | None = None) -> "_Launched":
        """Queue the forward of `plan` and the sampling of its rows on the device, without waiting
        for it. ids: the new tokens as a device tensor (a step launched ahead: the last step's
        tokens, not yet read), one per sequence."""
        inside, ends = self._snapshots(plan)
        batch = ForwardBatch.build([([0] if ids is not None else s.tokens[s.n_cached:s.n_cached + n], s.n_cached,
                                     s.page_array()) for s, n in plan],
                                   self.kv.page_size, self.runner.device,
                                   states=[s.state for s, _ in plan] if self.states else None, snapshots=inside,
                                   sliding=[s.sliding for s, _ in plan] if self.sliding else None,
                                   states_out=[s.spare if n == 1 else s.state for s, n in plan] if self.states else None)
        if ids is not None:
            batch = dataclasses.replace(batch, input_ids=ids)
        logits = self.runner.forward(batch, self.kv, wait=False)
        if self.states:  # a decode step wrote the spare slot: it holds the newest state now
            for s, n in plan:
                if n == 1:
                    s.state, s.spare = s.spare, s.state
        self._attach([(plan[row][0], plan[row][0].n_cached + off, slot) for row, off, slot in inside], ends)
        samples = [ids is not None or s.pending == n for s, n in plan]
        for s, n in plan:
            s.n_cached += n
            if self.sliding:
                self._slide(s, n)
        top, host, done = self._sample(plan, samples, logits), None, None
        if top is not None:
            host = top
            if self._host_top is not None:  # back in the step's own stream order, into pinned memory
                self._host_top.reverse()
                host = self._host_top[0][:len(plan)]
                host.copy_(top, non_blocking=True)
        if self._host_top is not None:  # a blocking event: the host sleeps rather than spins for the step
            done = torch.cuda.Event(blocking=True)
            done.record()
        return _Launched(plan, samples, top, host, done, [s.n_cached for s, _ in plan], [s.state for s, _ in plan])

    def _sample(self, plan: list[tuple[Sequence, int]], samples: list[bool], logits: torch.Tensor) -> torch.Tensor | None:
        """Every sampling row's token, on the device (a row that samples nothing: its argmax,
        unused). A grammar masks its row first; a repetition penalty's mask takes the token."""
        if not any(samples):
            return None
        rows, params, gens, seen = logits, [], [], []
        for i, ((s, _), x) in enumerate(zip(plan, samples)):
            p = s.params if x else GREEDY
            if x and s.constraint:
                rows = rows.clone() if rows is logits else rows
                rows[i] = s.constraint.mask(rows[i])
            if p.repetition_penalty != 1.0 and s.seen is None:
                s.seen = seen_mask(s.tokens, logits.shape[-1], logits.device)
            if p.temperature > 0 and s.gen is None:
                s.gen = generator(p, logits.device)
            params.append(p), gens.append(s.gen), seen.append(s.seen)
        top = sample(rows, params, gens, seen)
        for i, (s, _) in enumerate(plan):
            if samples[i] and s.seen is not None and s.n_output >= len(s.params.forced):
                s.seen.index_fill_(0, top[i:i + 1], True)
        return top

    def _launch_ahead(self, cur: "_Launched") -> "_Launched | None":
        """The next decode step of cur's sequences, launched before cur's tokens are read, when
        nothing can change it: every running sequence is in it (none has a prompt to prefill),
        samples and has no grammar or forced token (which need the host), and cannot end by length
        or context; nothing waits to be admitted or run at a safe point; the pool has the pages
        without preempting; one rank (several follow rank 0's steps by value). A hybrid model's
        step writes its sequences' spare state slots, leaving cur's states for a checkpoint."""
        seqs = [s for s, _ in cur.plan]
        if self.waiting or self._pending or self.runner.group is not None \
                or not all(cur.samples) or len(seqs) != len(self.running):
            return None
        if any(s.finish or s.constraint or s.n_output < len(s.params.forced)
               or s.n_output + 1 >= s.params.max_tokens or len(s.tokens) + 1 >= self.max_context for s in seqs):
            return None
        need, sliding = (sum(w) for w in zip(*(self._wanted(s, 1) for s in seqs)))
        if need > len(self.kv.free) or self.sliding and sliding > len(self.sliding.free):
            return None
        for s in seqs:
            self._reserve(s, 1)  # fits: no preemption
        return self._launch([(s, 1) for s in seqs], cur.top)

    def _complete(self, cur: "_Launched") -> list[tuple[Sequence, int]]:
        """Wait for a launched step and take its rows' tokens. A row whose sequence ended meanwhile
        (a step launched ahead of its end) is dropped."""
        if cur.done is not None:
            cur.done.synchronize()
        top = cur.host.tolist() if cur.host is not None else None
        out = []
        for i, (s, n) in enumerate(cur.plan):
            if not cur.samples[i] or s.finish:
                continue
            forced = s.params.forced
            tok = forced[s.n_output] if s.n_output < len(forced) else top[i]
            if s.n_output < len(forced) and s.seen is not None:
                s.seen[tok] = True
            if s.constraint:
                s.constraint.advance(tok)
            s.tokens.append(tok)
            out.append((s, tok))
            n_cached = cur.cached[i]  # this step's (a step launched ahead has moved s.n_cached on)
            if self.anchors and self.anchors.at(s.tokens, n_cached) and n_cached - s.checkpointed >= GAP:
                self._checkpoint(s, cur.states[i], n_cached)
            self._check_finish(s, tok)
        return out

    def _slide(self, s: Sequence, n: int) -> None:
        """After a step of n tokens of s: keep its prompt's window in the prefix cache if the step
        reached the prompt's end, then give back its sliding pages behind the window."""
        if self.prefix and s.n_cached - n < s.n_prompt <= s.n_cached:
            self.prefix.keep(s.tokens[:s.n_prompt], s.pages, s.sliding)
        self.sliding.slide(s.sliding, s.n_cached - n, s.n_cached)

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

    def _checkpoint(self, s: Sequence, state: int, n_cached: int) -> None:
        """Checkpoint the state after s.tokens[:n_cached] (an anchor of the output, or where a
        preempted sequence stopped), which live slot `state` holds."""
        if (slot := self.prefix.take()) is not None:
            self.states.save(state, slot)
            self.prefix.attach(s.tokens[:n_cached], s.pages, slot)
            s.checkpointed = n_cached

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
        elif s.n_output >= s.params.max_tokens:
            s.finish = "length"
        elif len(s.tokens) >= self.max_context:
            s.finish = "context"
        if s.finish:
            self._retire(s)

    def _retire(self, s: Sequence) -> None:
        if s in self.running:
            self.running.remove(s)
        self._donate(s)

    def _donate(self, s: Sequence) -> None:
        """Give the sequence's full pages (and its window) to the prefix cache and release its own
        references."""
        if self.prefix and self.sliding:
            self.prefix.keep(s.tokens[:s.n_cached], s.pages, s.sliding)
        elif self.prefix:
            self.prefix.insert(s.tokens[:s.n_cached], s.pages)
        self.kv.release(s.pages)
        s.pages = []
        if self.sliding:
            self.sliding.release(s.sliding)
            s.sliding = []
        if s.state >= 0:
            self.states.release(s.state)
            self.states.release(s.spare)
            s.state = s.spare = -1
