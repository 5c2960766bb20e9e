"""Shared CLI plumbing: one-line errors with a non-zero exit code, model/memory options, progress."""
from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path
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
        from engine.errors import user_error_types
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:  # first: the next clause imports ftw (torch), which Ctrl-C may have cut short
            typer.echo("", err=True)
            raise typer.Exit(130)
        except user_error_types() as e:
            fail(str(e))
    return wrapper


def check_writable(path: Path, what: str, make_parents: bool = False) -> None:
    """Fail before any work when `path` cannot be written: its directory (with make_parents, the
    nearest one that exists) must take a new file."""
    from engine.errors import UserError
    d = path.expanduser().absolute().parent
    while make_parents and not d.exists():
        d = d.parent
    try:
        tempfile.TemporaryFile(dir=d).close()
    except OSError as e:
        raise UserError(f"cannot write {what} {path} ({d}: {e.strerror}); choose another path") from None


def engine_config(model: Optional[str], device: str, expert_budget: str, moe_policy: str,
                  cpu_threads: Optional[int], max_context: int, no_graph: bool = False, **extra):
    from engine.config import EngineConfig, parse_chunk, parse_gpus, parse_policy, parse_size
    if "prefill_chunk" in extra:
        extra["prefill_chunk"] = parse_chunk(extra["prefill_chunk"])
    if "gpus" in extra:
        extra["gpus"] = parse_gpus(extra["gpus"])
    return EngineConfig(model=model, device=device, expert_budget=parse_size(expert_budget),
                        moe_policy=parse_policy(moe_policy), cpu_threads=cpu_threads,
                        max_context=max_context, graph=False if no_graph else None, **extra)


def start_expert_read(cfg) -> None:
    """Start reading the model's expert banks now, before torch is imported (ftw.early), where
    the load will adopt them: the model is an FTW directory, a converted model's name, or an HF
    directory or hub id converted before; one process loads all its experts; no --verify reads
    everything first."""
    from engine.resolve import ftw_dir
    if cfg.ranks == 1 and not cfg.verify and (path := ftw_dir(cfg.model, converted=True)) is not None:
        from ftw import early
        early.start(path)


# the model and memory options every engine command takes
Budget = typer.Option("auto", help="device memory for the expert cache, e.g. 8GiB, 512MiB, auto")
Device = typer.Option("auto", help="cuda | cpu | auto")
Policy = typer.Option("adaptive", help="miss policy: adaptive | fetch | cpu | static:N | static:auto")
Threads = typer.Option(None, help="CPU expert threads (default: physical cores)")
Context = typer.Option(32768, help="context length in tokens")
Chunk = typer.Option("auto", help="tokens per prefill chunk (auto: as many as free device memory holds)")
Verify = typer.Option(False, "--verify", help="check every tensor's checksum while loading (reads the model twice)")
NoGraph = typer.Option(False, "--no-graph", help="eager decode (no CUDA graphs, host-side expert control)")
Elastic = typer.Option(None, "--elastic/--no-elastic",
                       help="shrink the expert cache when other programs take GPU memory, grow it back when "
                            "they free it (default: on with --expert-budget auto and one rank)")
Checkpoints = typer.Option(16, min=0, help="hybrid models (Qwen3-Next, Qwen3.5): recurrent-state checkpoints "
                           "kept at anchors for prefix reuse (LRU; 0 = off)")
WorldSize = typer.Option(1, "--world-size", help="ranks that split the routed experts, one process per GPU "
                                                 "(under torchrun: its WORLD_SIZE)")
Gpus = typer.Option(None, "--gpus", help="the GPUs of this host's ranks, e.g. 0,1 (default: 0..N-1)")


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
