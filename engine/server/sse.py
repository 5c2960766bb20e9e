"""Streaming plumbing shared by the APIs: one generation as parser events, server-sent-event
framing, a response that aborts the generation as soon as the client goes away, and the
collected result of a non-streaming request.

Why an answer ended, before each API words it: stop (end of turn or a stop string), tool_calls
(stopped after calling tools), length (the client's max_tokens), cap (the server's
--max-output-tokens), context (the context window is full), abort."""
from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Protocol

import anyio
from starlette.responses import StreamingResponse

from engine.config import SamplingParams
from engine.errors import UserError
from engine.server.messages import APIError
from engine.server.parsers import (Event, OutputParser, ReasoningDelta, TextDelta, ToolCallEnd,
                                   ToolCallStart)
from engine.serving import Batcher, Delta, Finish, Start

log = logging.getLogger("freetoken.server")


@dataclass
class Job:
    """One request, ready for the batcher."""
    ids: list[int]
    params: SamplingParams
    parser: OutputParser
    model: str
    capped: bool = False  # the server's --max-output-tokens, not the client, limits the answer
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


async def events(batcher: Batcher, job: Job) -> AsyncIterator[Start | Event | Finish]:
    """The batcher's Start, parser events for the generated text, then its Finish. Leaving early
    (client gone, task cancelled) closes the batcher's stream, which aborts the request and frees
    its KV."""
    gen = batcher.generate(job.ids, job.params)
    try:
        async for item in gen:
            if isinstance(item, Delta):
                for ev in job.parser.feed(item.text):
                    yield ev
            elif isinstance(item, Finish):
                for ev in job.parser.finish():
                    yield ev
                if item.reason == "length" and job.capped:
                    item = replace(item, reason="cap")
                yield item
            else:
                yield item
    finally:
        await gen.aclose()


def sse(data: dict | str, event: str | None = None) -> str:
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "") + f"data: {body}\n\n"


class Encoder(Protocol):
    """One API's wire format for a stream: head (once the prompt is in), one chunk list per
    event, tail, error (which may come before the head)."""

    def head(self, start: Start | None) -> list[str]: ...
    def event(self, ev: Event) -> list[str]: ...
    def tail(self, fin: Finish) -> list[str]: ...
    def error(self, err: APIError) -> list[str]: ...


async def encode(enc: Encoder, stream: AsyncIterator[Start | Event | Finish]) -> AsyncIterator[str]:
    """Run a stream through an encoder; a fault becomes the API's error event, not a cut stream."""
    err = None
    try:
        async for ev in stream:
            if isinstance(ev, Start):
                chunks = enc.head(ev)
            else:
                chunks = enc.tail(ev) if isinstance(ev, Finish) else enc.event(ev)
            for chunk in chunks:
                yield chunk
    except UserError as e:
        err = APIError(400, str(e))
    except Exception as e:  # a bug: log it with its traceback and tell the client
        log.exception("generation failed")
        err = APIError(500, f"internal error: {type(e).__name__}: {e}", "server_error")
    if err is not None:
        for chunk in enc.error(err):
            yield chunk


async def reply(state: Encoder, batcher: Batcher, job: Job, stream: bool, result):
    """A stream of the encoder's events, or, run through the same state machine, result()."""
    if stream:
        return EventStream(encode(state, events(batcher, job)))
    async for _ in encode(state, events(batcher, job)):  # events unused: the state collects them
        pass
    if state.failed:
        raise state.failed
    return result()


class EventStream(StreamingResponse):
    """text/event-stream that watches for a disconnect while it waits on the model, so an
    abandoned request is aborted at once rather than at its next token."""
    media_type = "text/event-stream"

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away between two chunks
                        pass
                    tg.cancel_scope.cancel()
                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()


@dataclass
class Result:
    """A whole generation, for non-streaming answers."""
    text: str = ""
    reasoning: str = ""
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, arguments JSON)
    finish: Finish | None = None

    @property
    def reason(self) -> str:
        assert self.finish is not None
        return finish_reason(self.finish, bool(self.calls))


async def collect(stream: AsyncIterator[Event | Finish]) -> Result:
    res, names = Result(), {}
    try:
        async for ev in stream:
            if isinstance(ev, TextDelta):
                res.text += ev.text
            elif isinstance(ev, ReasoningDelta):
                res.reasoning += ev.text
            elif isinstance(ev, ToolCallStart):
                names[ev.index] = (ev.id, ev.name)
            elif isinstance(ev, ToolCallEnd):
                res.calls.append((*names[ev.index], ev.arguments))
            elif isinstance(ev, Finish):
                res.finish = ev
    except UserError as e:
        raise APIError(400, str(e)) from None
    return res


def finish_reason(fin: Finish, has_calls: bool) -> str:
    """fin.reason, or tool_calls when the model stopped after calling tools (see the module doc)."""
    return "tool_calls" if has_calls and fin.reason in ("stop", "cap") else fin.reason
