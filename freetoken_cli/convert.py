"""`freetoken convert SRC OUT`: a HF checkpoint (directory or hub id) to FTW."""
from pathlib import Path
from typing import Optional

import typer

from freetoken_cli.common import Progress, check_writable, user_errors


@user_errors
def convert(src: str = typer.Argument(..., help="HuggingFace model directory or hub id"),
            out: Path = typer.Argument(..., help="output FTW directory"),
            dtype: str = typer.Option("auto", help="bf16 | fp16 | fp32 | auto (the checkpoint's dtype)"),
            quant: Optional[str] = typer.Option(None, help="quantize the routed experts: int4 | int8 | fp8 | mxfp4 "
                                                           "(from a bf16/fp16/fp32 checkpoint)"),
            group_size: Optional[int] = typer.Option(None, help="with --quant: values per scale along the input "
                                                                "(int4/int8 default 128; fp8: blocks of N x N, 128)"),
            force: bool = typer.Option(False, "--force", help="overwrite OUT if it exists")):
    """Convert a HuggingFace MoE checkpoint to the FTW format (no GPU needed)."""
    from engine.convert import convert as run_convert
    from engine.errors import UserError
    from engine.resolve import hf_source, is_ftw
    if out.exists() and not force:
        raise UserError(f"{out} already exists; pass --force to overwrite it")
    source = hf_source(src)
    if is_ftw(source):
        raise UserError(f"{src} is already converted (FTW); run it as it is, or convert its original checkpoint "
                        "with the options you want")
    check_writable(out, "OUT", make_parents=True)
    bar = Progress()
    try:
        run_convert(source, out, dtype, force, lambda d, t: bar("convert", d, t), quant, group_size)
    finally:
        bar.close()
    typer.echo(f"wrote {out}", err=True)
