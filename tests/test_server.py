"""`freetoken serve`: a live uvicorn server on loopback, driven by the official openai and
anthropic SDKs (and raw httpx for wire details). Tool calls and reasoning are forced through the
test-only `x-freetoken-force-output` header, so the real generation and parser path runs."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import anthropic
import httpx
import openai
import pytest

DEMO = Path(__file__).resolve().parents[1] / "engine" / "demo" / "model"
MODEL, KEY = "demo", "sekret"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THINK = "<think>\nHm.\n</think>\n\n4."
WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
OAI_TOOL = {"type": "function", "function": WEATHER}
RESP_TOOL = {"type": "function", **WEATHER}
ANT_TOOL = {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def force(text: str) -> dict:
    return {"x-freetoken-force-output": quote(text)}


def wait_ready(srv) -> None:
    """Until the live server's model has loaded (five minutes at most)."""
    deadline = time.time() + 300
    while (health := srv.http.get("/health").json())["status"] == "loading":
        assert time.time() < deadline, health
        time.sleep(0.1)
    assert health["status"] == "ok", health


class Live:
    def __init__(self, app, base: str):
        self.app, self.base = app, base
        self.loading: dict = {}
        self.http = httpx.Client(base_url=base, timeout=60, headers={"authorization": f"Bearer {KEY}"})

    @property
    def tokenizer(self):
        return self.app.state.server.batcher.tokenizer

    def forced_ids(self, text: str) -> list[int]:
        return self.tokenizer.tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def stats(self) -> dict:
        return self.http.get("/v1/stats").json()

    def alive(self) -> None:
        """The server still generates after whatever went wrong before."""
        r = self.http.post("/v1/completions", json={"model": MODEL, "prompt": "def f(x):", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def listening(app):
    """`app` served by uvicorn on a free loopback port, in a thread, until the block ends -> the port."""
    import uvicorn
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="session")
def live():
    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.server.app import create_app
    gate = threading.Event()

    def load(progress):
        progress("test", 0, 1)
        assert gate.wait(120)
        return LLM(EngineConfig(model=str(DEMO), device="cpu", max_running=8, max_context=2048), progress)
    app = create_app(load, MODEL, api_key=KEY, tool_parser="hermes", reasoning_parser="think",
                     allow_forced_output=True)
    with listening(app) as port:
        srv = Live(app, f"http://127.0.0.1:{port}")
        srv.loading = {"health": srv.http.get("/health"),
                       "chat": srv.http.post("/v1/chat/completions", json={"model": MODEL, "messages": USER}),
                       "messages": srv.http.post("/v1/messages",
                                                 json={"model": MODEL, "messages": USER, "max_tokens": 4})}
        gate.set()
        wait_ready(srv)
        yield srv


@pytest.fixture(scope="session")
def oai(live):
    return openai.OpenAI(base_url=live.base + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="session")
def ant(live):
    return anthropic.Anthropic(base_url=live.base, api_key=KEY, max_retries=0)


# ---- lifecycle, models, stats ------------------------------------------------------------------

def test_loading_then_ok(live):
    h = live.loading["health"]
    assert h.status_code == 503 and h.json() == {"status": "loading", "progress": {
        "stage": "test", "done": 0, "total": 1, "fraction": 0.0}}
    chat, msg = live.loading["chat"], live.loading["messages"]
    assert chat.status_code == 503 and chat.json()["error"]["type"] == "server_error"
    assert "loading" in chat.json()["error"]["message"]
    assert msg.status_code == 503 and msg.json()["type"] == "error"
    assert msg.json()["error"]["type"] == "overloaded_error"
    assert live.http.get("/health").json() == {"status": "ok", "model": MODEL}
    assert httpx.head(live.base + "/").status_code == 200


def test_models(oai, ant):
    assert [m.id for m in oai.models.list()] == [MODEL]
    card = oai.models.list().data[0].model_dump()
    assert card["source"] == str(DEMO) and (Path(card["root"]) / "ftw.json").exists()  # what `run` matches by
    assert [m.id for m in ant.models.list()] == [MODEL]
    assert oai.models.retrieve(MODEL).id == MODEL


def test_stats(live, oai):
    oai.completions.create(model=MODEL, prompt="import os\n", max_tokens=3, temperature=0)
    st = live.stats()
    for key in ("decode_tok_s", "prefill_tok_s", "expert_hit_rate", "q_star", "cache_occupancy", "kv_pages_used"):
        assert key in st, key
    assert st["prefill_tokens"] > 0 and st["decode_tokens"] > 0 and st["model"] == MODEL


# ---- plain generation through each API ------------------------------------------------------

def test_chat(live, oai):
    args = dict(model=MODEL, messages=USER, max_tokens=6, temperature=0)
    whole = oai.chat.completions.create(**args)
    chunks = list(oai.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == whole.choices[0].message.content
    prompt = live.tokenizer.chat(USER)
    assert whole.usage.prompt_tokens == len(prompt) and 1 <= whole.usage.completion_tokens <= 6
    assert whole.usage.prompt_tokens_details.cached_tokens >= 0
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 0


def test_completions(live, oai):
    args = dict(model=MODEL, prompt="def add(a, b):\n", max_tokens=5, temperature=0)
    whole = oai.completions.create(**args)
    chunks = list(oai.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert whole.usage.prompt_tokens == len(live.tokenizer.encode(args["prompt"]))
    assert whole.choices[0].finish_reason in ("stop", "length") and chunks[-1].usage.completion_tokens >= 1
    cut = oai.completions.create(model=MODEL, prompt="x", stop=["beta"], extra_headers=force("alpha beta gamma"))
    assert cut.choices[0].text == "alpha " and cut.choices[0].finish_reason == "stop"


def test_sampling_options(oai):
    args = dict(model=MODEL, messages=USER, max_completion_tokens=3, temperature=1.5, top_p=0.9)
    a, b = (oai.chat.completions.create(**args, seed=11) for _ in range(2))
    assert a.choices[0].message.content == b.choices[0].message.content and a.usage.completion_tokens <= 3
    past_eos = oai.completions.create(model=MODEL, prompt="x", max_tokens=5, temperature=0,
                                      extra_body={"ignore_eos": True})  # vLLM's extension
    assert past_eos.usage.completion_tokens == 5


def test_responses(live, oai):
    args = dict(model=MODEL, input="Write a function.", instructions="Be brief.", max_output_tokens=6, temperature=0)
    events = list(oai.responses.create(**args, stream=True, extra_headers=force("Sure.")))
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"] + ["response.output_text.delta"] * (len(kinds) - 8) + [
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    assert done.output_text == "Sure." and done.usage.input_tokens_details.cached_tokens >= 0
    assert done.usage.output_tokens == len(live.forced_ids("Sure.")) + 1  # the forced text and end of turn
    whole = oai.responses.create(**args)
    assert whole.status in ("completed", "incomplete") and whole.usage.input_tokens == done.usage.input_tokens
    streamed = oai.responses.create(**args, stream=True)
    assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") == whole.output_text


def test_messages(ant):
    args = dict(model=MODEL, max_tokens=6, messages=USER, system="You are terse.", extra_body={"temperature": 0})
    whole = ant.messages.create(**args)
    raw = list(ant.messages.create(**args, stream=True))
    kinds = [e.type for e in raw]
    assert kinds == ["message_start", "content_block_start"] + ["content_block_delta"] * (len(kinds) - 5) + [
        "content_block_stop", "message_delta", "message_stop"]
    assert "".join(e.delta.text for e in raw if e.type == "content_block_delta") == whole.content[0].text
    assert raw[-2].delta.stop_reason == whole.stop_reason in ("end_turn", "max_tokens")
    n = ant.messages.count_tokens(model=MODEL, messages=USER, system="You are terse.").input_tokens
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == n
    with ant.messages.stream(**args) as s:
        final = s.get_final_message()
    assert final.content[0].text == whole.content[0].text and final.usage.output_tokens == whole.usage.output_tokens
    beta = ant.beta.messages.create(**args)  # Claude Code's ?beta=true
    assert beta.content[0].text == whole.content[0].text


def test_billing_header_dropped(ant):
    from engine.server.messages import anthropic_system
    line = "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch={};"

    def count(system):
        return ant.messages.count_tokens(model=MODEL, messages=USER, system=system).input_tokens
    rest = [{"type": "text", "text": "You are Claude Code."}]
    a = count([{"type": "text", "text": line.format("fa690")}] + rest)
    b = count([{"type": "text", "text": line.format("0b1c2")}] + rest)
    assert a == b == count(rest)
    kept = anthropic_system([{"type": "text", "text": line.format("fa690")}] + rest, keep_billing=True)
    assert kept.startswith("x-anthropic-billing-header:")


# ---- tool calls: a round trip in each API --------------------------------------------------

def test_chat_tool_round_trip(live, oai):
    args = dict(model=MODEL, tools=[OAI_TOOL], temperature=0, extra_headers=force(CALL))
    first = oai.chat.completions.create(messages=USER, **args)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls" and not first.choices[0].message.content
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    deltas = [c.choices[0].delta.tool_calls[0] for c in oai.chat.completions.create(messages=USER, stream=True, **args)
              if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "Paris"}
    history = USER + [first.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    second = oai.chat.completions.create(model=MODEL, messages=history, tools=[OAI_TOOL],
                                         extra_headers=force("It is sunny in Paris."))
    assert second.choices[0].message.content == "It is sunny in Paris."
    assert second.choices[0].finish_reason == "stop"
    expected = live.tokenizer.chat(USER + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": call.id, "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}], tools=[OAI_TOOL])
    assert second.usage.prompt_tokens == len(expected)


def test_responses_tool_round_trip(oai):
    tools = [RESP_TOOL, {"type": "web_search"}]  # the unknown tool type is ignored
    events = list(oai.responses.create(model=MODEL, input="Weather in Paris?", tools=tools, stream=True,
                                       extra_headers=force(CALL)))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[3:-3] == ["response.function_call_arguments.delta"] * (len(kinds) - 6)
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    call = events[-2].item
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id == events[2].item.call_id
    assert json.loads(call.arguments) == {"city": "Paris"} and events[-1].response.output[0].id == call.id
    history = [{"role": "user", "content": "Weather in Paris?"}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    answer = oai.responses.create(model=MODEL, input=history, tools=tools, extra_headers=force("Sunny."))
    assert answer.output_text == "Sunny." and answer.status == "completed"


def test_messages_tool_round_trip(ant):
    args = dict(model=MODEL, max_tokens=64, tools=[ANT_TOOL], extra_headers=force(CALL))
    with ant.messages.stream(messages=USER, **args) as stream:
        raw = list(stream)
        first = stream.get_final_message()
    use = first.content[0]
    assert first.stop_reason == "tool_use" and use.type == "tool_use"
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
    parts = [e.delta.partial_json for e in raw if e.type == "content_block_delta"]
    assert json.loads("".join(parts)) == {"city": "Paris"}
    history = USER + [{"role": "assistant", "content": first.content},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
    answer = ant.messages.create(model=MODEL, max_tokens=64, tools=[ANT_TOOL], messages=history,
                                 extra_headers=force("Sunny."))
    assert [b.text for b in answer.content] == ["Sunny."] and answer.stop_reason == "end_turn"
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == ant.messages.count_tokens(
        model=MODEL, tools=[ANT_TOOL], messages=history).input_tokens


def test_malformed_tool_call_is_text(live, oai):
    bad = '<tool_call>{"name": 7}</tool_call>'
    r = oai.chat.completions.create(model=MODEL, messages=USER, tools=[OAI_TOOL], extra_headers=force(bad))
    assert r.choices[0].message.content == bad and not r.choices[0].message.tool_calls
    chunks = oai.chat.completions.create(model=MODEL, messages=USER, tools=[OAI_TOOL], stream=True,
                                         extra_headers=force(bad))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == bad
    live.alive()


# ---- reasoning -------------------------------------------------------------------------------

def test_reasoning_chat(oai):
    r = oai.chat.completions.create(model=MODEL, messages=USER, extra_headers=force(THINK))
    assert r.choices[0].message.reasoning_content.strip() == "Hm."
    assert r.choices[0].message.content == "4."
    chunks = list(oai.chat.completions.create(model=MODEL, messages=USER, stream=True, extra_headers=force(THINK)))
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    assert reasoning.strip() == "Hm."
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "4."
    kept = oai.chat.completions.create(model=MODEL, messages=USER, extra_headers=force(THINK),
                                       extra_body={"separate_reasoning": False})  # SGLang's extension
    assert kept.choices[0].message.content == THINK


def test_reasoning_responses(oai):
    r = oai.responses.create(model=MODEL, input="2+2?", extra_headers=force(THINK))
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text.strip() == "Hm." and r.output_text == "4."
    kinds = [e.type for e in oai.responses.create(model=MODEL, input="2+2?", stream=True, extra_headers=force(THINK))]
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")


def test_reasoning_messages(ant):
    args = dict(model=MODEL, max_tokens=64, messages=USER, extra_headers=force(THINK))
    r = ant.messages.create(**args)
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking.strip() == "Hm." and r.content[1].text == "4."
    raw = list(ant.messages.create(**args, stream=True))
    deltas = [e.delta.type for e in raw if e.type == "content_block_delta"]
    assert deltas[0] == "thinking_delta" and deltas[-1] == "text_delta" and \
        deltas == sorted(deltas, key=["thinking_delta", "text_delta"].index)
    history = USER + [{"role": "assistant", "content": r.content}, {"role": "user", "content": "And 3+3?"}]
    assert ant.messages.create(model=MODEL, max_tokens=2, messages=history).usage.output_tokens >= 1


# ---- concurrency and disconnects -------------------------------------------------------------

def test_concurrent_streams_match_alone(live):
    prompts = [f"Write a Python function number {i} that returns {i * 7}." for i in range(8)]

    async def one(client, prompt):
        chunks = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=6, temperature=0, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in chunks])

    async def run(together: bool) -> list[str]:
        async with openai.AsyncOpenAI(base_url=live.base + "/v1", api_key=KEY, max_retries=0) as client:
            if together:
                return list(await asyncio.gather(*(one(client, p) for p in prompts)))
            return [await one(client, p) for p in prompts]
    steps = [live.stats()["steps"]]
    alone = asyncio.run(run(False))
    steps.append(live.stats()["steps"])
    together = asyncio.run(run(True))
    steps.append(live.stats()["steps"])
    assert together == alone and all(alone)
    assert steps[2] - steps[1] < (steps[1] - steps[0]) / 2, steps  # the streams really shared steps


def test_disconnect_frees_kv(live):
    """Pages held by requests (not donated to the prefix cache) go back to zero after a disconnect."""
    def private(st: dict) -> int:
        return st["kv_pages_used"] - st["prefix_cached_pages"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count."}], "stream": True}
    long = " ".join(str(i) for i in range(200))
    before = live.stats()
    assert private(before) == 0 and before["running"] == 0
    with live.http.stream("POST", "/v1/chat/completions", json=body, headers=force(long)) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
        busy = live.stats()
        assert busy["running"] == 1 and private(busy) > 0
    deadline = time.time() + 20
    while live.stats()["running"]:
        assert time.time() < deadline
        time.sleep(0.05)
    after = live.stats()
    assert private(after) == 0
    assert after["decode_tokens"] - before["decode_tokens"] < len(live.forced_ids(long)) // 2  # aborted early
    live.alive()


# ---- auth and bad input ------------------------------------------------------------------------

def test_auth(live):
    chat = {"model": MODEL, "messages": USER, "max_tokens": 1}
    for headers in ({}, {"authorization": "Bearer wrong"}):
        r = httpx.post(live.base + "/v1/chat/completions", json=chat, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(live.base + "/v1/responses", json={"model": MODEL, "input": "hi"}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = httpx.post(live.base + "/v1/messages", json=chat, headers=headers)
        assert r.status_code == 401 and r.json() == {"type": "error", "error": {
            "type": "authentication_error", "message": r.json()["error"]["message"]}}
    assert httpx.post(live.base + "/v1/messages", json=chat, headers={"x-api-key": KEY}).status_code == 200
    assert httpx.get(live.base + "/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=live.base + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=live.base, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=1, messages=USER)


LONG = "x = 1\n" * 3000  # far over the 2048-token context
BAD_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
CASES = {  # name: (chat body, responses body, messages body, status)
    "json": (b'{"model": "demo", "messages": [', b'{"model": ', b'{"model": "demo"', 400),
    "type": ({"model": MODEL, "messages": "hi"}, {"model": MODEL, "input": 3},
             {"model": MODEL, "messages": USER, "max_tokens": "ten"}, 400),
    "model": ({"model": "gpt-9", "messages": USER}, {"model": "gpt-9", "input": "hi"},
              {"model": "claude-9", "messages": USER, "max_tokens": 4}, 404),
    "context": ({"model": MODEL, "messages": [{"role": "user", "content": LONG}]}, {"model": MODEL, "input": LONG},
                {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "max_tokens": 4}, 400),
    "tool": ({"model": MODEL, "messages": USER, "tools": [BAD_TOOL]},
             {"model": MODEL, "input": "hi", "tools": [{**BAD_TOOL["function"], "type": "function"}]},
             {"model": MODEL, "messages": USER, "max_tokens": 4, "tools": [{"name": "f", "input_schema": 5}]}, 400),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input(live, case):
    chat, resp, msg, status = CASES[case]
    for path, body in (("/v1/chat/completions", chat), ("/v1/responses", resp), ("/v1/messages", msg)):
        kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else \
            {"json": body}
        r = live.http.post(path, **kw)
        assert r.status_code == status, (path, r.text)
        err = r.json()["error"]
        if path == "/v1/messages":
            assert r.json()["type"] == "error" and err["type"] == {400: "invalid_request_error",
                                                                   404: "not_found_error"}[status]
        else:
            assert set(err) == {"message", "type", "param", "code"} and err["message"]
    live.alive()


def test_unknown_fields_are_accepted(oai):
    r = oai.chat.completions.create(model=MODEL, messages=USER, max_tokens=2,
                                    extra_body={"logit_bias": {}, "frobnicate": [1, 2]})
    assert r.usage.completion_tokens >= 1


# ---- prefix caching ------------------------------------------------------------------------------

def test_second_turn_hits_prefix_cache(live, oai):
    import inspect
    source = inspect.getsource(json.decoder) + inspect.getsource(json.encoder)
    ids = live.tokenizer.encode(source, special=False)[:1900]
    system = live.tokenizer.decode(ids)

    def turn(messages) -> tuple[float, int, int]:
        t0 = time.perf_counter()
        chunks = oai.chat.completions.create(model=MODEL, messages=messages, stream=True, extra_headers=force("OK."),
                                             stream_options={"include_usage": True})
        ttft = None
        for c in chunks:
            if ttft is None and c.choices and c.choices[0].delta.content:
                ttft = time.perf_counter() - t0
            if c.usage:
                return ttft, c.usage.prompt_tokens_details.cached_tokens, c.usage.prompt_tokens
    first = [{"role": "system", "content": system}, {"role": "user", "content": "Summarise this module."}]
    ttft1, cached1, n1 = turn(first)
    second = first + [{"role": "assistant", "content": "OK."}, {"role": "user", "content": "More."}]
    ttft2, cached2, n2 = turn(second)
    # a third turn too: the faster of two cached turns, so that one stall of this shared process does not
    # decide the comparison (in a full suite on a 2-core machine one cached turn once took 0.51 s, 0.04 usually)
    ttft3, cached3, _ = turn(second + [{"role": "assistant", "content": "OK."}, {"role": "user", "content": "Again."}])
    assert n1 > 1800 and cached1 == 0
    assert min(cached2, cached3) > 0.9 * n1 and min(ttft2, ttft3) * 5 <= ttft1, (ttft1, ttft2, ttft3, cached2, cached3)


# ---- CLI and parser choice -------------------------------------------------------------------

def test_cli_rejects_bad_parser_before_loading():
    from typer.testing import CliRunner

    from freetoken_cli.main import app
    r = CliRunner().invoke(app, ["serve", "--tool-call-parser", "bogus"])
    assert r.exit_code == 1 and "unknown --tool-call-parser 'bogus'" in r.output


def test_parser_choice():
    from engine.server.state import choose_parsers
    chatml = "{{ '<|im_start|>' + message['content'] }}"
    qwen3 = "{{ '<tool_call>' }} {{ '<think>' }}"
    assert choose_parsers("auto", "auto", chatml, "qwen3_moe") == (None, None)
    assert choose_parsers("auto", "auto", qwen3, "qwen3_moe") == ("hermes", "think")
    assert choose_parsers("qwen3_coder", "none", qwen3, "qwen3_moe") == ("qwen3_coder", None)
    assert choose_parsers("auto", "auto", "", "gpt_oss") == ("harmony", "harmony")


# the part of gpt-oss's Harmony template that reads the effort (its default: medium)
EFFORT_TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                   "Reasoning: {{ reasoning_effort | default('medium') }}\nassistant:")


def test_reasoning_effort_reaches_the_template(live, monkeypatch):
    """Chat completions' reasoning_effort and Responses' reasoning.effort become the template's
    reasoning_effort: Harmony's low / medium / high, the APIs' other levels mapped to the nearest,
    unset the template's default; anything else is a 400 naming the field."""
    monkeypatch.setattr(live.tokenizer.tok, "chat_template", EFFORT_TEMPLATE)
    for effort, level in [("low", "low"), ("high", "high"), ("minimal", "low"), ("xhigh", "high"), (None, "medium")]:
        n = len(live.tokenizer.chat(USER, reasoning_effort=level))
        chat = live.http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": USER, "max_tokens": 1, **({"reasoning_effort": effort} if effort else {})})
        resp = live.http.post("/v1/responses", json={
            "model": MODEL, "input": USER, "max_output_tokens": 1, **({"reasoning": {"effort": effort}} if effort else {})})
        assert (chat.json()["usage"]["prompt_tokens"], resp.json()["usage"]["input_tokens"]) == (n, n), effort
    for path, body, param in [("/v1/chat/completions", {"messages": USER, "reasoning_effort": "max"}, "reasoning_effort"),
                              ("/v1/responses", {"input": USER, "reasoning": {"effort": "max"}}, "reasoning.effort")]:
        r = live.http.post(path, json={"model": MODEL, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_conversions_to_template_messages():
    from engine.server import messages as m
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    want = [{"role": "system", "content": "Be brief.\n\nUse tools."}, USER[0],
            {"role": "assistant", "content": "", "reasoning_content": "Hm.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    responses = m.responses_messages("Be brief.", [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
        {"type": "message", "role": "user", "content": USER[0]["content"]},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Hm."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"}, {"type": "web_search_call"}])
    assert m.fold_system(responses, True) == want
    billing = {"type": "text", "text": "x-anthropic-billing-header: cch=1;"}
    anthropic = m.anthropic_messages([billing, {"type": "text", "text": "Be brief.\n\nUse tools."}], [
        USER[0], {"role": "assistant", "content": [{"type": "thinking", "thinking": "Hm.", "signature": "s"},
                                                   {"type": "tool_use", "id": "c1", "name": "get_weather",
                                                    "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "sunny"}]}], False)
    assert anthropic == want
    chat = m.openai_messages([{"role": "developer", "content": "Be brief.\n\nUse tools."}, USER[0],
                              {"role": "assistant", "content": None, "reasoning_content": "Hm.", "tool_calls": [
                                  {**call, "function": {**call["function"], "arguments": '{"city": "Paris"}'}}]},
                              {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]}])
    assert chat == want
    with pytest.raises(m.APIError):
        m.openai_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


# ---- empty conversations, system messages anywhere, usage, stop reasons ----------------------

EMPTY = {  # path: bodies that hold no message to answer
    "/v1/chat/completions": [{"model": MODEL, "messages": []}],
    "/v1/responses": [{"model": MODEL, "input": []}],
    "/v1/messages": [{"model": MODEL, "max_tokens": 4, "messages": []},
                     {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": []}]},
                     {"model": MODEL, "max_tokens": 4, "system": "Be brief.", "messages": []}],
    "/v1/messages/count_tokens": [{"model": MODEL, "messages": []}],
}


def test_empty_conversation_is_4xx_and_keeps_the_connection(live):
    import http.client
    conn = http.client.HTTPConnection(live.base.removeprefix("http://"), timeout=60)
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    conn.request("GET", "/health")
    conn.getresponse().read()
    sock = conn.sock
    for path, bodies in EMPTY.items():
        for body in bodies:
            conn.request("POST", path, json.dumps(body), headers)
            r = conn.getresponse()
            data = json.loads(r.read())
            assert r.status == 400 and r.getheader("connection") != "close", (path, body, data)
            if path.startswith("/v1/messages"):
                assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
            else:
                assert set(data["error"]) == {"message", "type", "param", "code"}
            assert "empty" in (data["error"]["message"]) or "messages" in data["error"]["message"], data
    conn.request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "def f(x):", "max_tokens": 2}), headers)
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["usage"]["completion_tokens"] >= 1
    assert conn.sock is sock  # the same keep-alive connection served every request


def test_system_messages_anywhere(live, ant):
    from engine.server.messages import fold_system
    msgs = [{"role": "user", "content": "Hi."}, {"role": "system", "content": "Mind the tests."},
            {"role": "user", "content": [{"type": "text", "text": "Go."}]}]
    n = ant.messages.count_tokens(model=MODEL, system="Be brief.", messages=msgs).input_tokens
    rendered = live.tokenizer.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."},
                                    {"role": "system", "content": "Mind the tests."}, {"role": "user", "content": "Go."}])
    assert live.app.state.server.later_system and n == len(rendered)  # the demo template takes it in place
    r = ant.messages.create(model=MODEL, max_tokens=3, system="Be brief.", messages=msgs)
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == n
    folded = fold_system([{"role": "system", "content": "A"}, {"role": "system", "content": "B"},
                          {"role": "user", "content": "u1"}, {"role": "system", "content": "C"},
                          {"role": "assistant", "content": "a"}, {"role": "system", "content": "D"},
                          {"role": "user", "content": "u2"}, {"role": "system", "content": "E"}], later_ok=False)
    reminder = "<system-reminder>\n{}\n</system-reminder>".format
    assert folded == [{"role": "system", "content": "A\n\nB"}, {"role": "user", "content": "u1"},
                      {"role": "assistant", "content": "a"},
                      {"role": "user", "content": f"{reminder('C')}\n\n{reminder('D')}\n\nu2"},
                      {"role": "user", "content": reminder("E")}]


def test_message_start_usage_matches_message_delta(ant):
    msgs = [{"role": "user", "content": "Explain what a Python decorator does, with an example. " * 8}]
    for turn in range(2):
        raw = list(ant.messages.create(model=MODEL, max_tokens=3, messages=msgs, stream=True))
        start, delta = raw[0].message.usage, raw[-2].usage
        assert (start.input_tokens, start.cache_read_input_tokens) == (delta.input_tokens, delta.cache_read_input_tokens)
    assert start.cache_read_input_tokens > 0  # the second turn came from the prefix cache


def test_stop_reasons(live, oai, ant):
    """The client's limit, the context window and the server's cap, in each API's words."""
    args = dict(model=MODEL, messages=USER)
    assert oai.chat.completions.create(**args, max_tokens=2).choices[0].finish_reason == "length"
    assert ant.messages.create(**args, max_tokens=2).stop_reason == "max_tokens"
    short = oai.responses.create(model=MODEL, input="hi", max_output_tokens=2)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
    # a prompt that leaves 20 tokens of a 2048-token context, and a forced answer of 200
    filler = live.tokenizer.encode("x = 1\n" * 2000, special=False)[:2000]
    overhead = len(live.tokenizer.chat([{"role": "user", "content": live.tokenizer.decode(filler)}])) - len(filler)
    full = [{"role": "user", "content": live.tokenizer.decode(filler[:2028 - overhead])}]
    long = force(" ".join(["word"] * 200))
    assert oai.chat.completions.create(model=MODEL, messages=full, extra_headers=long).choices[0].finish_reason == "length"
    assert ant.messages.create(model=MODEL, max_tokens=4000, messages=full,
                               extra_headers=long).stop_reason == "model_context_window_exceeded"
    failed = oai.responses.create(model=MODEL, input=full, extra_headers=long)
    assert failed.status == "failed" and failed.error.code == "context_length_exceeded"
    events = [e.type for e in oai.responses.create(model=MODEL, input=full, extra_headers=long, stream=True)]
    assert events[-1] == "response.failed"
    # the server's --max-output-tokens: a normal end of turn where clients would retry or fail
    from dataclasses import replace
    server = live.app.state.server
    options, server.options = server.options, replace(server.options, max_output_tokens=3)
    try:
        assert ant.messages.create(**args, max_tokens=100).stop_reason == "end_turn"
        capped = oai.responses.create(model=MODEL, input="hi", max_output_tokens=100)
        assert capped.status == "completed" and capped.usage.output_tokens == 3
        assert oai.chat.completions.create(**args).choices[0].finish_reason == "length"
        assert ant.messages.create(**args, max_tokens=2).stop_reason == "max_tokens"  # the client's is lower
    finally:
        server.options = options


# ---- structured outputs and forced tool calls --------------------------------------------------

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                           "maximum": 9}},
          "required": ["ok", "n"], "additionalProperties": False}
UNIT = {"name": "set_unit", "description": "Choose the unit",
        "parameters": {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["unit"], "additionalProperties": False}}


def _valid(obj: dict) -> bool:
    return set(obj) == {"ok", "n"} and isinstance(obj["ok"], bool) and 0 <= obj["n"] <= 9


def test_json_schema_outputs(oai, ant):
    fmt = {"type": "json_schema", "json_schema": {"name": "check", "schema": SCHEMA, "strict": True}}
    for seed in range(3):
        r = oai.chat.completions.create(model=MODEL, messages=USER, response_format=fmt, seed=seed, max_tokens=64)
        assert _valid(json.loads(r.choices[0].message.content)) and r.choices[0].finish_reason == "stop"
    chunks = oai.chat.completions.create(model=MODEL, messages=USER, response_format=fmt, stream=True, max_tokens=64)
    assert _valid(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)))
    r = oai.responses.create(model=MODEL, input="Check it.", max_output_tokens=64, text={"format": {
        "type": "json_schema", "name": "check", "schema": SCHEMA}})
    assert _valid(json.loads(r.output_text)) and r.text.format.type == "json_schema"
    m = ant.messages.create(model=MODEL, max_tokens=64, messages=USER,
                            extra_body={"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}})
    assert _valid(json.loads(m.content[0].text)) and m.stop_reason == "end_turn"
    obj = oai.chat.completions.create(model=MODEL, messages=USER, response_format={"type": "json_object"},
                                      max_tokens=12, temperature=0)
    assert obj.choices[0].message.content.startswith("{")


def test_forced_tool_calls(oai, ant):
    tools = [OAI_TOOL, {"type": "function", "function": UNIT}]
    for choice in ("required", {"type": "function", "function": {"name": "set_unit"}}):
        r = oai.chat.completions.create(model=MODEL, messages=USER, tools=tools, tool_choice=choice, max_tokens=200,
                                        parallel_tool_calls=False, temperature=0)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1, r
        if choice != "required":
            assert calls[0].function.name == "set_unit"
            assert json.loads(calls[0].function.arguments)["unit"] in ("celsius", "fahrenheit")
    r = oai.responses.create(model=MODEL, input="Weather?", tools=[RESP_TOOL, {"type": "function", **UNIT}],
                             tool_choice={"type": "function", "name": "set_unit"}, max_output_tokens=64)
    assert [o.type for o in r.output] == ["function_call"] and r.output[0].name == "set_unit"
    ant_unit = {"name": UNIT["name"], "description": UNIT["description"], "input_schema": UNIT["parameters"]}
    for choice in ({"type": "tool", "name": "set_unit"}, {"type": "any", "disable_parallel_tool_use": True}):
        m = ant.messages.create(model=MODEL, max_tokens=200, messages=USER, tools=[ANT_TOOL, ant_unit],
                                tool_choice=choice, extra_body={"temperature": 0})
        assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"], m
    assert m.content[0].name in ("get_weather", "set_unit")


def test_bad_output_format(live):
    bodies = {"/v1/chat/completions": {"model": MODEL, "messages": USER, "response_format": {"type": "xml"}},
              "/v1/responses": {"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema",
                                                                                    "schema": 3}}},
              "/v1/messages": {"model": MODEL, "max_tokens": 4, "messages": USER,
                               "output_config": {"format": {"type": "regex"}}}}
    for path, body in bodies.items():
        r = live.http.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
    live.alive()
