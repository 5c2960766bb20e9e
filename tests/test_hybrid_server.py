"""A hybrid model (tiny Qwen3.5 MoE with the demo tokenizer and a template that renders earlier
thinking) behind `freetoken serve`: in each API, turn 2 resends turn 1 with its thinking edited;
the state checkpoint at the end of turn 1's user message is restored and reported as cached tokens."""
from __future__ import annotations

import shutil

import anthropic
import openai
import pytest
import tiny
from test_server import DEMO, KEY, MODEL, Live, force, listening, wait_ready

TEMPLATE = (
    "{%- for m in messages %}{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if m.reasoning_content %}{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- m.content + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
SYSTEM = "You are a terse assistant. " * 4
ANSWER = "<think>\nTwo and two, added with care, make four.\n</think>\n\n4."


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.server.app import create_app
    hf = tmp_path_factory.mktemp("hybrid") / "hf"
    tiny.build("qwen3_5_moe", hf, vocab_size=tiny.demo_vocab())
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(DEMO / name, hf / name)
    (hf / "chat_template.jinja").write_text(TEMPLATE)
    app = create_app(lambda progress: LLM(EngineConfig(model=str(hf), device="cpu", max_context=1024), progress),
                     MODEL, api_key=KEY, tool_parser="hermes", reasoning_parser="think", allow_forced_output=True)
    with listening(app) as port:
        srv = Live(app, f"http://127.0.0.1:{port}")
        wait_ready(srv)
        yield srv


def anchor(live, question: str) -> int:
    """The end of turn 1's user message (before its <|im_end|>), the checkpoint an edit of the
    thinking after it restores."""
    return len(live.tokenizer.chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                                   add_generation_prompt=False)) - 2


def test_chat_completions_edited_thinking(live):
    oai = openai.OpenAI(base_url=live.base + "/v1", api_key=KEY, max_retries=0)
    q = "What is two plus two?"
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
    r1 = oai.chat.completions.create(model=MODEL, messages=first, extra_headers=force(ANSWER))
    assert r1.choices[0].message.content == "4." and r1.usage.prompt_tokens_details.cached_tokens < anchor(live, q)
    edited = first + [{"role": "assistant", "content": "4.", "reasoning_content": "Edited."},
                      {"role": "user", "content": "And three plus three?"}]
    r2 = oai.chat.completions.create(model=MODEL, messages=edited, max_tokens=3)
    assert r2.usage.prompt_tokens_details.cached_tokens == anchor(live, q)
    st = live.stats()
    assert st["state_checkpoints"] > 0 and st["state_checkpoint_bytes"] > 0 and st["state_checkpoints_restored"] >= 1


def test_messages_edited_thinking(live):
    ant = anthropic.Anthropic(base_url=live.base, api_key=KEY, max_retries=0)
    q = "What is two plus two, please?"
    user = {"role": "user", "content": q}
    r1 = ant.messages.create(model=MODEL, system=SYSTEM, messages=[user], max_tokens=64, extra_headers=force(ANSWER))
    assert r1.content[0].type == "thinking" and r1.usage.cache_read_input_tokens < anchor(live, q)
    turn1 = {"role": "assistant", "content": [{"type": "thinking", "thinking": "Edited.", "signature": "s"},
                                              {"type": "text", "text": "4."}]}
    r2 = ant.messages.create(model=MODEL, system=SYSTEM, max_tokens=3,
                             messages=[user, turn1, {"role": "user", "content": "And three plus three?"}])
    assert r2.usage.cache_read_input_tokens == anchor(live, q)


def test_responses_edited_thinking(live):
    oai = openai.OpenAI(base_url=live.base + "/v1", api_key=KEY, max_retries=0)
    q = "What is two plus two, kindly?"
    user = {"role": "user", "content": q}
    r1 = oai.responses.create(model=MODEL, instructions=SYSTEM, input=[user], extra_headers=force(ANSWER))
    assert r1.output_text == "4." and r1.usage.input_tokens_details.cached_tokens < anchor(live, q)
    turn1 = [{"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Edited."}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "4."}]}]
    r2 = oai.responses.create(model=MODEL, instructions=SYSTEM, max_output_tokens=16,
                              input=[user, *turn1, {"role": "user", "content": "And three plus three?"}])
    assert r2.usage.input_tokens_details.cached_tokens == anchor(live, q)
