"""gpt-oss, DeepSeek-V3 and GLM-4.5 end to end: a tiny random checkpoint of each in HF layout with
the demo tokenizer, `freetoken run` on its directory (converted on the way) and `freetoken serve`
answering the OpenAI SDK, each model's output format parsed by the parser chosen for it (Harmony
from gpt-oss's model type, GLM's tool calls from its template)."""
from __future__ import annotations

import json
import shutil

import openai
import pytest
import tiny
from test_cli import cli
from test_server import DEMO, KEY, MODEL, OAI_TOOL, Live, force, listening, wait_ready

# a GLM-4.5-like template: its tool-call markup is what picks the glm45 parser
GLM_TEMPLATE = (
    "{%- for m in messages %}{{- '<|' + m.role + '|>\\n' + m.content }}{%- endfor %}"
    "{%- if tools %}{{- '<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>' }}{%- endif %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}")
ARCHS = ["gpt_oss", "deepseek_v3", "glm4_moe"]


@pytest.fixture(scope="module", params=ARCHS)
def hf(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param) / "hf"
    tiny.build(request.param, d, vocab_size=tiny.demo_vocab())
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if (DEMO / name).exists():
            shutil.copy(DEMO / name, d / name)
    if request.param == "glm4_moe":
        (d / "chat_template.jinja").write_text(GLM_TEMPLATE)
    return request.param, d


def test_run_converts_and_generates(hf):
    _, d = hf
    r = cli("run", d, "-p", "hello", "--max-tokens", 4, "--ignore-eos", "--device", "cpu", "--json", "--no-server")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["token_ids"]) == 4


@pytest.fixture(scope="module")
def live(hf):
    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.server.app import create_app
    arch, d = hf
    app = create_app(lambda progress: LLM(EngineConfig(model=str(d), device="cpu", max_context=1024), progress),
                     MODEL, api_key=KEY, allow_forced_output=True)
    with listening(app) as port:
        srv = Live(app, f"http://127.0.0.1:{port}")
        wait_ready(srv)
        yield arch, srv


def test_serve_answers_in_each_models_format(live):
    arch, srv = live
    oai = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0)
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=64)
    if arch == "gpt_oss":
        text = "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>4.<|return|>"
        m = oai.chat.completions.create(**ask, extra_headers=force(text)).choices[0].message
        assert (m.reasoning_content.strip(), m.content.strip()) == ("Hm.", "4.")
    elif arch == "glm4_moe":
        text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
        c = oai.chat.completions.create(**ask, tools=[OAI_TOOL], extra_headers=force(text)).choices[0]
        assert c.finish_reason == "tool_calls"
        call = c.message.tool_calls[0].function
        assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    else:
        r = oai.chat.completions.create(**ask, extra_headers=force("Mild, 18 C."))
        assert r.choices[0].message.content == "Mild, 18 C."
    unforced = oai.chat.completions.create(**{**ask, "max_tokens": 3})  # the model's own tokens
    assert unforced.usage.completion_tokens <= 3
