"""Structured outputs and forced tool calls as grammars for constrained decoding (engine.constrain).

Each API turns its own fields into an `OutputSpec`: a JSON schema for the answer (OpenAI
`response_format`, Responses `text.format`, Anthropic `output_config.format`) and/or tool calls
the model must make (`tool_choice` required / a named tool; Anthropic `any` / `tool`). The grammar
follows the active parsers (engine.server.parsers), so what it allows is exactly what they parse:

- a thinking block first, if the reasoning parser is `think` (free text up to `</think>`; the rest
  of the block when the prompt already opened it), or a gpt-oss `analysis` message for `harmony`;
- tool calls as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (hermes; also what
  the qwen3_coder parser reads), or a gpt-oss `commentary to=functions.NAME` message, with the
  arguments matching the tool's schema;
- compact JSON (no free whitespace, which a weak model fills forever), then end of turn. Schema
  keywords the grammar compiler does not implement (propertyNames, ...) are ignored, and oneOf
  is read as anyOf, so every client schema gives a grammar.

A tag that is one added token of the model's tokenizer (llguidance keeps those apart from text)
is matched as that token, otherwise as text."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from engine.server.messages import APIError

JSON_OPTIONS = {"whitespace_flexible": False, "lenient": True, "coerce_one_of": True}


@dataclass(frozen=True)
class OutputSpec:
    schema: dict | None = None                        # the answer is JSON matching this schema
    tools: list[dict] = field(default_factory=list)   # template-form tools the model must call
    parallel: bool = True                             # several calls allowed

    @property
    def empty(self) -> bool:
        return self.schema is None and not self.tools


def json_schema(schema: Any, where: str) -> dict:
    """A client's JSON schema, checked for shape (the grammar compiler checks the rest)."""
    if not isinstance(schema, dict):
        raise APIError(400, f"{where} must be a JSON schema object", param=where)
    return schema


def openai_format(fmt: Any, where: str) -> dict | None:
    """Chat `response_format` or Responses `text.format` -> the answer's JSON schema (None: text).
    json_schema carries the schema under `json_schema` in chat and at the top in Responses."""
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        inner = fmt.get("json_schema", fmt)
        return json_schema(inner.get("schema") if isinstance(inner, dict) else None, f"{where}.schema")
    raise APIError(400, f"{where} must be of type text, json_object or json_schema", param=where)


def grammar(spec: OutputSpec, grammars, tool_parser: str | None, reasoning_parser: str | None,
            starts_in_reasoning: bool) -> str | None:
    """The Lark grammar (llguidance dialect) for spec under these parsers; None if unconstrained."""
    if spec.empty:
        return None
    if spec.tools and tool_parser is None:
        raise APIError(400, "this model has no tool-call format, so tool_choice cannot force a call; "
                       "serve it with --tool-call-parser", param="tool_choice")
    lit = _Literals(grammars)
    if "harmony" in (tool_parser, reasoning_parser):
        return _harmony(spec, lit)
    rules = {"body": _calls(spec, lit) if spec.tools else _json(spec.schema)}
    if reasoning_parser == "think":
        think = f"{lit.until('</think>', 'think_text')} /\\n{{0,2}}/"
        if starts_in_reasoning:
            rules["start"] = "think body"
        else:
            rules["start"] = "(think)? body"
            think = f"{lit('<think>')} {think}"
        rules["think"] = think
    else:
        rules["start"] = "body"
    return _lark(rules, lit)


def _json(schema: dict | None) -> str:
    return "%json " + json.dumps({"x-guidance": JSON_OPTIONS, **(schema or {"type": "object"})})


def _call_schema(tools: list[dict]) -> dict:
    calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                               "arguments": t["function"]["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def _calls(spec: OutputSpec, lit: "_Literals") -> str:
    call = f'{lit("<tool_call>")} "\\n" {_json(_call_schema(spec.tools))} "\\n" {lit("</tool_call>")}'
    return f'{call} ("\\n" {call})*' if spec.parallel else call


def _harmony(spec: OutputSpec, lit: "_Literals") -> str:
    """gpt-oss: an optional analysis message, then the final JSON message or one call."""
    head = f'{lit("<|channel|>")} "analysis" {lit("<|message|>")} {lit.until("<|end|>", "analysis_text")} ' \
           f'{lit("<|start|>")} "assistant"'
    if spec.tools:
        body = " | ".join(f'{lit("<|channel|>")} "commentary to=functions.{t["function"]["name"]} " '
                          f'{lit("<|constrain|>")} "json" {lit("<|message|>")} '
                          f'{_json(t["function"]["parameters"])}' for t in spec.tools)
    else:
        body = f'{lit("<|channel|>")} "final" {lit("<|message|>")} {_json(spec.schema)}'
    return _lark({"start": "(analysis)? body", "analysis": head, "body": body}, lit)


class _Literals:
    """Tags as grammar atoms: a special token (in llguidance's sense) of the tokenizer, or text."""

    def __init__(self, grammars):
        self.grammars = grammars
        self.extra: dict[str, str] = {}

    def special(self, text: str) -> bool:
        tid = self.grammars.hf.convert_tokens_to_ids(text)
        return isinstance(tid, int) and tid != self.grammars.hf.unk_token_id and \
            self.grammars.tokenizer.is_special_token(tid)

    def __call__(self, text: str) -> str:
        return text if self.special(text) else json.dumps(text)

    def until(self, end: str, name: str) -> str:
        """Free text up to and including `end`; adds the rule `name` for the text."""
        if self.special(end):  # text can never contain the special token
            self.extra[name] = "/(?s:.*)/"
            return f"{name} {end}"
        self.extra[f"{name}[stop={json.dumps(end)}]"] = "/(?s:.*)/"
        return name


def _lark(rules: dict[str, str], lit: _Literals) -> str:
    return "\n".join(f"{k}: {v}" for k, v in {**rules, **lit.extra}.items()) + "\n"
