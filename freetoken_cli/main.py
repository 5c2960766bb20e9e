"""The `freetoken` command: convert, profile, run, serve, bench."""
import typer

from freetoken_cli import bench, convert, profile, run, serve

app = typer.Typer(help="FreeToken: run Mixture-of-Experts models whose experts do not fit in GPU memory.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
app.command("convert")(convert.convert)
app.command("profile")(profile.profile)
app.command("run")(run.run)
app.command("serve")(serve.serve)
app.add_typer(bench.app, name="bench")

if __name__ == "__main__":
    app()
