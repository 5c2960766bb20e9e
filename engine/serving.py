"""The batcher behind the HTTP server: one background thread runs scheduler steps (continuous
batching); requests arrive from the asyncio loop through an inbox and stream back tokens
through per-request asyncio queues. Cancelling a stream aborts its sequence and frees its KV."""
from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import AsyncIterator

from engine.config import SamplingParams
from engine.llm import LLM
from engine.scheduler import Sequence
from engine.tokenizer import StopText

log = logging.getLogger("freetoken.engine")


@dataclass
class Start:
    """The prompt is in (first token sampled): how much of it came from the prefix cache."""
    prompt_tokens: int
    cached_tokens: int


@dataclass
class Delta:
    text: str
    token_ids: list[int]


@dataclass
class Finish:
    reason: str                 # stop | length (max_tokens) | context (window full) | abort
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stop_sequence: str | None = None  # the stop string that ended the answer


class Batcher:
    def __init__(self, llm: LLM, model_name: str):
        self.llm, self.model_name, self.tokenizer = llm, model_name, llm.tokenizer
        self._lock = threading.Condition()
        self._inbox: list[tuple[str, Sequence]] = []
        self._sinks: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="freetoken-engine", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        self._thread.join()

    def _loop(self) -> None:
        sched = self.llm.scheduler
        while True:
            with self._lock:
                while not self._stop and not self._inbox and not sched.busy:
                    self._lock.wait()
                if self._stop:
                    return
                inbox, self._inbox = self._inbox, []
            for op, seq in inbox:
                sched.add(seq) if op == "add" else sched.abort(seq)
                if op == "abort":
                    self._emit(seq, None)
            try:
                for seq, tok in sched.step():
                    self._emit(seq, tok)
            except Exception as e:  # fail the requests in flight, keep serving the next ones
                self._fail_all(e)

    def _fail_all(self, err: Exception) -> None:
        log.exception("engine step failed; failing the requests in flight")
        sched = self.llm.scheduler
        for seq in list(sched.running) + list(sched.waiting):
            sched.abort(seq)
            seq.finish, seq.error = "error", err
            self._emit(seq, None)

    def _emit(self, seq: Sequence, tok: int | None) -> None:
        sink = self._sinks.get(seq.id)
        if sink:
            loop, q = sink
            loop.call_soon_threadsafe(q.put_nowait, (tok, seq.finish))

    def _post(self, op: str, seq: Sequence) -> None:
        with self._lock:
            self._inbox.append((op, seq))
            self._lock.notify()

    async def generate(self, prompt: list[int], params: SamplingParams) -> AsyncIterator[Start | Delta | Finish]:
        """Stream a Start, Delta(text, ids) chunks, then one Finish. Stop strings end the text early."""
        self.llm.check_prompt(prompt)
        seq, q = Sequence(prompt, params), asyncio.Queue()
        self._sinks[seq.id] = (asyncio.get_running_loop(), q)
        dec, stop = self.tokenizer.decoder(), StopText(params.stop)
        self._post("add", seq)
        started = False
        try:
            while True:
                tok, finish = await q.get()
                if finish == "error":
                    raise seq.error
                if not started:
                    started = True
                    yield Start(seq.n_prompt, seq.cached)
                hit = None
                if tok is not None and not (finish == "stop" and tok in self.tokenizer.eos_ids):
                    text, hit = stop.feed(dec.add(tok))
                    if text or hit:
                        yield Delta(text, [tok])
                    if hit:
                        finish = "stop"
                if finish:
                    if not hit and (rest := stop.flush()):
                        yield Delta(rest, [])
                    yield Finish(finish, seq.n_prompt, len(seq.output), seq.cached, hit)
                    return
        finally:
            self._sinks.pop(seq.id, None)
            if not seq.finish:
                self._post("abort", seq)

    def stats(self) -> dict:
        return self.llm.server_stats()
