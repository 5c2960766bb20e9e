"""`freetoken serve [MODEL]`: OpenAI, Responses and Anthropic APIs over HTTP for agent clients.

uvicorn starts at once; the model loads in a background thread while /health reports progress."""
from __future__ import annotations

from typing import Optional

import typer

from freetoken_cli.common import Budget, Checkpoints, Chunk, Context, Device, ModelArg, NoGraph, Policy, Threads, engine_config, fail, user_errors

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@user_errors
def serve(model: Optional[str] = ModelArg,
          host: str = typer.Option("127.0.0.1", help="address to listen on (loopback by default)"),
          port: int = typer.Option(8000, help="port to listen on"),
          api_key: Optional[str] = typer.Option(None, help="require this key (Authorization: Bearer or x-api-key)"),
          served_model_name: Optional[str] = typer.Option(None, help="model name clients send (default: MODEL)"),
          max_running: int = typer.Option(1, help="requests decoded together; each adds --max-context tokens of KV"),
          tool_call_parser: str = typer.Option("auto", help="auto | none | hermes | qwen3_coder | harmony"),
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
          state_checkpoints: int = Checkpoints,
          log_level: str = typer.Option("info", help="uvicorn log level")):
    """Serve MODEL to agents: /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages."""
    import uvicorn

    from engine.llm import LLM
    from engine.server.app import create_app
    cfg = engine_config(model, device, expert_budget, moe_policy, cpu_threads, max_context, no_graph,
                        max_running=max_running, prefill_chunk=prefill_chunk, state_checkpoints=state_checkpoints)
    if host not in LOOPBACK and not api_key:
        typer.echo(f"warning: listening on {host} without --api-key: anyone who can reach it can use it", err=True)
    failed: list[str] = []

    def on_load_error(message: str) -> None:
        failed.append(message)
        server.should_exit = True

    app = create_app(lambda progress: LLM(cfg, progress), served_model_name or model or "freetoken-demo",
                     api_key=api_key, tool_parser=tool_call_parser, reasoning_parser=reasoning_parser,
                     keep_billing_header=keep_billing_header, on_load_error=on_load_error)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))
    server.run()
    if failed:
        fail(failed[0])
