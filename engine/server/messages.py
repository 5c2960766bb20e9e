"""Request bodies -> chat-template messages and tools, shared by the three HTTP APIs.

Every API is converted to the HuggingFace chat-template convention: messages
`{"role", "content": str}`, assistant `tool_calls` as `[{"id", "type": "function", "function":
{"name", "arguments": dict}}]`, earlier thinking as `reasoning_content`, tool results as
`{"role": "tool", "tool_call_id", "content"}`, and tools as `[{"type": "function", "function":
{"name", "description", "parameters"}}]`. Input a client can fix raises `APIError`.
"""
from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

BILLING_PREFIX = "x-anthropic-billing-header:"
TEXT_PARTS = ("text", "input_text", "output_text", "reasoning_text", "summary_text")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


class APIError(Exception):
    """An HTTP error answered in the calling API's own error shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code


class Body(BaseModel):
    """Base of every request model: unknown fields are accepted, known ones must have their type."""
    model_config = ConfigDict(extra="allow", strict=True)


def text_of(content: Any, where: str) -> str:
    """A content string or a list of text parts -> one string; other part types are refused."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(400, f"{where} must be a string or a list of content parts", param=where)
    out = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise APIError(400, f"{where}: content of type {kind!r} is not supported (text only)", param=where)
        out.append(part["text"])
    return "".join(out)


def tool(name: Any, description: Any, parameters: Any, where: str) -> dict:
    """One validated tool in chat-template form."""
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise APIError(400, f"{where}: a tool name must be 1-128 letters, digits, '_', '.', ':' or '-'", param=where)
    params = {"type": "object", "properties": {}} if parameters is None else parameters
    if not isinstance(params, dict) or params.get("type", "object") != "object" \
            or not isinstance(params.get("properties", {}), dict):
        raise APIError(400, f"{where}: the tool's parameters must be a JSON schema of type 'object'", param=where)
    if description is not None and not isinstance(description, str):
        raise APIError(400, f"{where}: the tool's description must be a string", param=where)
    return {"type": "function", "function": {"name": name, "description": description or "", "parameters": params}}


def choose_tools(tools: list[dict], mode: str, name: str | None) -> tuple[list[dict], bool]:
    """(tools for the template, parse tool calls?) after tool_choice none | auto | required | a name."""
    if mode == "none":
        return [], False
    if name is not None:
        tools = [t for t in tools if t["function"]["name"] == name]
        if not tools:
            raise APIError(400, f"tool_choice names the tool {name!r}, which is not in tools", param="tool_choice")
    return tools, bool(tools)


def openai_tool_choice(choice: str | dict | None) -> tuple[str, str | None]:
    """(mode, forced tool name) from none | auto | required | {"type": "function", "function": {"name"}}."""
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
        if not isinstance(name, str):
            raise APIError(400, "tool_choice must name a function", param="tool_choice")
        return "required", name
    if choice not in (None, "none", "auto", "required"):
        raise APIError(400, "tool_choice must be none, auto, required or a function", param="tool_choice")
    return choice or "auto", None


def arguments(args: Any) -> Any:
    """Tool-call arguments as the template wants them: a dict when they are a JSON object."""
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            return args
        return parsed if isinstance(parsed, dict) else args
    return args


def call(call_id: str, name: str, args: Any) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments(args)}}


def assistant(content: str = "", reasoning: str = "", calls: list[dict] | None = None) -> dict:
    msg: dict = {"role": "assistant", "content": content}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    return msg


def fold_system(messages: list[dict], later_ok: bool) -> list[dict]:
    """Join the leading system messages (instructions, developer items) into one: many chat
    templates accept only one system message, and only at the start. A later system message
    (Claude Code sends one mid-conversation; Codex sends developer items) stays where it is if
    the template renders it there (later_ok); otherwise it goes into the next user turn as a
    `<system-reminder>` block, in order, the way Claude Code itself falls back."""
    n = next((i for i, msg in enumerate(messages) if msg["role"] != "system"), len(messages))
    out = [{"role": "system", "content": "\n\n".join(msg["content"] for msg in messages[:n])}] if n else []
    held: list[str] = []
    for msg in messages[n:]:
        if msg["role"] == "system" and not later_ok:
            held.append(f"<system-reminder>\n{msg['content']}\n</system-reminder>")
        elif msg["role"] == "user" and held:
            out.append({**msg, "content": "\n\n".join(held + [msg["content"]])})
            held = []
        else:
            out.append(msg)
    if held:
        out.append({"role": "user", "content": "\n\n".join(held)})
    return out


# a request's reasoning effort -> the level gpt-oss's Harmony template knows (its
# `reasoning_effort` variable: low, medium or high); the APIs' other levels take the nearest
EFFORTS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}


def effort_kwargs(effort: Any, param: str) -> dict:
    """Chat-template kwargs for a requested reasoning effort (None: the template's default).
    Templates without the variable ignore it."""
    if effort is None:
        return {}
    if effort not in EFFORTS:
        raise APIError(400, f"{param} must be one of {', '.join(EFFORTS)}", param=param)
    return {"reasoning_effort": EFFORTS[effort]}


def check_not_empty(messages: list[dict], where: str) -> None:
    """A conversation needs something besides system text to answer."""
    if all(msg["role"] == "system" for msg in messages):
        raise APIError(400, f"{where}: the conversation is empty; send at least one message with content",
                       param=where)


# ---- OpenAI chat completions -------------------------------------------------------------

def openai_messages(messages: list[dict]) -> list[dict]:
    out = []
    for i, m in enumerate(messages):
        where, role = f"messages[{i}]", m["role"]
        content = text_of(m.get("content"), f"{where}.content")
        if role == "assistant":
            calls = [call(c["id"], c["function"]["name"], c["function"]["arguments"])
                     for c in m.get("tool_calls") or []]
            out.append(assistant(content, m.get("reasoning_content") or m.get("reasoning") or "", calls))
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": m.get("tool_call_id") or "", "content": content})
        else:
            out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


# ---- OpenAI Responses ----------------------------------------------------------------------

def responses_messages(instructions: str | None, items: str | list[dict]) -> list[dict]:
    out = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(items, str):
        return out + [{"role": "user", "content": items}]
    reasoning = ""
    for i, item in enumerate(items):
        kind, where = item.get("type", "message"), f"input[{i}]"
        if kind == "reasoning":
            reasoning += text_of(item.get("content") or item.get("summary"), where)
        elif kind == "function_call":
            if not out or out[-1]["role"] != "assistant":
                out.append(assistant(reasoning=reasoning))
                reasoning = ""
            out[-1].setdefault("tool_calls", []).append(
                call(item.get("call_id", ""), item.get("name", ""), item.get("arguments", "{}")))
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id", ""),
                        "content": output if isinstance(output, str) else text_of(output, f"{where}.output")})
        elif kind == "message":
            role, content = item.get("role"), text_of(item.get("content"), f"{where}.content")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(400, f"{where}.role must be user, assistant, system or developer", param=where)
            out.append(assistant(content, reasoning) if role == "assistant" else
                       {"role": "system" if role == "developer" else role, "content": content})
            reasoning = "" if role == "assistant" else reasoning
        # other item types (web_search_call, local_shell_call, ...) belong to tools we do not serve
    return out


def responses_tools(tools: list[dict]) -> list[dict]:
    """Function tools; other tool types (web_search, custom, ...) are ignored, not rejected."""
    return [tool(t.get("name"), t.get("description"), t.get("parameters"), f"tools[{i}]")
            for i, t in enumerate(tools) if t.get("type") == "function"]


# ---- Anthropic Messages --------------------------------------------------------------------

def anthropic_system(system: str | list[dict] | None, keep_billing: bool) -> str:
    """The system prompt as text, without Claude Code's per-request billing line (it changes
    every request, so it would defeat prefix caching) unless keep_billing."""
    blocks = [{"type": "text", "text": system}] if isinstance(system, str) else list(system or [])
    if blocks and not keep_billing and str(blocks[0].get("text", "")).startswith(BILLING_PREFIX):
        rest = blocks[0]["text"].partition("\n")[2]
        blocks = ([{"type": "text", "text": rest}] if rest.strip() else []) + blocks[1:]
    return "\n\n".join(text_of([b], "system") for b in blocks)


def anthropic_messages(system: Any, messages: list[dict], keep_billing: bool) -> list[dict]:
    sys_text = anthropic_system(system, keep_billing)
    out = [{"role": "system", "content": sys_text}] if sys_text else []
    for i, m in enumerate(messages):
        content, where = m["content"], f"messages[{i}].content"
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if m["role"] == "system":  # Claude Code's mid-conversation system messages
            out.append({"role": "system", "content": text_of(blocks, where)})
        else:
            out += (_assistant_blocks if m["role"] == "assistant" else _user_blocks)(blocks, where)
    return out


def _user_blocks(blocks: list[dict], where: str) -> list[dict]:
    out: list[dict] = []
    for j, b in enumerate(blocks):
        if b.get("type") == "tool_result":
            content = b.get("content")
            text = content if isinstance(content, str) else text_of(content, f"{where}[{j}].content")
            out.append({"role": "tool", "tool_call_id": b.get("tool_use_id", ""),
                        "content": ("Error: " if b.get("is_error") else "") + text})
        elif out and out[-1]["role"] == "user":
            out[-1]["content"] += text_of([b], f"{where}[{j}]")
        else:
            out.append({"role": "user", "content": text_of([b], f"{where}[{j}]")})
    return out


def _assistant_blocks(blocks: list[dict], where: str) -> list[dict]:
    text, reasoning, calls = "", "", []
    for j, b in enumerate(blocks):
        kind = b.get("type")
        if kind == "thinking":
            reasoning += str(b.get("thinking", ""))
        elif kind == "tool_use":
            if not isinstance(b.get("input"), dict):
                raise APIError(400, f"{where}[{j}].input must be an object", param=f"{where}[{j}]")
            calls.append(call(b.get("id", ""), b.get("name", ""), b["input"]))
        elif kind != "redacted_thinking":
            text += text_of([b], f"{where}[{j}]")
    return [assistant(text, reasoning, calls)]


def anthropic_tools(tools: list[dict]) -> list[dict]:
    """Client tools; Anthropic server tools (web_search_..., a type and no schema) are ignored."""
    out = []
    for i, t in enumerate(tools):
        if t.get("type") not in (None, "custom") and "input_schema" not in t:
            continue
        if not isinstance(t.get("input_schema"), dict):
            raise APIError(400, f"tools[{i}].input_schema must be a JSON schema object", param=f"tools[{i}]")
        out.append(tool(t.get("name"), t.get("description"), t["input_schema"], f"tools[{i}]"))
    return out
