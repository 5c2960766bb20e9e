"""The FastAPI app: starts answering at once and loads the model in a background thread
(/health reports progress), then serves the OpenAI, Responses and Anthropic APIs (one router
each) from one `Server` (engine.server.state).

Errors come back in the calling API's own shape (Anthropic under /v1/messages, OpenAI
elsewhere)."""
from __future__ import annotations

import threading
from typing import Any, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from engine.server import admin_api, anthropic_api, openai_api, responses_api
from engine.server.messages import APIError
from engine.server.state import Options, ProgressFn, Server, choose_parsers, get_server

ANTHROPIC_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                   503: "overloaded_error"}


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
    server = Server(Options(model_name, **options))
    choose_parsers(server.options.tool_parser, server.options.reasoning_parser, None, None)  # fail before loading

    async def lifespan(app: FastAPI):
        threading.Thread(target=server.load, args=(load, on_load_error), name="freetoken-load", daemon=True).start()
        yield
        if server.batcher:
            server.batcher.close()

    app = FastAPI(title="FreeToken", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = server
    app.add_exception_handler(APIError, error_response)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    _add_common_routes(app, server)
    for module in (openai_api, responses_api, anthropic_api, admin_api):
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
        return {"model": s.options.model_name, **s.batcher.stats()}

    @app.get("/v1/models")
    def models(s: Server = Depends(get_server)) -> dict:
        card = _model_card(s)
        return {"object": "list", "data": [card], "has_more": False, "first_id": card["id"], "last_id": card["id"]}

    @app.get("/v1/models/{name:path}")
    def model(name: str, s: Server = Depends(get_server)) -> dict:
        s.check_model(name)
        return _model_card(s)


def _model_card(s: Server) -> dict:
    # one card that both SDKs read: OpenAI's Model and Anthropic's ModelInfo; source (MODEL as
    # `engine.resolve.model_key` names it) and root (the FTW directory, as vLLM's card has it)
    # let `freetoken run` tell whether this is the model it was asked for
    name, llm = s.options.model_name, s.batcher.llm
    return {"id": name, "object": "model", "created": 0, "owned_by": "freetoken", "type": "model",
            "display_name": name, "created_at": "1970-01-01T00:00:00Z", "source": llm.source, "root": str(llm.path)}
