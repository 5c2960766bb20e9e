"""OpenAI wire format: POST /v1/chat/completions and POST /v1/completions, streaming or not.

Chat streams send `delta.content`, `delta.reasoning_content` and `delta.tool_calls` chunks,
then a chunk with `finish_reason`, then (with `stream_options.include_usage`) a usage chunk
whose `prompt_tokens_details.cached_tokens` counts the prompt tokens served from the prefix
cache, and `data: [DONE]`."""
from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request

from engine.server import messages as m
from engine.server.state import Server, get_server
from engine.server.parsers import Event, ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallStart
from engine.server.sse import EventStream, Job, collect, encode, events, finish_reason, sse
from engine.server.structured import OutputSpec, openai_format
from engine.serving import Finish, Start

router = APIRouter()
# chat completions word every cut answer as length (the client's limit, the server's, the context)
FINISH_REASONS = {"cap": "length", "context": "length"}


class Function(m.Body):
    name: str
    arguments: str = "{}"


class ToolCall(m.Body):
    id: str
    type: str = "function"
    function: Function


class Message(m.Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(m.Body):
    name: str
    description: str | None = None
    parameters: dict | None = None


class Tool(m.Body):
    type: Literal["function"]
    function: FunctionDef


class Sampling(m.Body):
    model: str | None = None
    stream: bool = False
    stream_options: dict | None = None
    max_tokens: int | None = None
    temperature: float | None = 1.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None  # vLLM's extension: generate past end-of-sequence
    repetition_penalty: float | None = None  # vLLM's extension (default: the model's)
    n: int = 1

    def sampling(self) -> dict:
        if self.n != 1:
            raise m.APIError(400, "only n = 1 is supported", param="n")
        return dict(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                    top_k=self.top_k, seed=self.seed, stop=self.stop, ignore_eos=self.ignore_eos,
                    repetition_penalty=self.repetition_penalty)


class ChatRequest(Sampling):
    messages: list[Message]
    tools: list[Tool] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    response_format: dict | None = None
    max_completion_tokens: int | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict | None = None
    separate_reasoning: bool = True  # SGLang's extension: false leaves the reasoning in the content, tags and all


class CompletionRequest(Sampling):
    prompt: str | list[int]
    max_tokens: int | None = 16  # the Completions API default


def _reason(reason: str) -> str:
    return FINISH_REASONS.get(reason, reason)


def usage(fin: Finish) -> dict:
    return {"prompt_tokens": fin.prompt_tokens, "completion_tokens": fin.completion_tokens,
            "total_tokens": fin.prompt_tokens + fin.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": fin.cached_tokens}}


@router.post("/v1/chat/completions")
async def chat(body: ChatRequest, request: Request, s: Server = Depends(get_server)):
    tools = [m.tool(t.function.name, t.function.description, t.function.parameters, f"tools[{i}]")
             for i, t in enumerate(body.tools or [])]
    mode, name = m.openai_tool_choice(body.tool_choice)
    tools, enabled = m.choose_tools(tools, mode, name)
    msgs = m.openai_messages([x.model_dump(exclude_none=True) for x in body.messages])
    ids = s.render(msgs, tools, **{**m.effort_kwargs(body.reasoning_effort, "reasoning_effort"),
                                   **(body.chat_template_kwargs or {})})
    sampling = {**body.sampling(), "max_tokens": body.max_completion_tokens or body.max_tokens}
    output = OutputSpec(openai_format(body.response_format, "response_format"),
                        tools if mode == "required" else [], body.parallel_tool_calls and name is None)
    job = s.job(request, ids, body.model, enabled, output=output, separate_reasoning=body.separate_reasoning,
                **sampling)
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return EventStream(encode(ChatStream(job, include_usage), events(s.batcher, job)))
    res = await collect(events(s.batcher, job))
    msg: dict = {"role": "assistant", "content": res.text if res.text or not res.calls else None}
    if res.reasoning:
        msg["reasoning_content"] = res.reasoning
    if res.calls:
        msg["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                             for i, n, a in res.calls]
    return {"id": f"chatcmpl-{job.id}", "object": "chat.completion", "created": job.created, "model": job.model,
            "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": _reason(res.reason)}],
            "usage": usage(res.finish)}


class ChatStream:
    """Chat-completion chunks for one stream."""

    def __init__(self, job: Job, include_usage: bool):
        self.job, self.include_usage, self.calls = job, include_usage, False

    def chunk(self, delta: dict, finish: str | None = None) -> dict:
        j = self.job
        return {"id": f"chatcmpl-{j.id}", "object": "chat.completion.chunk", "created": j.created, "model": j.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    def head(self, start: Start) -> list[str]:
        return [sse(self.chunk({"role": "assistant", "content": ""}))]

    def event(self, ev: Event) -> list[str]:
        if isinstance(ev, TextDelta):
            delta: dict = {"content": ev.text}
        elif isinstance(ev, ReasoningDelta):
            delta = {"reasoning_content": ev.text}
        elif isinstance(ev, ToolCallStart):
            self.calls = True
            delta = {"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                                     "function": {"name": ev.name, "arguments": ""}}]}
        elif isinstance(ev, ToolCallArgsDelta):
            delta = {"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]}
        else:
            return []
        return [sse(self.chunk(delta))]

    def tail(self, fin: Finish) -> list[str]:
        last = self.chunk({}, _reason(finish_reason(fin, self.calls)))
        extra = [sse({**last, "choices": [], "usage": usage(fin)})] if self.include_usage else []
        return [sse(last), *extra, "data: [DONE]\n\n"]

    def error(self, err: m.APIError) -> list[str]:
        return [sse({"error": {"message": err.message, "type": err.kind, "param": None, "code": err.code}}),
                "data: [DONE]\n\n"]


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, s: Server = Depends(get_server)):
    ids = s.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
    job = s.job(request, ids, body.model, False, parse=False, **body.sampling())
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return EventStream(encode(CompletionStream(job, include_usage), events(s.batcher, job)))
    res = await collect(events(s.batcher, job))
    return {"id": f"cmpl-{job.id}", "object": "text_completion", "created": job.created, "model": job.model,
            "choices": [{"index": 0, "text": res.text, "logprobs": None, "finish_reason": _reason(res.reason)}],
            "usage": usage(res.finish)}


class CompletionStream(ChatStream):
    """text_completion chunks: the same framing with `text` in place of a delta."""

    def chunk(self, delta: dict, finish: str | None = None) -> dict:
        j = self.job
        return {"id": f"cmpl-{j.id}", "object": "text_completion", "created": j.created, "model": j.model,
                "choices": [{"index": 0, "text": delta.get("content", ""), "logprobs": None, "finish_reason": finish}]}

    def head(self, start: Start) -> list[str]:
        return []
