"""How data errors name load_dataset's keywords (the CLI rewrites them into its flags)."""

from __future__ import annotations


def _opt(name: str) -> str:
    """A load_dataset keyword as messages write it (``text_column=``); the CLI rewrites these
    into its flags (``rapt.cli._app.flag_words``)."""
    return f"{name}="
