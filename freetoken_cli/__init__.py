"""FreeToken command-line interface (Typer): thin commands that parse options, build a config,
call one engine function and print. Heavy imports happen inside the commands."""
