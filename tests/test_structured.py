"""Grammars for structured outputs and forced tool calls: what a grammar allows is exactly what
the active output parser reads back (engine.server.structured, engine.server.parsers)."""
import json

import pytest
from transformers import AutoTokenizer

from engine.constrain import Grammars
from engine.resolve import DEMO
from engine.server.messages import APIError, tool
from engine.server.parsers import OutputParser, TextDelta, ToolCallEnd, ToolCallStart
from engine.server.structured import OutputSpec, grammar

UNIT = tool("set_unit", "", {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"],
                             "additionalProperties": False}, "t")
CITY = tool("city", "", {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, "t")
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def grammars():
    tok = AutoTokenizer.from_pretrained(DEMO)
    return Grammars(tok, {tok.eos_token_id})


def accepts(grammars, rules: str, text: str) -> bool:
    """Does the grammar accept exactly this text, then end of turn?"""
    c = grammars.matcher(rules)
    ids = grammars.hf(text, add_special_tokens=False)["input_ids"]
    return all(c.m.consume_token(t) for t in ids) and c.m.consume_token(min(grammars.eos))


def parse(tool_parser, reasoning, text: str, starts: bool = False) -> list:
    p = OutputParser(tool_parser, reasoning, True, starts)
    return p.feed(text) + p.finish()


CASES = [  # (tool parser, reasoning parser, starts in reasoning, spec, an accepted text)
    ("hermes", None, False, OutputSpec(tools=[UNIT, CITY], parallel=False),
     '<tool_call>\n{"name":"set_unit","arguments":{"unit":"f"}}\n</tool_call>'),
    ("qwen3_coder", "think", False, OutputSpec(tools=[UNIT, CITY]),
     '<think>hm</think>\n\n<tool_call>\n{"name":"city","arguments":{"name":"Oslo"}}\n</tool_call>\n'
     '<tool_call>\n{"name":"set_unit","arguments":{"unit":"c"}}\n</tool_call>'),
    ("hermes", "think", True, OutputSpec(schema=SCHEMA), 'so</think>\n\n{"ok":true}'),
    (None, None, False, OutputSpec(schema=SCHEMA), '{"ok":false}'),
    ("harmony", "harmony", False, OutputSpec(tools=[UNIT]),
     '<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>commentary to=functions.set_unit '
     '<|constrain|>json<|message|>{"unit":"c"}'),
    ("harmony", "harmony", False, OutputSpec(schema=SCHEMA), '<|channel|>final<|message|>{"ok":true}'),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_grammar_accepts_what_the_parser_reads(grammars, case):
    tool_parser, reasoning, starts, spec, text = CASES[case]
    rules = grammar(spec, grammars, tool_parser, reasoning, starts)
    grammars.check(rules)
    assert accepts(grammars, rules, text)
    events = parse(tool_parser, reasoning, text, starts)
    if spec.tools:
        ends = [e for e in events if isinstance(e, ToolCallEnd)]
        names = [e.name for e in events if isinstance(e, ToolCallStart)]
        assert ends and all(n in ("set_unit", "city") for n in names)
        assert all(isinstance(json.loads(e.arguments), dict) for e in ends)
        assert not "".join(e.text for e in events if isinstance(e, TextDelta)).strip()
    else:
        assert json.loads("".join(e.text for e in events if isinstance(e, TextDelta))) in ({"ok": True}, {"ok": False})


def test_grammar_refuses_what_breaks_the_format(grammars):
    single = grammar(CASES[0][3], grammars, "hermes", None, False)
    call = '<tool_call>\n{"name":"set_unit","arguments":{"unit":"f"}}\n</tool_call>'
    assert not accepts(grammars, single, call + "\n" + call)  # parallel calls off
    assert not accepts(grammars, single, call.replace('"f"', '"k"'))  # outside the enum
    assert not accepts(grammars, single, "Sure! " + call)
    assert not accepts(grammars, grammar(OutputSpec(schema=SCHEMA), grammars, None, None, False), '{"ok": true}')


def test_no_constraint_and_no_tool_format(grammars):
    assert grammar(OutputSpec(), grammars, "hermes", "think", False) is None
    with pytest.raises(APIError, match="tool-call format"):
        grammar(OutputSpec(tools=[UNIT]), grammars, None, None, False)
