"""`freetoken serve [MODEL]`: OpenAI, Responses and Anthropic APIs over HTTP for agent clients.

uvicorn starts at once; the model loads in a background thread while /health reports progress."""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from typing import Optional

import typer

from freetoken_cli.common import (Budget, Checkpoints, Chunk, Context, Device, Elastic, Gpus, ModelArg, NoGraph, Policy,
                                  Threads, Verify, WorldSize, engine_config, fail, start_expert_read, user_errors)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# the address and key options also tell `run` where to find a server (freetoken_cli.client)
Host = typer.Option("127.0.0.1", envvar="FREETOKEN_HOST", help="address to listen on (loopback by default)")
Port = typer.Option(8000, envvar="FREETOKEN_PORT", help="port to listen on")
ApiKey = typer.Option(None, envvar="FREETOKEN_API_KEY", help="require this key (Authorization: Bearer or x-api-key)")


@user_errors
def serve(model: Optional[str] = ModelArg,
          host: str = Host,
          port: int = Port,
          api_key: Optional[str] = ApiKey,
          served_model_name: Optional[str] = typer.Option(None, help="model name clients send (default: MODEL)"),
          max_running: int = typer.Option(4, min=1, help="requests decoded together (they share one KV pool of "
                                                         "--max-context tokens)"),
          max_output_tokens: Optional[int] = typer.Option(None, min=1, help="cap every answer at N tokens "
                                                                             "(clients may ask for fewer)"),
          tool_call_parser: str = typer.Option("auto", help="auto | none | hermes | qwen3_coder | glm45 | harmony"),
          reasoning_parser: str = typer.Option("auto", help="auto | none | think | harmony"),
          keep_billing_header: bool = typer.Option(False, "--keep-billing-header",
                                                   help="keep Claude Code's per-request billing line in the prompt"),
          expert_budget: str = Budget,
          device: str = Device,
          moe_policy: str = Policy,
          cpu_threads: Optional[int] = Threads,
          max_context: int = Context,
          no_graph: bool = NoGraph,
          prefill_chunk: str = Chunk,
          verify: bool = Verify,
          elastic: Optional[bool] = Elastic,
          state_checkpoints: int = Checkpoints,
          world_size: int = WorldSize,
          gpus: Optional[str] = Gpus,
          log_level: str = typer.Option("info", help="uvicorn log level")):
    """Serve MODEL to agents: /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages."""
    cfg = engine_config(model, device, expert_budget, moe_policy, cpu_threads, max_context, no_graph,
                        max_running=max_running, prefill_chunk=prefill_chunk, verify=verify, elastic=elastic,
                        state_checkpoints=state_checkpoints, world_size=world_size, gpus=gpus)
    start_expert_read(cfg)
    import uvicorn

    from engine.dist import follow_if_worker
    from engine.llm import LLM
    from engine.server.app import create_app
    follow_if_worker(cfg)  # under torchrun, ranks other than 0 follow rank 0 from here (they never listen)
    failed, loaded = [], threading.Event()

    def load(progress):
        try:
            return LLM(cfg, progress)
        finally:
            loaded.set()

    def on_load_error(message: str) -> None:
        failed.append(message)
        server.should_exit = True

    app = create_app(load, served_model_name or model or "freetoken-demo",
                     api_key=api_key, tool_parser=tool_call_parser, reasoning_parser=reasoning_parser,
                     keep_billing_header=keep_billing_header, max_output_tokens=max_output_tokens,
                     on_load_error=on_load_error)
    sock = listen(host, port)
    if host not in LOOPBACK and not api_key:
        typer.echo(f"warning: listening on {host} without --api-key: anyone who can reach it can use it", err=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level))
    logging.getLogger("uvicorn.error").info("FreeToken listening on http://%s:%d (Ctrl-C to quit)",
                                           f"[{host}]" if ":" in host else host, port)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        if not loaded.is_set():  # the interpreter's teardown under the loading thread would abort the process
            sys.stderr.flush()
            os._exit(130)
        raise
    if failed:
        fail(failed[0])


def listen(host: str, port: int) -> socket.socket:
    """Bind before the model starts loading, so a bad port or host is one line, not a crash."""
    from engine.errors import UserError
    if not 0 < port < 65536:
        raise UserError(f"--port {port} is out of range; give a port from 1 to 65535")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port} ({e.strerror or e}); choose another --port or --host") from None
    return sock
