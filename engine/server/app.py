"""The FastAPI app: starts answering at once and loads the model in a background thread
(/health reports progress), then serves the OpenAI, Responses and Anthropic APIs from one
`Server` that templates prompts, builds sampling parameters, picks parsers and runs the engine.

Errors come back in the calling API's own shape (Anthropic under /v1/messages, OpenAI
elsewhere). Test-only: with `allow_forced_output=True` a request header
`x-freetoken-force-output: <percent-encoded text>` makes the model emit exactly that text
(then end of turn), so the real generation and parsing path runs on a model of any quality."""
from __future__ import annotations

import hmac
import logging
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable
from urllib.parse import unquote

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from engine.config import SamplingParams
from engine.errors import UserError, user_error_types
from engine.server.messages import APIError, merge_system
from engine.server.parsers import REASONING_PARSERS, TOOL_PARSERS, OutputParser, opens_reasoning, select_parsers
from engine.server.sse import Job
from engine.serving import ServingEngine

log = logging.getLogger("freetoken.server")
FORCE_HEADER = "x-freetoken-force-output"
ProgressFn = Callable[[str, int, int], None]
ANTHROPIC_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                   503: "overloaded_error"}


@dataclass(frozen=True)
class Options:
    model_name: str
    api_key: str | None = None
    tool_parser: str = "auto"          # auto | none | one of TOOL_PARSERS
    reasoning_parser: str = "auto"     # auto | none | one of REASONING_PARSERS
    keep_billing_header: bool = False
    allow_forced_output: bool = False


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
        self.engine: ServingEngine | None = None
        self.progress: dict[str, Any] = {"stage": "starting", "done": 0, "total": 0}
        self.error: str | None = None
        self.parsers: tuple[str | None, str | None] = (None, None)

    def load(self, load: Callable[[ProgressFn], Any], on_error: Callable[[str], None] | None) -> None:
        try:
            llm = load(self._progress)
            o = self.options
            self.parsers = choose_parsers(o.tool_parser, o.reasoning_parser, llm.tokenizer.tok.chat_template,
                                          llm.engine.cfg.model_type)
            self.engine = ServingEngine(llm, o.model_name)
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
        if self.engine:
            return 200, {"status": "ok", "model": self.options.model_name}
        if self.error:
            return 500, {"status": "error", "error": self.error}
        return 503, {"status": "loading", "progress": self.progress}

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def check_model(self, name: str | None) -> None:
        if name and name != self.options.model_name:
            raise APIError(404, f"model {name!r} is not served here; use {self.options.model_name!r}",
                           param="model", code="model_not_found")

    def render(self, messages: list[dict], tools: list[dict] | None = None, **template_kwargs) -> list[int]:
        """Chat messages -> prompt token ids through the model's chat template."""
        from jinja2 import TemplateError
        try:
            return self.tokenizer.chat(merge_system(messages), tools=tools or None, **template_kwargs)
        except TemplateError as e:
            raise APIError(400, f"the model's chat template rejected these messages: {e}") from None
        except UserError as e:
            raise APIError(400, str(e)) from None

    def job(self, request: Request, ids: list[int], model: str | None, tools: bool, *,
            max_tokens: int | None = None, stop: str | list[str] | None = None, parse: bool = True,
            **sampling) -> Job:
        """Check the prompt, build sampling parameters (and forced output) and a fresh parser."""
        self.check_model(model)
        try:
            self.engine.llm.check_prompt(ids)
            room = self.engine.llm.engine.max_context - len(ids)
            params = SamplingParams(max_tokens=room if max_tokens is None else min(room, max_tokens), stop=_stops(stop),
                                    **{k: v for k, v in sampling.items() if v is not None})
        except UserError as e:
            raise APIError(400, str(e), code="context_length_exceeded" if "context" in str(e) else None) from None
        forced = request.headers.get(FORCE_HEADER) if self.options.allow_forced_output else None
        if forced is not None:
            params = self._forced(params, unquote(forced))
        tool, reasoning = self.parsers if parse else (None, None)
        starts = bool(reasoning) and opens_reasoning(self.tokenizer.decode(ids[-8:], skip_special=False))
        return Job(ids, params, OutputParser(tool, reasoning, tools, starts), model or self.options.model_name)

    def _forced(self, params: SamplingParams, text: str) -> SamplingParams:
        # special-token text is split into plain tokens, so the forced text decodes back to itself
        tok = self.tokenizer
        ids = tok.tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        eos = tok.tok.eos_token_id if tok.tok.eos_token_id is not None else min(tok.eos_ids)
        forced = tuple(ids) + (eos,)
        return replace(params, forced=forced, max_tokens=len(forced), ignore_eos=False)


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
    if server.engine is None:
        body = server.health()[1]
        raise APIError(503, f"the model is {body['status']}: {body.get('progress') or body.get('error')}",
                       "server_error")
    return server


def error_response(request: Request, err: APIError) -> JSONResponse:
    if request.url.path.startswith("/v1/messages"):
        kind = ANTHROPIC_KINDS.get(err.status, "api_error")
        body: dict = {"type": "error", "error": {"type": kind, "message": err.message}}
    else:
        body = {"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}}
    headers = {"www-authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(body, status_code=err.status, headers=headers)


def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid request"}
    loc = ".".join(str(p) for p in first["loc"][1:]) or "body"
    msg = "the body is not valid JSON" if first.get("type") == "json_invalid" else f"{loc}: {first['msg']}"
    return error_response(request, APIError(400, msg, param=loc))


def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return error_response(request, APIError(exc.status_code, str(exc.detail), "invalid_request_error"))


def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    # starlette re-raises after answering, so uvicorn still logs the traceback
    return error_response(request, APIError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error"))


def create_app(load: Callable[[ProgressFn], Any], model_name: str,
               on_load_error: Callable[[str], None] | None = None, **options) -> FastAPI:
    """An app that calls `load(progress)` -> LLM in a background thread when it starts.
    options: the fields of `Options` (api_key, tool_parser, reasoning_parser, ...)."""
    from engine.server import anthropic_api, openai_api, responses_api
    server = Server(Options(model_name, **options))
    choose_parsers(server.options.tool_parser, server.options.reasoning_parser, None, None)  # fail before loading

    async def lifespan(app: FastAPI):
        threading.Thread(target=server.load, args=(load, on_load_error), name="freetoken-load", daemon=True).start()
        yield
        if server.engine:
            server.engine.close()

    app = FastAPI(title="FreeToken", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = server
    app.add_exception_handler(APIError, error_response)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    _add_common_routes(app, server)
    for module in (openai_api, responses_api, anthropic_api):
        app.include_router(module.router)
    return app


def _add_common_routes(app: FastAPI, server: Server) -> None:
    @app.api_route("/", methods=["GET", "HEAD"])
    def root() -> dict:
        return {"status": server.health()[1]["status"]}

    @app.get("/health")
    def health() -> JSONResponse:
        status, body = server.health()
        return JSONResponse(body, status_code=status)

    @app.get("/v1/stats")
    def stats(s: Server = Depends(get_server)) -> dict:
        return {"model": s.options.model_name, **s.engine.stats()}

    @app.get("/v1/models")
    def models(s: Server = Depends(get_server)) -> dict:
        card = _model_card(s.options.model_name)
        return {"object": "list", "data": [card], "has_more": False, "first_id": card["id"], "last_id": card["id"]}

    @app.get("/v1/models/{name:path}")
    def model(name: str, s: Server = Depends(get_server)) -> dict:
        s.check_model(name)
        return _model_card(name)


def _model_card(name: str) -> dict:
    # one card that both SDKs read: OpenAI's Model and Anthropic's ModelInfo
    return {"id": name, "object": "model", "created": 0, "owned_by": "freetoken", "type": "model",
            "display_name": name, "created_at": "1970-01-01T00:00:00Z"}
