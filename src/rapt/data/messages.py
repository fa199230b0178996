"""How data errors name load_dataset's keywords, and their rewrite into the CLI's flags."""

from __future__ import annotations

import re


def _opt(name: str) -> str:
    """A load_dataset keyword as messages write it (``text_column=``); the CLI rewrites these
    into its flags with :func:`cli_message`."""
    return f"{name}="


_CLI_FLAGS = ("text_column", "text_pair_column", "label_column", "label_names", "label_base",
              "format", "attribute", "limit")


def cli_message(msg: str) -> str:
    """``msg`` with load_dataset's keywords (``text_column=``, ``label_column``) written as the
    CLI's flags (``--text-column``, ``--label-column``)."""
    words = "|".join(_CLI_FLAGS)
    # name='value' and name=value -> --name value; a bare name= -> --name
    msg = re.sub(rf"(?<![-\w])({words})=(?:'([^'\s]+)'|(\S?))",
                 lambda m: "--" + m.group(1).replace("_", "-")
                 + (" " + (m.group(2) or m.group(3)) if m.group(2) or m.group(3) else ""), msg)
    cols = "|".join(w for w in _CLI_FLAGS if "_" in w)
    return re.sub(rf"(?<![-\w])({cols})(?![\w=])",
                  lambda m: "--" + m.group(1).replace("_", "-"), msg)
