"""Streaming-safe output parsers: split generated text into reasoning, plain text and tool calls.

The server feeds every decoded chunk to an `OutputParser` and forwards the events it returns.
Chunks may be split anywhere, even inside a tag: a parser holds back only a suffix that could
still become a tag, so the concatenated reasoning, text and tool calls never depend on the
chunking. Formats: `think` (<think>...</think>), `hermes` and `qwen3_coder` (<tool_call> around a
JSON object or a <function=...> XML block; both names accept both bodies, since Qwen models mix
them), `glm45` (GLM-4.5 to 4.7: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...
</tool_call>, blanks between the parts optional) and `harmony` (gpt-oss channels). A tool call is
emitted only once it is complete and well-formed; a malformed one comes back as plain text, never
as an exception or lost text.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgsDelta:
    index: int
    text: str  # a chunk of the JSON arguments string


@dataclass(frozen=True)
class ToolCallEnd:
    index: int
    arguments: str  # the complete arguments: a compact JSON object


Event = TextDelta | ReasoningDelta | ToolCallStart | ToolCallArgsDelta | ToolCallEnd

TOOL_PARSERS = ("hermes", "qwen3_coder", "glm45", "harmony")
REASONING_PARSERS = ("think", "harmony")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
H_MESSAGE = "<|message|>"
H_STOPS = ("<|end|>", "<|call|>", "<|return|>")  # end a message and are consumed
H_ENDS = H_STOPS + ("<|start|>", "<|channel|>")  # the last two also begin the next header
H_HEADER_MAX = 256  # a header longer than this is not a header: the text is shown as is

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*)</function>", re.S)
# a value ends at the </parameter> followed by the next parameter or the end of the function
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>\s*(?=<parameter=|\Z)", re.S)
_ESCAPE = re.compile(r"\\.", re.S)  # a JSON escape; valid JSON has them only inside strings
ARG_KEY, ARG_VALUE, ARG_VALUE_CLOSE = "<arg_key>", "<arg_value>", "</arg_value>"
_GLM_NAME = re.compile(r"\s*([^\s<>]+)\s*")
# like a parameter, a value ends at the </arg_value> followed by the next key or the end of the call
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*(?=<arg_key>|\Z)", re.S)
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def select_parsers(chat_template: str | None,
                   model_type: str | None) -> tuple[str | None, str | None]:
    """(tool parser, reasoning parser) for a model, judged from its chat template and model_type."""
    t = chat_template or ""
    if model_type == "gpt_oss" or "<|channel|>" in t:
        return "harmony", "harmony"
    tool = None
    if CALL_OPEN in t:
        tool = "glm45" if ARG_KEY in t else "qwen3_coder" if "<function=" in t else "hermes"
    return tool, ("think" if THINK_OPEN in t else None)


def opens_reasoning(prompt: str) -> bool:
    """True if a rendered prompt already opened the thinking block (pass as starts_in_reasoning)."""
    return prompt.rstrip().endswith(THINK_OPEN)


class OutputParser:
    """Turns decoded chunks into events; one instance per generated sequence."""

    def __init__(self, tool_parser: str | None, reasoning_parser: str | None,
                 tools_enabled: bool = True, starts_in_reasoning: bool = False):
        _check_name(tool_parser, TOOL_PARSERS, "--tool-call-parser")
        _check_name(reasoning_parser, REASONING_PARSERS, "--reasoning-parser")
        self._stages: list[_Stage] = []
        if "harmony" in (tool_parser, reasoning_parser):
            if {tool_parser, reasoning_parser} - {None, "harmony"}:
                raise ValueError("harmony output cannot be mixed with another parser: use "
                                 "--tool-call-parser harmony --reasoning-parser harmony")
            tools = tool_parser == "harmony" and tools_enabled
            self._stages.append(_Harmony(tools, reasoning_parser == "harmony"))
            return
        if reasoning_parser == "think":
            self._stages.append(_Think(starts_in_reasoning))
        if tool_parser and tools_enabled:
            self._stages.append(_ToolCalls(glm=tool_parser == "glm45"))

    def feed(self, text: str) -> list[Event]:
        """Events for the next decoded chunk."""
        return self._run(text, final=False)

    def finish(self) -> list[Event]:
        """Flush everything held back, at the end of generation."""
        return self._run("", final=True)

    def _run(self, text: str, final: bool) -> list[Event]:
        # each stage consumes the TextDeltas of the one before and passes other events through
        events: list[Event] = [TextDelta(text)] if text else []
        for stage in self._stages:
            out: list[Event] = []
            for ev in events:
                out += stage.feed(ev.text) if isinstance(ev, TextDelta) else [ev]
            events = out + (stage.finish() if final else [])
        return events


def _check_name(name: str | None, valid: tuple[str, ...], flag: str) -> None:
    if name is not None and name not in valid:
        raise ValueError(f"unknown {flag} {name!r}: use one of {', '.join(valid)}")


def _held(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of buf that is a proper prefix of a tag (it may become one)."""
    for n in range(min(len(buf), max(map(len, tags)) - 1), 0, -1):
        if any(t.startswith(buf[-n:]) for t in tags):
            return n
    return 0


def _find_first(buf: str, tags: tuple[str, ...], start: int = 0) -> tuple[int, str]:
    hits = [(i, t) for t in tags if (i := buf.find(t, start)) >= 0]
    return min(hits) if hits else (-1, "")


def _dumps(obj: Any) -> str | None:
    """Compact JSON, or None for what strict JSON cannot hold (NaN, Infinity)."""
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return None


def _loads(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text)
    except (ValueError, RecursionError):
        return False, None


def _call(name: Any, args: Any) -> tuple[str, str] | None:
    """(name, arguments JSON) if both are well-formed, else None."""
    if not isinstance(name, str) or not name.strip() or not isinstance(args, dict):
        return None
    text = _dumps(args)
    return None if text is None else (name.strip(), text)


def _tool_events(index: int, call: tuple[str, str]) -> list[Event]:
    name, args = call
    call_id = "call_" + uuid.uuid4().hex[:24]
    return [ToolCallStart(index, call_id, name), ToolCallArgsDelta(index, args),
            ToolCallEnd(index, args)]


class _Stage:
    """One streaming stage: buffers text, turns what it can already decide into events."""

    def __init__(self):
        self.buf = ""
        self.lstrip = False  # drop the whitespace that follows a closed block

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        out: list[Event] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[Event]) -> bool:
        """Consume what can be decided; True if there may be more to do."""
        raise NotImplementedError

    def finish(self) -> list[Event]:
        raise NotImplementedError

    def _text(self, s: str, out: list[Event]) -> None:
        if self.lstrip:
            s = s.lstrip()
            self.lstrip = not s
        if s:
            out.append(TextDelta(s))


class _Think(_Stage):
    """<think>...</think>: reasoning (opened by the model or already by the prompt), then text."""

    def __init__(self, starts_in_reasoning: bool):
        super().__init__()
        self.reasoning = starts_in_reasoning
        self.at_start = True  # a <think> counts only as the first non-blank thing generated

    def _step(self, out: list[Event]) -> bool:
        if self.at_start:
            head = self.buf.lstrip()
            if THINK_OPEN.startswith(head):
                return False  # blank or a partial <think>: wait
            self.at_start = False
            if head.startswith(THINK_OPEN):
                self.buf, self.reasoning = head[len(THINK_OPEN):], True
            return True
        if not self.reasoning:
            self._text(self.buf, out)
            self.buf = ""
            return False
        i = self.buf.find(THINK_CLOSE)
        n = len(self.buf) - _held(self.buf, (THINK_CLOSE,)) if i < 0 else i
        if n:
            out.append(ReasoningDelta(self.buf[:n]))
        if i < 0:
            self.buf = self.buf[n:]
            return False
        self.buf, self.reasoning, self.lstrip = self.buf[i + len(THINK_CLOSE):], False, True
        return True

    def finish(self) -> list[Event]:
        buf, self.buf = self.buf, ""
        if self.reasoning and buf:
            return [ReasoningDelta(buf)]
        out: list[Event] = []
        self._text(buf, out)
        return out


def _inside_value(body: str) -> bool:
    """True if a </tool_call> right after body would sit in a JSON string or a parameter value."""
    if body.lstrip().startswith("{"):  # an odd number of unescaped quotes: inside a string
        return _ESCAPE.sub("", body).count('"') % 2 == 1
    return body.rfind("<parameter=") > body.rfind("</parameter>")


def _parse_call(body: str) -> tuple[str, str] | None:
    """The body between <tool_call> and </tool_call> as (name, arguments JSON), or None."""
    body = body.strip()
    if body.startswith("{"):  # hermes: {"name": ..., "arguments": {...}}
        ok, obj = _loads(body)
        if not ok or not isinstance(obj, dict):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models send the arguments as a JSON string
            ok, args = _loads(args)
        return _call(obj.get("name"), args) if ok else None
    m = _FUNCTION.fullmatch(body)  # qwen3_coder: <function=NAME><parameter=P>VALUE</parameter>...
    if not m:
        return None
    inner, args, pos = m.group(2).strip(), {}, 0
    while pos < len(inner):
        p = _PARAMETER.match(inner, pos)
        if not p:
            return None
        args[p.group(1).strip()], pos = _coerce(p.group(2)), p.end()
    return _call(m.group(1), args)


def _inside_arg_value(body: str) -> bool:
    """True if a </tool_call> right after a GLM call body would sit in an argument value."""
    return body.rfind(ARG_VALUE) > body.rfind(ARG_VALUE_CLOSE)


def _parse_glm_call(body: str) -> tuple[str, str] | None:
    """A GLM call body (NAME, then <arg_key>/<arg_value> pairs) as (name, arguments JSON), or None."""
    m = _GLM_NAME.match(body)
    if not m:
        return None
    args, pos = {}, m.end()
    while pos < len(body):
        a = _GLM_ARG.match(body, pos)
        if not a:
            return None
        args[a.group(1).strip()], pos = _coerce(a.group(2)), a.end()
    return _call(m.group(1), args)


def _coerce(value: str) -> Any:
    """A parameter value: its text without the framing newlines, or the JSON literal it spells.

    Only a value with no surrounding blanks that parses as a JSON number, boolean, null, object
    or array is converted; a quoted string keeps its quotes (it may be meant literally)."""
    value = value.removeprefix("\n").removesuffix("\n")
    if value != value.strip():
        return value
    ok, parsed = _loads(value)
    if not ok or isinstance(parsed, str) or _dumps(parsed) is None:
        return value
    return parsed


class _ToolCalls(_Stage):
    """<tool_call>...</tool_call> blocks inside the text (hermes JSON or qwen3_coder XML, or GLM's
    name and argument pairs)."""

    def __init__(self, glm: bool = False):
        super().__init__()
        self.inside, self.parse = (_inside_arg_value, _parse_glm_call) if glm else (_inside_value, _parse_call)
        self.in_call = False
        self.scan = 0  # where to resume looking for </tool_call> in an open call
        self.blank = ""  # whitespace before the open call, given back if it degrades to text
        self.count = 0

    def _step(self, out: list[Event]) -> bool:
        return self._close(out) if self.in_call else self._open(out)

    def _open(self, out: list[Event]) -> bool:
        i = self.buf.find(CALL_OPEN)
        end = len(self.buf) - _held(self.buf, (CALL_OPEN,)) if i < 0 else i
        # trailing whitespace waits: it is dropped if a call follows
        text = self.buf[:end].rstrip()
        self._text(text, out)
        if i < 0:
            self.buf = self.buf[len(text):]
            return False
        self.blank, self.buf = self.buf[len(text):i], self.buf[i + len(CALL_OPEN):]
        self.in_call, self.scan = True, 0
        return True

    def _close(self, out: list[Event]) -> bool:
        p = self.buf.find(CALL_CLOSE, self.scan)
        while p >= 0 and self.inside(self.buf[:p]):
            p = self.buf.find(CALL_CLOSE, p + 1)
        if p < 0:
            self.scan = max(0, len(self.buf) - len(CALL_CLOSE) + 1)
            return False
        body, self.buf, self.in_call = self.buf[:p], self.buf[p + len(CALL_CLOSE):], False
        call = self.parse(body)
        if call is None:
            self._text(self.blank + CALL_OPEN + body + CALL_CLOSE, out)
        else:
            out += _tool_events(self.count, call)
            self.count, self.lstrip = self.count + 1, True
        return True

    def finish(self) -> list[Event]:
        out: list[Event] = []
        self._text(self.blank + CALL_OPEN + self.buf if self.in_call else self.buf, out)
        self.buf, self.in_call = "", False
        return out


class _Harmony(_Stage):
    """gpt-oss: `<|start|>assistant<|channel|>C[ to=R][<|constrain|>json]<|message|>BODY<|end|>`.

    analysis is reasoning, final and commentary are text, a message with a recipient is a tool
    call. Generation may begin anywhere in the first header (the prompt ends with `<|start|>`
    assistant), and the server may drop the stop tokens <|call|>/<|return|>, so finish() also
    completes a message."""

    def __init__(self, tools: bool, reasoning: bool):
        super().__init__()
        self.tools, self.reasoning = tools, reasoning
        self.header: str | None = None  # None while reading a header, else the raw header
        self.kind, self.name = "text", ""  # kind: text | reasoning | tool
        self.ends = H_ENDS
        self.scan = 0
        self.count = 0

    def _step(self, out: list[Event]) -> bool:
        if self.header is None:
            return self._read_header()
        i, tag = _find_first(self.buf, self.ends, self.scan)
        if i < 0 and self.kind == "tool":  # a call is parsed whole
            self.scan = max(0, len(self.buf) - max(map(len, self.ends)) + 1)
        elif i < 0:
            n = len(self.buf) - _held(self.buf, self.ends)
            self._body_text(self.buf[:n], out)
            self.buf = self.buf[n:]
        if i < 0:
            return False
        body, self.buf = self.buf[:i], self.buf[i + (len(tag) if tag in H_STOPS else 0):]
        self._end_message(body, out)
        return True

    def _read_header(self) -> bool:
        i = self.buf.find(H_MESSAGE)
        if 0 <= i <= H_HEADER_MAX:
            header, self.buf = self.buf[:i], self.buf[i + len(H_MESSAGE):]
            self._open(header)
            return True
        if len(self.buf) >= H_HEADER_MAX + len(H_MESSAGE):  # any <|message|> would be too late
            self._not_a_header()
            return True
        return False

    def _open(self, header: str) -> None:
        self.header, self.ends, self.scan = header, H_ENDS, 0
        channel, recipient = _CHANNEL.search(header), _RECIPIENT.search(header)
        self.kind, self.name = "text", ""
        if recipient:
            self.kind, self.name = "tool", recipient.group(1).removeprefix("functions.")
        elif channel and channel.group(1) == "analysis" and self.reasoning:
            self.kind = "reasoning"

    def _not_a_header(self) -> None:
        # show the text as is; only the stop tokens end it, so a stray <|channel|> cannot loop
        self._open("")
        self.ends = H_STOPS

    def _end_message(self, body: str, out: list[Event]) -> None:
        if self.kind == "tool":
            ok, args = _loads(body.strip())
            call = _call(self.name, args) if ok and self.tools else None
            if call is None:
                out.append(TextDelta(f"{self.header}{H_MESSAGE}{body}"))
            else:
                out += _tool_events(self.count, call)
                self.count += 1
        else:
            self._body_text(body, out)
        self.header = None

    def _body_text(self, s: str, out: list[Event]) -> None:
        if s:
            out.append(ReasoningDelta(s) if self.kind == "reasoning" else TextDelta(s))

    def finish(self) -> list[Event]:
        out: list[Event] = []
        while True:
            if self._step(out):
                continue
            if self.header is not None:
                self._end_message(self.buf, out)
                self.buf = ""
            elif self.buf:
                self._not_a_header()
            else:
                break
        return out
