"""`freetoken serve`: not available yet."""
import typer


def serve(ctx: typer.Context = None):
    """Not available yet."""
    typer.echo("freetoken serve is not available yet", err=True)
    raise typer.Exit(2)
