"""The one Typer application; each CLI module adds its commands to it."""

from typing import NoReturn

import typer

app = typer.Typer(
    name="rapt",
    help="Privacy-preserving customization of hosted language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Privacy-preserving customization of hosted language models."""


@app.command()
def version() -> None:
    """Print the rapt version."""
    from rapt import __version__

    typer.echo(__version__)


def fail(msg: str) -> NoReturn:
    """Print one clear error line for a problem the user caused and exit with status 2."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)
