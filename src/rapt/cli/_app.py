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


def warn_if_seeded(noise_seed: int | None) -> None:
    """One stderr warning when a command's privacy noise is seeded (--noise-seed)."""
    if noise_seed is not None:
        typer.echo(f"warning: --noise-seed {noise_seed} makes the privacy noise reproducible by "
                   "anyone who knows it; such a run has no privacy guarantee (seeded: true). "
                   "Use it for tests and benchmarks only.", err=True)
