"""The `freetoken` command: convert, profile, run, serve, bench, and the converted-model cache
(ls, rm, verify)."""
import typer

from freetoken_cli import bench, convert, models, profile, run, serve, verify

app = typer.Typer(help="FreeToken: run Mixture-of-Experts models whose experts do not fit in GPU memory.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version
        typer.echo(f"freetoken {version('freetoken')}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=show_version, is_eager=True,
                                      help="print the version and exit")) -> None:
    pass


app.command("convert")(convert.convert)
app.command("profile")(profile.profile)
app.command("run")(run.run)
app.command("serve")(serve.serve)
app.command("ls")(models.ls)
app.command("rm")(models.rm)
app.command("verify")(verify.verify)
app.add_typer(bench.app, name="bench")

if __name__ == "__main__":
    app()
