"""The `rapt` command as a click command, for the documentation site's CLI reference.

`mkdocs-click` reads ``command`` (docs/reference/cli.md), so every option's help is written once,
in the typer parameters, and `rapt --help` and the site agree.
"""

import typer

import rapt.cli  # noqa: F401  (registers every command group on `app`)
from rapt.cli._app import app

command = typer.main.get_command(app)
