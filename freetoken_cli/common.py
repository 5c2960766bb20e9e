"""Shared CLI plumbing: one-line errors with a non-zero exit code, model/memory options, progress."""
from __future__ import annotations

import functools
import sys
from typing import Optional

import typer

ModelArg = typer.Argument(None, help="FTW directory, HuggingFace directory or hub id (default: the embedded demo model)")


def fail(msg: str, code: int = 1):
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def user_errors(fn):
    """Turn mistakes a user can fix into one line on stderr and exit code 1."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from engine.errors import UserError
        from ftw import FTWError
        try:
            return fn(*args, **kwargs)
        except (UserError, FTWError) as e:
            fail(str(e))
        except KeyboardInterrupt:
            typer.echo("", err=True)
            raise typer.Exit(130)
    return wrapper


def engine_config(model: Optional[str], device: str, expert_budget: str, moe_policy: str,
                  cpu_threads: Optional[int], max_context: int, no_graph: bool = False, **extra):
    from engine.config import EngineConfig, parse_chunk, parse_policy, parse_size
    if "prefill_chunk" in extra:
        extra["prefill_chunk"] = parse_chunk(extra["prefill_chunk"])
    return EngineConfig(model=model, device=device, expert_budget=parse_size(expert_budget),
                        moe_policy=parse_policy(moe_policy), cpu_threads=cpu_threads,
                        max_context=max_context, graph=False if no_graph else None, **extra)


# the model and memory options every engine command takes
Budget = typer.Option("auto", help="device memory for the expert cache, e.g. 8GiB, 512MiB, auto")
Device = typer.Option("auto", help="cuda | cpu | auto")
Policy = typer.Option("adaptive", help="miss policy: adaptive | fetch | cpu | static:N | static:auto")
Threads = typer.Option(None, help="CPU expert threads (default: physical cores)")
Context = typer.Option(32768, help="context length in tokens")
Chunk = typer.Option("auto", help="tokens per prefill chunk (auto: as many as free device memory holds)")
NoGraph = typer.Option(False, "--no-graph", help="eager decode (no CUDA graphs, host-side expert control)")
Checkpoints = typer.Option(16, min=0, help="hybrid models (Qwen3-Next, Qwen3.5): recurrent-state checkpoints "
                           "kept at anchors for prefix reuse (LRU; 0 = off)")


class Progress:
    """A rich progress bar on stderr fed by (stage, done, total) callbacks."""

    def __init__(self, quiet: bool = False):
        self.quiet, self.bar, self.tasks = quiet or not sys.stderr.isatty(), None, {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.quiet:
            return
        if self.bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as Bar, TaskProgressColumn, TextColumn, TimeRemainingColumn
            self.bar = Bar(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                           TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self.bar.start()
        if stage not in self.tasks:
            label = {"convert": "converting to FTW", "experts": "loading experts"}.get(stage, stage)
            self.tasks[stage] = self.bar.add_task(label, total=total)
        self.bar.update(self.tasks[stage], completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
