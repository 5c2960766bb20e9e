"""`freetoken bench quality MODEL --reference REF`: teacher-forced KL, top-1 agreement and
perplexity of a model against a reference (e.g. a quantized conversion against the bf16 one)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from freetoken_cli.common import ModelArg, engine_config, user_errors


@user_errors
def quality(model: Optional[str] = ModelArg,
            reference: str = typer.Option(..., help="the model compared with: FTW directory, HuggingFace directory "
                                                    "or hub id (e.g. the bf16 release of MODEL)"),
            text: Optional[Path] = typer.Option(None, help="text to score (default: held-out Python standard-library "
                                                           "source shipped with the demo model)"),
            tokens: int = typer.Option(2048, help="tokens of the text scored (in windows of the model's context)"),
            device: str = typer.Option("auto", help="cuda | cpu | auto"),
            as_json: bool = typer.Option(False, "--json", help="print one JSON object")):
    """Mean KL(REF || MODEL), top-1 agreement, perplexity of both, and the expert bytes of both."""
    from engine.bench.quality import HELDOUT, quality as run
    from engine.errors import UserError
    path = text or HELDOUT
    if not path.is_file():
        raise UserError(f"--text {path} is not a readable file")
    if tokens < 2:
        raise UserError("--tokens must be at least 2")
    cfg = engine_config(model, device, "auto", "fetch", None, tokens)
    res = run(model, reference, cfg, path.read_text(errors="replace"), tokens)
    if as_json:
        typer.echo(json.dumps(res))
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"{res['tokens']} tokens of {path.name}")
    for col in ("", "format", "perplexity", "expert MiB"):
        t.add_column(col, justify="left" if not col else "right")
    for label, key in (("model", ""), ("reference", "_ref")):
        t.add_row(label, res["format" + key], f"{res['ppl' + key]:.3f}", f"{res['expert_bytes' + key] / 2**20:,.1f}")
    con = Console()
    con.print(t)
    con.print(f"mean KL(reference || model) {res['kl_mean']:.4f} nats per token, "
              f"top-1 agreement {res['top1_agree']:.1%}")
