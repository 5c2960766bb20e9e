"""`freetoken bench`: not available yet."""
import typer


def bench(ctx: typer.Context = None):
    """Not available yet."""
    typer.echo("freetoken bench is not available yet", err=True)
    raise typer.Exit(2)
