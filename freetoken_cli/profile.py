"""`freetoken profile`: not available yet."""
import typer


def profile(ctx: typer.Context = None):
    """Not available yet."""
    typer.echo("freetoken profile is not available yet", err=True)
    raise typer.Exit(2)
