"""`freetoken verify [MODEL]`: recompute the checksum of every tensor of a converted model."""
from __future__ import annotations

from typing import Optional

import typer

from freetoken_cli.common import ModelArg, Progress, user_errors


@user_errors
def verify(model: Optional[str] = ModelArg):
    """Check every tensor of MODEL (as run takes it, or a name from `freetoken ls`) against its checksum."""
    from engine.resolve import ensure_ftw
    from ftw import FTWReader
    from freetoken_cli.models import size_text
    bar = Progress()
    try:
        reader = FTWReader(ensure_ftw(model, progress=lambda d, t: bar("convert", d, t)))
        names, done = reader.names(), 0
        total = sum(reader.info(n).nbytes for n in names)
        for name in names:
            reader.verify([name])  # FTWError naming the tensor on a mismatch
            done += reader.info(name).nbytes
            bar("verifying checksums", done, total)
    finally:
        bar.close()
    typer.echo(f"{reader.path}: {len(names)} tensors, {size_text(total)}, every checksum matches")
