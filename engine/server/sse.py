"""Streaming plumbing shared by the APIs: one generation as parser events, server-sent-event
framing, a response that aborts the generation as soon as the client goes away, and the
collected result of a non-streaming request."""
from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol

import anyio
from starlette.responses import StreamingResponse

from engine.config import SamplingParams
from engine.errors import UserError
from engine.server.messages import APIError
from engine.server.parsers import (Event, OutputParser, ReasoningDelta, TextDelta, ToolCallEnd,
                                   ToolCallStart)
from engine.serving import Delta, Finish, Batcher

log = logging.getLogger("freetoken.server")


@dataclass
class Job:
    """One request, ready for the batcher."""
    ids: list[int]
    params: SamplingParams
    parser: OutputParser
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


async def events(batcher: Batcher, job: Job) -> AsyncIterator[Event | Finish]:
    """Parser events for the generated text, then the batcher's Finish. Leaving early (client gone,
    task cancelled) closes the batcher's stream, which aborts the request and frees its KV."""
    gen = batcher.generate(job.ids, job.params)
    try:
        async for item in gen:
            if isinstance(item, Delta):
                for ev in job.parser.feed(item.text):
                    yield ev
            else:
                for ev in job.parser.finish():
                    yield ev
                yield item
    finally:
        await gen.aclose()


def sse(data: dict | str, event: str | None = None) -> str:
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "") + f"data: {body}\n\n"


class Encoder(Protocol):
    """One API's wire format for a stream: head, one chunk list per event, tail, error."""

    def head(self) -> list[str]: ...
    def event(self, ev: Event) -> list[str]: ...
    def tail(self, fin: Finish) -> list[str]: ...
    def error(self, err: APIError) -> list[str]: ...


async def encode(enc: Encoder, stream: AsyncIterator[Event | Finish]) -> AsyncIterator[str]:
    """Run a stream through an encoder; a fault becomes the API's error event, not a cut stream."""
    for chunk in enc.head():
        yield chunk
    try:
        async for ev in stream:
            for chunk in enc.tail(ev) if isinstance(ev, Finish) else enc.event(ev):
                yield chunk
    except UserError as e:
        for chunk in enc.error(APIError(400, str(e))):
            yield chunk
    except Exception as e:  # a bug: log it with its traceback and tell the client
        log.exception("generation failed")
        for chunk in enc.error(APIError(500, f"internal error: {type(e).__name__}: {e}", "server_error")):
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
    """stop | length | abort, or tool_calls when the model stopped after calling tools."""
    return "tool_calls" if has_calls and fin.reason == "stop" else fin.reason
