"""The server state every API shares: the `Options` of `freetoken serve`, the `Server` that loads
the model (in a background thread, reporting progress), picks the tool and reasoning parsers,
templates prompts and builds sampling parameters, and `get_server`, the dependency of every model
endpoint. Test-only: with `allow_forced_output=True` a request header
`x-freetoken-force-output: <percent-encoded text>` makes the model emit exactly that text (then end
of turn), so the real generation and parsing path runs on a model of any quality."""
from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass, replace
from typing import Any, Callable
from urllib.parse import unquote

from fastapi import Request

from engine.config import SamplingParams
from engine.errors import UserError, user_error_types
from engine.server.messages import APIError, check_not_empty, fold_system
from engine.server.parsers import REASONING_PARSERS, TOOL_PARSERS, OutputParser, opens_reasoning, select_parsers
from engine.server.sse import Job
from engine.server.structured import OutputSpec, grammar
from engine.serving import Batcher

log = logging.getLogger("freetoken.server")
FORCE_HEADER = "x-freetoken-force-output"
ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Options:
    model_name: str
    api_key: str | None = None
    tool_parser: str = "auto"          # auto | none | one of TOOL_PARSERS
    reasoning_parser: str = "auto"     # auto | none | one of REASONING_PARSERS
    keep_billing_header: bool = False
    allow_forced_output: bool = False
    max_output_tokens: int | None = None  # server-side cap on every answer


def choose_parsers(tool: str, reasoning: str, chat_template: str | None,
                   model_type: str | None) -> tuple[str | None, str | None]:
    """--tool-call-parser / --reasoning-parser: auto picks from the template and model type."""
    for value, valid, flag in ((tool, TOOL_PARSERS, "--tool-call-parser"),
                               (reasoning, REASONING_PARSERS, "--reasoning-parser")):
        if value not in ("auto", "none", *valid):
            raise UserError(f"unknown {flag} {value!r}; choose auto, none, {', '.join(valid)}")
    auto_tool, auto_reasoning = select_parsers(chat_template, model_type)
    pick = lambda value, auto: auto if value == "auto" else None if value == "none" else value  # noqa: E731
    return pick(tool, auto_tool), pick(reasoning, auto_reasoning)


class Server:
    """The loaded model and what every API needs from it."""

    def __init__(self, options: Options):
        self.options = options
        self.batcher: Batcher | None = None
        self.progress: dict[str, Any] = {"stage": "starting", "done": 0, "total": 0}
        self.error: str | None = None
        self.parsers: tuple[str | None, str | None] = (None, None)
        self.later_system = True  # the chat template renders system messages after the first turn

    def load(self, load: Callable[[ProgressFn], Any], on_error: Callable[[str], None] | None) -> None:
        try:
            llm = load(self._progress)
            o = self.options
            self.parsers = choose_parsers(o.tool_parser, o.reasoning_parser, llm.tokenizer.tok.chat_template,
                                          llm.runner.cfg.model_type)
            self.later_system = _renders_later_system(llm.tokenizer.tok)
            self.batcher = Batcher(llm, o.model_name)
        except Exception as e:  # the server stays up to report it; a user error is the user's to fix
            fixable = isinstance(e, user_error_types())
            self.error = str(e) if fixable else f"{type(e).__name__}: {e}"
            if not fixable:
                log.exception("loading the model failed")
            if on_error:
                on_error(self.error)

    def _progress(self, stage: str, done: int, total: int) -> None:
        self.progress = {"stage": stage, "done": done, "total": total,
                         "fraction": round(done / total, 4) if total else 0.0}

    def health(self) -> tuple[int, dict]:
        if self.batcher:
            return 200, {"status": "ok", "model": self.options.model_name}
        if self.error:
            return 500, {"status": "error", "error": self.error}
        return 503, {"status": "loading", "progress": self.progress}

    @property
    def tokenizer(self):
        return self.batcher.tokenizer

    def check_model(self, name: str | None) -> None:
        if name and name != self.options.model_name:
            raise APIError(404, f"model {name!r} is not served here; use {self.options.model_name!r}",
                           param="model", code="model_not_found")

    def render(self, messages: list[dict], tools: list[dict] | None = None, where: str = "messages",
               **template_kwargs) -> list[int]:
        """Chat messages -> prompt token ids through the model's chat template."""
        from jinja2 import TemplateError
        check_not_empty(messages, where)
        try:
            return self.tokenizer.chat(fold_system(messages, self.later_system), tools=tools or None,
                                       **template_kwargs)
        except TemplateError as e:
            raise APIError(400, f"the model's chat template rejected these messages: {e}") from None
        except UserError as e:
            raise APIError(400, str(e)) from None

    def job(self, request: Request, ids: list[int], model: str | None, tools: bool, *,
            max_tokens: int | None = None, stop: str | list[str] | None = None, parse: bool = True,
            separate_reasoning: bool = True, output: OutputSpec = OutputSpec(), **sampling) -> Job:
        """Check the prompt, build sampling parameters (answer limit, grammar for `output`, forced
        output) and a fresh parser (none with parse=False; without the reasoning parser with
        separate_reasoning=False). The answer ends at the client's max_tokens, the server's
        --max-output-tokens or the end of the context, whichever comes first."""
        self.check_model(model)
        llm, cap = self.batcher.llm, self.options.max_output_tokens
        tool, reasoning = self.parsers if parse else (None, None)
        reasoning = reasoning if separate_reasoning else None
        starts = bool(reasoning) and opens_reasoning(self.tokenizer.decode(ids[-8:], skip_special=False))
        try:
            llm.check_prompt(ids)
            limits = [n for n in (max_tokens, cap) if n is not None]
            rules = grammar(output, llm.grammars, tool, reasoning, starts)
            if rules:
                llm.grammars.check(rules)
            given = {k: v for k, v in sampling.items() if v is not None}
            penalty = llm.sampling_defaults.get("repetition_penalty")  # the model's, as run applies it
            params = SamplingParams(max_tokens=min(limits, default=llm.runner.max_context), stop=_stops(stop),
                                    grammar=rules, **({"repetition_penalty": penalty} if penalty else {}) | given)
        except UserError as e:
            raise APIError(400, str(e), code="context_length_exceeded" if "context" in str(e) else None) from None
        forced = request.headers.get(FORCE_HEADER) if self.options.allow_forced_output else None
        if forced is not None:
            params = self._forced(params, unquote(forced))
        capped = cap is not None and (max_tokens is None or cap < max_tokens)
        return Job(ids, params, OutputParser(tool, reasoning, tools, starts), model or self.options.model_name,
                   capped=capped)

    def _forced(self, params: SamplingParams, text: str) -> SamplingParams:
        # special-token text is split into plain tokens, so the forced text decodes back to itself
        tok = self.tokenizer
        ids = tok.tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        eos = tok.tok.eos_token_id if tok.tok.eos_token_id is not None else min(tok.eos_ids)
        forced = tuple(ids) + (eos,)
        return replace(params, forced=forced, max_tokens=len(forced), ignore_eos=False, grammar=None)


def _renders_later_system(hf_tokenizer) -> bool:
    """Does the chat template render a system message that follows a user message?"""
    probe = "freetoken-probe-7f3a"
    msgs = [{"role": "user", "content": "a"}, {"role": "system", "content": probe}, {"role": "user", "content": "b"}]
    try:
        return probe in hf_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    except Exception:  # templates refuse it with raise_exception, or fail in their own ways
        return False


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    return (stop,) if isinstance(stop, str) else tuple(stop or ())


def get_server(request: Request) -> Server:
    """Dependency of every model endpoint: authorised and loaded, or an error."""
    server: Server = request.app.state.server
    key = server.options.api_key
    if key:
        auth = request.headers.get("authorization", "")
        given = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        if not hmac.compare_digest(given.encode(), key.encode()):
            raise APIError(401, "invalid or missing API key (send Authorization: Bearer KEY or x-api-key: KEY)",
                           "authentication_error", code="invalid_api_key")
    if server.batcher is None:
        body = server.health()[1]
        raise APIError(503, f"the model is {body['status']}: {body.get('progress') or body.get('error')}",
                       "server_error")
    return server
