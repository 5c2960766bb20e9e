"""Output parsers: recorded-style generations fed whole, char by char and split everywhere."""
from __future__ import annotations

import json
import random
import re

import pytest

from engine.server.parsers import (
    OutputParser, ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallEnd, ToolCallStart,
    opens_reasoning, select_parsers,
)


def collect(events: list) -> tuple[str, str, list[tuple[str, dict]]]:
    """(reasoning, text, [(name, arguments)]), checking each call's event sequence on the way."""
    reasoning, text, calls, open_calls = "", "", [], {}
    for ev in events:
        if isinstance(ev, ReasoningDelta):
            reasoning += ev.text
        elif isinstance(ev, TextDelta):
            text += ev.text
        elif isinstance(ev, ToolCallStart):
            assert ev.index == len(calls) + len(open_calls) and ev.index not in open_calls
            assert re.fullmatch(r"call_[0-9a-f]{24}", ev.id)
            open_calls[ev.index] = [ev.name, ""]
        elif isinstance(ev, ToolCallArgsDelta):
            open_calls[ev.index][1] += ev.text
        else:
            assert isinstance(ev, ToolCallEnd)
            name, streamed = open_calls.pop(ev.index)
            assert streamed == ev.arguments
            args = json.loads(ev.arguments)
            assert isinstance(args, dict)
            calls.append((name, args))
    assert not open_calls
    return reasoning, text, calls


def run(chunks: list[str], tool: str | None, reasoning: str | None, **kw) -> tuple:
    parser = OutputParser(tool, reasoning, **kw)
    events = [ev for chunk in chunks for ev in parser.feed(chunk)] + parser.finish()
    return collect(events)


def splits(text: str):
    yield [text]
    yield list(text)
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    rng = random.Random(0)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(4, len(text) - 1)))
        yield [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def check(text: str, tool, reasoning, expected, **kw) -> None:
    for chunks in splits(text):
        assert run(chunks, tool, reasoning, **kw) == expected, chunks


# --- think ---------------------------------------------------------------------------------

def test_think_reasoning_then_text():
    out = "<think>\nThe user wants 2+2.\n</think>\n\nThe answer is 4."
    check(out, None, "think", ("\nThe user wants 2+2.\n", "The answer is 4.", []))


def test_think_starts_in_reasoning_without_open_tag():
    out = "Okay, 2+2 is 4.</think>\n\n**4**"
    check(out, None, "think", ("Okay, 2+2 is 4.", "**4**", []), starts_in_reasoning=True)
    # the model repeating the <think> the prompt already opened is not reasoning text
    check("\n<think>x</think>y", None, "think", ("x", "y", []), starts_in_reasoning=True)


def test_think_absent_and_late_think_is_text():
    check("Hi <think>not reasoning</think>", None, "think",
          ("", "Hi <think>not reasoning</think>", []))
    check("<think>all of it, truncated", None, "think", ("all of it, truncated", "", []))


def test_think_streams_promptly():
    p = OutputParser(None, "think", starts_in_reasoning=True)
    assert p.feed("Let me se") == [ReasoningDelta("Let me se")]
    assert p.feed("e</thi") == [ReasoningDelta("e")]  # only the partial tag waits
    assert p.feed("nk>\n\nDone") == [TextDelta("Done")]


# --- hermes ----------------------------------------------------------------------------------

ONE_CALL = ('I\'ll check the weather.\n\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "days": 3}}\n</tool_call>')
TWO_CALLS = ('<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "read", "arguments": {"path": "b.py"}}\n</tool_call>')
NESTED_ARGS = {"code": "if (a) { b(\"}\"); }\nprint('</tool_call>')",
               "opts": {"x": [1, {"y": "}{"}], "z": None, "w": "\\"}}


def test_hermes_text_then_call():
    expected = ("", "I'll check the weather.", [("get_weather", {"city": "Paris", "days": 3})])
    check(ONE_CALL, "hermes", None, expected)


def test_hermes_two_calls_with_reasoning():
    out = "<think>Need both files.</think>\n\n" + TWO_CALLS + "\n"
    calls = [("read", {"path": "a.py"}), ("read", {"path": "b.py"})]
    check(out, "hermes", "think", ("Need both files.", "", calls))


def test_hermes_nested_json_with_close_tag_in_strings():
    body = json.dumps({"name": "run", "arguments": NESTED_ARGS})
    out = f"Running.\n<tool_call>\n{body}\n</tool_call>\nDone."
    check(out, "hermes", None, ("", "Running.Done.", [("run", NESTED_ARGS)]))


def test_hermes_arguments_as_string_and_compact_output():
    p = OutputParser("hermes", None)
    events = p.feed('<tool_call>{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}</tool_call>')
    assert events[-1] == ToolCallEnd(0, '{"a":[1,2]}')


@pytest.mark.parametrize("body", [
    '{"name": "f", "arguments": {"a": 1}',          # bad JSON
    '{"arguments": {"a": 1}}',                      # no name
    '{"name": "f", "arguments": [1]}',              # arguments not an object
    '{"name": "f", "arguments": {"a": NaN}}',       # not strict JSON
    '<function=f>\n<parameter=a>1</parameter>',     # XML without </function>
])
def test_malformed_call_degrades_to_text(body):
    out = f"Try:\n<tool_call>\n{body}\n</tool_call>\nafter"
    check(out, "hermes", None, ("", out, []))


def test_unterminated_call_is_text_at_finish():
    out = 'Text.\n<tool_call>\n{"name": "f", "arguments": {"a": "</tool_call>'
    check(out, "hermes", None, ("", out, []))


def test_tools_disabled_leaves_markup():
    check(ONE_CALL, "hermes", None, ("", ONE_CALL, []), tools_enabled=False)


def test_hermes_streams_promptly():
    p = OutputParser("hermes", None)
    assert p.feed("Hello wor") == [TextDelta("Hello wor")]
    assert p.feed("ld <tool_c") == [TextDelta("ld")]  # the blank and the partial tag wait
    assert p.feed("ar> x") == [TextDelta(" <tool_car> x")]


# --- qwen3_coder -----------------------------------------------------------------------------

CODER = """Writing the file.
<tool_call>
<function=write_file>
<parameter=path>
src/app.py
</parameter>
<parameter=content>
def f(x):
    return {"a": x}  # </parameter> inside a value
</parameter>
<parameter=mode>
0644
</parameter>
<parameter=count>
3
</parameter>
<parameter=ratio>
-1.5e2
</parameter>
<parameter=flags>
{"force": true, "tags": [null]}
</parameter>
<parameter=quoted>
"hi"
</parameter>
<parameter=indented>
  42
</parameter>
</function>
</tool_call>"""
CODER_ARGS = {"path": "src/app.py",
              "content": 'def f(x):\n    return {"a": x}  # </parameter> inside a value',
              "mode": "0644", "count": 3, "ratio": -150.0,
              "flags": {"force": True, "tags": [None]}, "quoted": '"hi"', "indented": "  42"}


def test_qwen3_coder_call():
    check(CODER, "qwen3_coder", None, ("", "Writing the file.", [("write_file", CODER_ARGS)]))


def test_qwen3_coder_two_calls_and_close_tag_in_value():
    call = ("<tool_call>\n<function=echo>\n<parameter=s>\nx</tool_call>y\n</parameter>\n"
            "</function>\n</tool_call>")
    expected = ("", "", [("echo", {"s": "x</tool_call>y"}), ("echo", {"s": "x</tool_call>y"})])
    check(call + "\n" + call, "qwen3_coder", None, expected)


def test_qwen3_coder_no_parameters_and_json_under_hermes_name():
    check("<tool_call>\n<function=now>\n</function>\n</tool_call>", "hermes", None,
          ("", "", [("now", {})]))
    check('<tool_call>{"name": "now"}</tool_call>', "qwen3_coder", None, ("", "", [("now", {})]))


# --- glm45 ----------------------------------------------------------------------------------

GLM = """<think>The user wants Beijing's weather.</think>
Let me check.
<tool_call>get_weather
<arg_key>city</arg_key>
<arg_value>北京</arg_value>
<arg_key>days</arg_key>
<arg_value>3</arg_value>
<arg_key>options</arg_key>
<arg_value>{"unit": "c", "hourly": [true, null]}</arg_value>
<arg_key>note</arg_key>
<arg_value>a </tool_call> and a </arg_value> inside</arg_value>
</tool_call>
<tool_call>now</tool_call><tool_call>read<arg_key>path</arg_key><arg_value>a.py</arg_value></tool_call>"""
GLM_CALLS = [("get_weather", {"city": "北京", "days": 3, "options": {"unit": "c", "hourly": [True, None]},
                              "note": "a </tool_call> and a </arg_value> inside"}),
             ("now", {}), ("read", {"path": "a.py"})]


def test_glm45_calls_split_everywhere():
    """GLM-4.5's newline-separated layout and GLM-4.7's compact one, a call without arguments, and
    closing tags inside a value, at every split of the text."""
    check(GLM, "glm45", "think", ("The user wants Beijing's weather.", "Let me check.", GLM_CALLS))


@pytest.mark.parametrize("body", [
    "two words<arg_key>a</arg_key><arg_value>1</arg_value>",   # not a function name
    "f<arg_key>a</arg_key>",                                    # a key without its value
    "f<arg_value>1</arg_value>",                                # a value without its key
    "f<arg_key>a</arg_key><arg_value>1</arg_value> trailing",   # text after the arguments
    "<arg_key>a</arg_key><arg_value>1</arg_value>",             # no name
    "f\n<arg_key>a</arg_key>\n<arg_value>unterminated",        # value still open at the end
])
def test_glm45_malformed_call_degrades_to_text(body):
    out = f"Try:\n<tool_call>{body}</tool_call>\nafter"
    check(out, "glm45", None, ("", out, []))


# --- harmony ---------------------------------------------------------------------------------

H_FINAL = ("<|channel|>analysis<|message|>User says hi. Reply briefly.<|end|>"
           "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>")
H_CALL = ("<|channel|>analysis<|message|>Need weather; call tool.<|end|>"
          "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
          '<|message|>{"location": "San Francisco, CA", "unit": "c"}<|call|>')


def test_harmony_analysis_then_final():
    check(H_FINAL, "harmony", "harmony",
          ("User says hi. Reply briefly.", "Hello! How can I help?", []))
    check("assistant" + H_FINAL, "harmony", "harmony",  # prompt ended at <|start|>
          ("User says hi. Reply briefly.", "Hello! How can I help?", []))


def test_harmony_analysis_then_tool_call():
    call = ("get_weather", {"location": "San Francisco, CA", "unit": "c"})
    check(H_CALL, "harmony", "harmony", ("Need weather; call tool.", "", [call]))
    # the stop token <|call|> may be stripped by the server before the parser sees it
    check(H_CALL.removesuffix("<|call|>"), "harmony", "harmony",
          ("Need weather; call tool.", "", [call]))


def test_harmony_recipient_in_role_and_two_calls():
    out = ("<|start|>assistant to=functions.ls<|channel|>commentary json<|message|>{}<|call|>"
           "<|start|>assistant<|channel|>commentary to=functions.cat<|message|>"
           '{"f": "a"}<|call|>')
    check(out, "harmony", "harmony", ("", "", [("ls", {}), ("cat", {"f": "a"})]))


def test_harmony_malformed_call_and_tools_disabled_are_text():
    bad = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops<|call|>"
    check(bad, "harmony", "harmony",
          ("", "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops", []))
    raw = H_CALL[H_CALL.index("<|start|>"):].removesuffix("<|call|>")
    check(H_CALL, "harmony", "harmony", ("Need weather; call tool.", raw, []),
          tools_enabled=False)


def test_harmony_without_reasoning_parser_and_plain_text():
    check(H_FINAL, "harmony", None,
          ("", "User says hi. Reply briefly.Hello! How can I help?", []))
    check("Plain answer, no header.<|return|>", "harmony", "harmony",
          ("", "Plain answer, no header.", []))
    for long in ("x" * 600 + "<|channel|>y", "x" * 300 + "<|message|>y"):
        check(long, "harmony", "harmony", ("", long, []))


def test_harmony_message_ended_by_next_header():
    out = "<|channel|>commentary<|message|>Preamble.<|channel|>analysis<|message|>Think.<|end|>"
    check(out, "harmony", "harmony", ("Think.", "Preamble.", []))


def test_harmony_streams_promptly():
    p = OutputParser("harmony", "harmony")
    assert p.feed("<|channel|>final<|mess") == []
    assert p.feed("age|>Hel") == [TextDelta("Hel")]
    assert p.feed("lo<|re") == [TextDelta("lo")]
    assert p.feed("turn|>") == [] and p.finish() == []


# --- selection and configuration -------------------------------------------------------------

QWEN3 = ("{%- if tools %}<tools>...</tools> For each function call, return a json object "
         "within <tool_call></tool_call> XML tags ... <think>\\n\\n</think>")
QWEN3_CODER = "<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>"
GPT_OSS = "<|start|>assistant<|channel|>final<|message|>"
GLM45 = ("<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>"
         "...</tool_call>{%- endif -%} ... <think></think>")


@pytest.mark.parametrize("template, model_type, expected", [
    (QWEN3, "qwen3_moe", ("hermes", "think")),
    (QWEN3_CODER, "qwen3_moe", ("qwen3_coder", None)),
    (GPT_OSS, None, ("harmony", "harmony")),
    (GLM45, "glm4_moe", ("glm45", "think")),
    (None, "gpt_oss", ("harmony", "harmony")),
    ("{{ bos_token }}<think>{{ message }}", "deepseek_v3", (None, "think")),
    ("<|im_start|>{{ message }}<|im_end|>", "mixtral", (None, None)),
    (None, None, (None, None)),
])
def test_select_parsers(template, model_type, expected):
    assert select_parsers(template, model_type) == expected


def test_opens_reasoning():
    assert opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("tool, reasoning", [("json", None), (None, "deepseek"),
                                              ("hermes", "harmony")])
def test_bad_parser_names_raise(tool, reasoning):
    with pytest.raises(ValueError):
        OutputParser(tool, reasoning)


def test_no_parsers_is_passthrough():
    check(ONE_CALL, None, None, ("", ONE_CALL, []))


# --- random mixes of tag fragments -----------------------------------------------------------

FRAGMENTS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<", "</", "<tool", "{", "}",
             '"', "\\", " ", "\n", '{"name": "f", "arguments": {"a": 1}}', '"</tool_call>"', "abc",
             "<function=g>", "</function>", "<parameter=p>", "</parameter>", "\n1\n", "<|start|>",
             "assistant", "<|channel|>", "analysis", "final", " to=functions.h",
             "<|constrain|>json", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "{}", "<|",
             "|>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "f", "[1]"]
CONFIGS = [("hermes", "think", {}), ("qwen3_coder", "think", {"starts_in_reasoning": True}),
           ("glm45", "think", {}), ("glm45", None, {}),
           ("harmony", "harmony", {}), ("harmony", None, {}), ("hermes", None, {})]


@pytest.mark.parametrize("tool, reasoning, kw", CONFIGS)
def test_random_fragments_split_invariant(tool, reasoning, kw):
    rng = random.Random(1)
    for _ in range(200):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 20)))
        whole = run([text], tool, reasoning, **kw)
        cut = rng.randint(1, max(1, len(text) - 1))
        for chunks in (list(text), [text[:cut], text[cut:]]):
            assert run(chunks, tool, reasoning, **kw) == whole, text
        if tool in ("hermes", "glm45") and reasoning is None and not whole[2]:
            assert whole[1] == text  # no call found: every character comes back as text
