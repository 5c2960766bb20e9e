"""OpenAI Responses wire format: POST /v1/responses, the API Codex CLI speaks.

A stream is `response.created`, `response.in_progress`, then per output item (reasoning,
message, function_call) `response.output_item.added`, its deltas (`response.reasoning_text.delta`,
`response.output_text.delta`, `response.function_call_arguments.delta`) and
`response.output_item.done`, and finally `response.completed`, carrying usage with
`input_tokens_details.cached_tokens`. An answer cut by the client's `max_output_tokens` ends with
`response.incomplete` (reason max_output_tokens); one cut by the server's --max-output-tokens ends
as completed (Codex treats an incomplete response as an error); one that filled the context
window ends with `response.failed`, error code context_length_exceeded (the code Codex reads as
a full context window); an error during generation with `response.failed`. Tools of types other
than `function` (web_search, ...) are ignored. `text.format` (json_object, json_schema) and
`tool_choice` required / a named function constrain the output (engine.server.structured). The
non-streaming answer is the final response object of the same state machine."""
from __future__ import annotations

import uuid

from fastapi import APIRouter, Depends, Request

from engine.server import messages as m
from engine.server.state import Server, get_server
from engine.server.parsers import Event, ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallEnd, ToolCallStart
from engine.server.sse import Job, reply, sse
from engine.server.structured import OutputSpec, openai_format
from engine.serving import Finish, Start

router = APIRouter()


class ResponsesRequest(m.Body):
    model: str | None = None
    input: str | list[dict]
    instructions: str | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    text: dict | None = None
    stream: bool = False
    max_output_tokens: int | None = None
    temperature: float | None = 1.0
    top_p: float | None = None
    reasoning: dict | None = None
    previous_response_id: str | None = None


@router.post("/v1/responses")
async def responses(body: ResponsesRequest, request: Request, s: Server = Depends(get_server)):
    if body.previous_response_id:
        raise m.APIError(400, "previous_response_id is not supported (responses are not stored); "
                         "send the whole conversation as input", param="previous_response_id")
    mode, name = m.openai_tool_choice(body.tool_choice)
    tools, enabled = m.choose_tools(m.responses_tools(body.tools or []), mode, name)
    ids = s.render(m.responses_messages(body.instructions, body.input), tools, where="input",
                   **m.effort_kwargs((body.reasoning or {}).get("effort"), "reasoning.effort"))
    fmt = (body.text or {}).get("format")
    output = OutputSpec(openai_format(fmt, "text.format"), tools if mode == "required" else [],
                        body.parallel_tool_calls and name is None)
    job = s.job(request, ids, body.model, enabled, max_tokens=body.max_output_tokens, output=output,
                temperature=body.temperature, top_p=body.top_p)
    state = ResponseStream(job, body.tools or [], body.tool_choice or "auto", fmt or {"type": "text"})
    return await reply(state, s.batcher, job, body.stream, lambda: state.response)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class ResponseStream:
    """Builds the response's output items from parser events and emits the matching events."""

    def __init__(self, job: Job, tools: list[dict], tool_choice: str | dict, fmt: dict):
        self.job, self.seq = job, 0
        self.response = {"id": f"resp_{job.id}", "object": "response", "created_at": job.created,
                         "status": "in_progress", "model": job.model, "output": [], "usage": None, "error": None,
                         "incomplete_details": None, "parallel_tool_calls": True, "tool_choice": tool_choice,
                         "tools": tools, "text": {"format": fmt}}
        self.item: dict | None = None  # the output item being streamed
        self.failed: m.APIError | None = None

    def emit(self, kind: str, **data) -> str:
        self.seq += 1
        return sse({"type": kind, "sequence_number": self.seq - 1, **data}, kind)

    def head(self, start: Start) -> list[str]:
        return [self.emit("response.created", response=self.response),
                self.emit("response.in_progress", response=self.response)]

    def where(self) -> dict:
        return {"item_id": self.item["id"], "output_index": len(self.response["output"]) - 1}

    def event(self, ev: Event) -> list[str]:
        out: list[str] = []
        if isinstance(ev, ReasoningDelta):
            out += self.open("reasoning")
            self.item["content"][0]["text"] += ev.text
            out.append(self.emit("response.reasoning_text.delta", **self.where(), content_index=0, delta=ev.text))
        elif isinstance(ev, TextDelta):
            out += self.open("message")
            self.item["content"][0]["text"] += ev.text
            out.append(self.emit("response.output_text.delta", **self.where(), content_index=0, delta=ev.text,
                                 logprobs=[]))
        elif isinstance(ev, ToolCallStart):
            out += self.close() + self.open("function_call", call_id=ev.id, name=ev.name)
        elif isinstance(ev, ToolCallArgsDelta):
            self.item["arguments"] += ev.text
            out.append(self.emit("response.function_call_arguments.delta", **self.where(), delta=ev.text))
        elif isinstance(ev, ToolCallEnd):
            self.item["arguments"] = ev.arguments
            out += self.close()
        return out

    def open(self, kind: str, **fields) -> list[str]:
        if self.item is not None and self.item["type"] == kind and kind != "function_call":
            return []
        out = self.close()
        if kind == "message":
            self.item = {"id": _id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                         "content": []}
        elif kind == "reasoning":
            self.item = {"id": _id("rs"), "type": "reasoning", "summary": [], "content": []}
        else:
            self.item = {"id": _id("fc"), "type": "function_call", "status": "in_progress", "arguments": "", **fields}
        self.response["output"].append(self.item)
        out.append(self.emit("response.output_item.added", output_index=len(self.response["output"]) - 1,
                             item=self.item))
        part = {"message": {"type": "output_text", "text": "", "annotations": []},
                "reasoning": {"type": "reasoning_text", "text": ""}}.get(kind)
        if part:
            out.append(self.emit("response.content_part.added", **self.where(), content_index=0, part=part))
            self.item["content"].append(dict(part))
        return out

    def close(self) -> list[str]:
        item, out = self.item, []
        if item is None:
            return out
        if item["type"] == "function_call":
            out.append(self.emit("response.function_call_arguments.done", **self.where(),
                                 name=item["name"], arguments=item["arguments"]))
        else:
            kind, part = "output_text" if item["type"] == "message" else "reasoning_text", item["content"][0]
            out.append(self.emit(f"response.{kind}.done", **self.where(), content_index=0, text=part["text"]))
            out.append(self.emit("response.content_part.done", **self.where(), content_index=0, part=part))
        if "status" in item:
            item["status"] = "completed"
        out.append(self.emit("response.output_item.done", output_index=self.where()["output_index"], item=item))
        self.item = None
        return out

    def tail(self, fin: Finish) -> list[str]:
        out = self.close()
        r = self.response
        r["usage"] = {"input_tokens": fin.prompt_tokens, "input_tokens_details": {"cached_tokens": fin.cached_tokens},
                      "output_tokens": fin.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": fin.prompt_tokens + fin.completion_tokens}
        if fin.reason == "length":
            r["status"], r["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
            return out + [self.emit("response.incomplete", response=r)]
        if fin.reason == "context":
            r["status"], r["error"] = "failed", {
                "code": "context_length_exceeded",
                "message": f"the conversation filled the model's context window ({fin.prompt_tokens + fin.completion_tokens}"
                           " tokens); start a new conversation or compact this one"}
            return out + [self.emit("response.failed", response=r)]
        r["status"] = "completed"
        return out + [self.emit("response.completed", response=r)]

    def error(self, err: m.APIError) -> list[str]:
        self.failed = err
        self.response.update(status="failed", error={"code": err.code or err.kind, "message": err.message})
        return [self.emit("response.failed", response=self.response)]
