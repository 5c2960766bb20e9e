"""Anthropic Messages wire format: POST /v1/messages (also `?beta=true`, as Claude Code calls it)
and POST /v1/messages/count_tokens.

A stream is `message_start`, then per content block (`thinking`, `text`, `tool_use`)
`content_block_start`, its `content_block_delta`s (`thinking_delta`, `text_delta`,
`input_json_delta`) and `content_block_stop`, then `message_delta` (stop_reason and final usage)
and `message_stop`; a fault mid-stream is an `error` event. Usage follows Anthropic: prompt
tokens served from the prefix cache are `cache_read_input_tokens`, the rest `input_tokens`.
Claude Code's per-request billing line in the first system block is dropped before templating
(see messages.anthropic_system), and its `system` messages after the first turn are kept in place
(messages.fold_system). `message_start` is sent once the prompt is in, so its usage already splits
the prompt into cached and uncached tokens, as `message_delta` does. `output_config.format`
(json_schema) and `tool_choice` any / tool constrain the output (engine.server.structured).
The non-streaming answer is the final message of the same state machine."""
from __future__ import annotations

import json
from typing import Literal

from fastapi import APIRouter, Depends, Request

from engine.server import messages as m
from engine.server.state import Server, get_server
from engine.server.parsers import Event, ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallEnd, ToolCallStart
from engine.server.sse import Job, finish_reason, reply, sse
from engine.server.structured import OutputSpec, json_schema
from engine.serving import Finish, Start

router = APIRouter()
# the server's --max-output-tokens ends a turn like the model would: a max_tokens stop makes
# Claude Code ask the model to resume
STOP_REASONS = {"stop": "end_turn", "cap": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "context": "model_context_window_exceeded", "abort": "end_turn"}


class Message(m.Body):
    role: Literal["user", "assistant", "system"]
    content: str | list[dict]


class CountRequest(m.Body):
    model: str
    messages: list[Message]
    system: str | list[dict] | None = None
    tools: list[dict] | None = None
    tool_choice: dict | None = None
    thinking: dict | None = None


class MessagesRequest(CountRequest):
    max_tokens: int
    stream: bool = False
    temperature: float | None = 1.0
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    output_config: dict | None = None

    def output(self, tools: list[dict], forced: bool) -> OutputSpec:
        fmt = (self.output_config or {}).get("format")
        if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "json_schema"):
            raise m.APIError(400, "output_config.format must be {type: json_schema, schema: {...}}",
                             param="output_config.format")
        schema = json_schema(fmt.get("schema"), "output_config.format.schema") if fmt else None
        choice = self.tool_choice or {}  # a named tool is called once
        parallel = choice.get("type") == "any" and not choice.get("disable_parallel_tool_use")
        return OutputSpec(schema, tools if forced else [], parallel)


def prompt(body: CountRequest, s: Server) -> tuple[list[int], list[dict], bool]:
    """(prompt ids, tools offered, is a call forced?) for a request."""
    choice = body.tool_choice or {}
    kind = choice.get("type") or "auto"
    mode = "required" if kind in ("any", "tool") else kind
    tools, _ = m.choose_tools(m.anthropic_tools(body.tools or []), mode, choice.get("name"))
    msgs = m.anthropic_messages(body.system, [x.model_dump(exclude_none=True) for x in body.messages],
                                s.options.keep_billing_header)
    thinking = (body.thinking or {}).get("type")
    kwargs = {"enable_thinking": thinking == "enabled"} if thinking in ("enabled", "disabled") else {}
    return s.render(msgs, tools, **kwargs), tools, mode == "required" and bool(tools)


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountRequest, s: Server = Depends(get_server)) -> dict:
    s.check_model(body.model)
    return {"input_tokens": len(prompt(body, s)[0])}


@router.post("/v1/messages")
async def create(body: MessagesRequest, request: Request, s: Server = Depends(get_server)):
    ids, tools, forced = prompt(body, s)
    job = s.job(request, ids, body.model, bool(tools), max_tokens=body.max_tokens, stop=body.stop_sequences,
                output=body.output(tools, forced), temperature=body.temperature, top_p=body.top_p,
                top_k=body.top_k)
    state = MessageStream(job)
    return await reply(state, s.batcher, job, body.stream, lambda: state.message)


class MessageStream:
    """Builds the message's content blocks from parser events and emits the matching events."""

    def __init__(self, job: Job):
        self.message = {"id": f"msg_{job.id}", "type": "message", "role": "assistant", "model": job.model,
                        "content": [], "stop_reason": None, "stop_sequence": None,
                        "usage": {"input_tokens": len(job.ids), "output_tokens": 0,
                                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
        self.block: dict | None = None
        self.failed: m.APIError | None = None

    @staticmethod
    def emit(kind: str, **data) -> str:
        return sse({"type": kind, **data}, kind)

    def head(self, start: Start) -> list[str]:
        self.message["usage"].update(input_tokens=start.prompt_tokens - start.cached_tokens,
                                     cache_read_input_tokens=start.cached_tokens)
        return [self.emit("message_start", message=self.message)]

    def event(self, ev: Event) -> list[str]:
        if isinstance(ev, ReasoningDelta):
            return self.open("thinking", thinking="", signature="") + self.delta("thinking", "thinking_delta", ev.text)
        if isinstance(ev, TextDelta):
            return self.open("text", text="") + self.delta("text", "text_delta", ev.text)
        if isinstance(ev, ToolCallStart):
            return self.close() + self.open("tool_use", id="toolu_" + ev.id.removeprefix("call_"), name=ev.name,
                                            input={})
        if isinstance(ev, ToolCallArgsDelta):
            return [self.emit("content_block_delta", index=self.index,
                              delta={"type": "input_json_delta", "partial_json": ev.text})]
        if isinstance(ev, ToolCallEnd):
            self.block["input"] = json.loads(ev.arguments)
            return self.close()
        return []

    @property
    def index(self) -> int:
        return len(self.message["content"]) - 1

    def delta(self, field: str, kind: str, text: str) -> list[str]:
        self.block[field] += text
        return [self.emit("content_block_delta", index=self.index, delta={"type": kind, field: text})]

    def open(self, kind: str, **fields) -> list[str]:
        if self.block is not None and self.block["type"] == kind != "tool_use":
            return []
        out = self.close()
        self.block = {"type": kind, **fields}
        self.message["content"].append(self.block)
        return out + [self.emit("content_block_start", index=self.index, content_block=self.block)]

    def close(self) -> list[str]:
        if self.block is None:
            return []
        self.block = None
        return [self.emit("content_block_stop", index=self.index)]

    def tail(self, fin: Finish) -> list[str]:
        out = self.close()
        calls = any(b["type"] == "tool_use" for b in self.message["content"])
        usage = {"input_tokens": fin.prompt_tokens - fin.cached_tokens, "output_tokens": fin.completion_tokens,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": fin.cached_tokens}
        reason = "stop_sequence" if fin.stop_sequence else STOP_REASONS[finish_reason(fin, calls)]
        self.message.update(stop_reason=reason, usage=usage)
        self.message["stop_sequence"] = fin.stop_sequence
        return out + [self.emit("message_delta", delta={"stop_reason": self.message["stop_reason"],
                                                        "stop_sequence": fin.stop_sequence}, usage=usage),
                      self.emit("message_stop")]

    def error(self, err: m.APIError) -> list[str]:
        self.failed = err
        kind = "api_error" if err.status >= 500 else "invalid_request_error"
        return [self.emit("error", error={"type": kind, "message": err.message})]
