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


def echo_data_notes(ds) -> None:
    """What the loader guessed about a dataset (format, label base, sentence-pair columns), one
    stderr note each, in the CLI's flag names."""
    from rapt.data import cli_message

    if ds.report.get("format_guessed"):
        typer.echo(f"note: {ds.source}: lines end in '@label', read as text-at-label "
                   "(pass --format lines for unlabelled text)", err=True)
    for note in ds.report.get("notes", []):
        typer.echo(f"note: {cli_message(note)}", err=True)


# Shared by every command that reads a user's file with sentence pairs.
TEXT_PAIR_OPT = typer.Option(
    None, "--text-pair-column", help="second text column/key of sentence pairs, privatized "
    "like the first (default: detected when both columns of sentence1/sentence2, "
    "premise/hypothesis, question1/question2 or question/sentence are present)")


def warn_if_seeded(noise_seed: int | None) -> None:
    """One stderr warning when a command's privacy noise is seeded (--noise-seed)."""
    if noise_seed is not None:
        typer.echo(f"warning: --noise-seed {noise_seed} makes the privacy noise reproducible by "
                   "anyone who knows it; such a run has no privacy guarantee (seeded: true). "
                   "Use it for tests and benchmarks only.", err=True)
