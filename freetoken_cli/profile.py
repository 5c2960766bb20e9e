"""`freetoken profile`: measure the bandwidths behind the CPU/PCIe miss split on this machine."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from freetoken_cli.common import user_errors


@user_errors
def profile(as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
            out: Optional[Path] = typer.Option(None, help="also write the profile to this file"),
            cpu_threads: Optional[int] = typer.Option(None, help="CPU expert threads (default: the fastest of a sweep, which then becomes the engine's default)"),
            fmt: str = typer.Option("bfloat16", "--format", help="expert format measured: bfloat16 (used for "
                                    "every float model) | int4 | int8 | fp8 | mxfp4 (run and serve use the model's)")):
    """Measure the CPU expert threads' best count, B_P (pinned expert fills), B_H (CPU expert executor), both concurrently, and ceilings."""
    from engine.config import check_positive
    from engine.profile import measure, save
    check_positive("--cpu-threads", cpu_threads)
    res = measure(threads=cpu_threads, fmt=fmt)
    saved = save(res)
    if out:
        save(res, out)
    if as_json:
        typer.echo(json.dumps(res))
        return
    _table(res, saved)


def _table(res: dict, saved: Path) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title="FreeToken machine profile")
    t.add_column("measurement")
    t.add_column("GB/s", justify="right")
    rows = [("B_P  pinned expert fills (H2D)", "h2d_gbps"), ("B_H  CPU expert executor, batch 1", "cpu_expert_gbps"),
            ("B_P  while the CPU runs", "h2d_concurrent_gbps"), ("B_H  while fills run", "cpu_expert_concurrent_gbps"),
            ("ceiling: host read (STREAM-like)", "stream_read_gbps"), ("ceiling: linear pinned H2D", "linear_h2d_gbps")]
    for label, key in rows:
        t.add_row(label, "n/a (no CUDA)" if res[key] is None else f"{res[key]:.1f}")
    m = res["machine"]
    con = Console()
    con.print(t)
    con.print(f"q* = B_P / (B_P + B_H) = {res['q_star']:.3f}   "
              f"({m['gpu'] or 'no GPU'}; {m['cpu']}, {m['physical_cores']} cores, {m['ram_gib']} GiB; "
              f"CPU executor {res['cpu_backend']} x{res['cpu_threads']}; {res['format']} experts of "
              f"{res['expert_bytes'] / 2**20:.2f} MiB)")
    if res.get("thread_sweep"):
        con.print("CPU expert threads (beside busy host threads): " + ", ".join(
            f"{r['threads']}: {r['gbps']:.1f} GB/s" for r in res["thread_sweep"]) + f"; picked {res['cpu_threads']}")
    if m["gpu"] is None:
        con.print("no CUDA device: measured B_H only; every miss would run on the CPU")
    con.print(f"saved to {saved}")
