"""`freetoken ls` and `freetoken rm NAME`: the converted models in the user cache directory."""
from __future__ import annotations

from typing import List

import typer

from freetoken_cli.common import user_errors


@user_errors
def ls():
    """List the converted models in the cache: name (for run, verify and rm), source, format, size."""
    from engine.resolve import converted_models, models_dir
    rows = converted_models()
    if not rows:
        typer.echo(f"no converted models in {models_dir()}", err=True)
        return
    table = [("NAME", "SOURCE", "FORMAT", "SIZE")] + [
        (r["name"], r["source"], r["format"], size_text(r["bytes"])) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])


@user_errors
def rm(names: List[str] = typer.Argument(..., help="converted model names, as `freetoken ls` shows them")):
    """Delete converted models from the cache (a HuggingFace source is converted again when next used)."""
    from engine.resolve import remove_converted
    for name in names:
        typer.echo(f"removed {remove_converted(name)}", err=True)


def size_text(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
