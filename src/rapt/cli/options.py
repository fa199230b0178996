"""The data and privacy options every command shares: one definition each,
so a flag reads the same and means the same in `tune`, `predict`, `privatize`, `sap`, `client`,
`data check`, `demo` and `attack`.

Use a constant as a parameter's default (``text_column: str | None = TEXT_COLUMN``); where a
command needs its own wording, :func:`with_help` gives a copy with another help text (the flag
names stay). Typer reads these objects without changing them, so one object serves many
commands."""

from __future__ import annotations

import copy

import typer

from rapt.cli._app import TARGET_EP_HELP, TARGET_P_HELP, TEXT_PAIR_OPT
from rapt.config import PRECISION_HELP
from rapt.privacy.kinds import BAND_EDGES
from rapt.privacy.rule import DEFAULT_MIN_P, DEFAULT_PROTECTED_P, DEFAULT_TARGET_P, MIN_P_HELP

FORMAT_HELP = ("file format if the extension does not tell: csv, tsv, jsonl, lines, "
               "label-text ('LABEL sentence'), text-at-label ('sentence@label'), trec, "
               "trustpilot (.txt files whose lines end in '@label' are read as text-at-label)")
NAMES_HELP = ("comma-separated label names, in id order; integer labels in the file are ids "
              "into them: 0-based, except that labels exactly 1..K for K names are read "
              "1-based (a note says so); labels all in 1..K-1 need --label-base")
BASE_HELP = "integer labels are 0-based or 1-based ids into --label-names (default: see there)"

# -- data ---------------------------------------------------------------------------------------
TEXT_COLUMN = typer.Option(None, "--text-column", help="text column/key of your file "
                           "(default: detected)")
TEXT_PAIR_COLUMN = TEXT_PAIR_OPT
LABEL_COLUMN = typer.Option(None, "--label-column", help="label column/key of your file "
                            "(default: 'label' when present)")
FORMAT = typer.Option(None, "--format", help=FORMAT_HELP)
LABEL_NAMES = typer.Option(None, "--label-names", help=NAMES_HELP)
LABEL_BASE = typer.Option(None, "--label-base", help=BASE_HELP)
LIMIT_HELP = ("use N examples: a random sample seeded by the command's --seed (0 without "
              "one; same seed, same rows), kept in file order; every record is still read and "
              "checked")
LIMIT = typer.Option(None, "--limit", help=LIMIT_HELP)

# -- privacy ------------------------------------------------------------------------------------
ETA = typer.Option(None, "--eta", help="privatize locally with this dχ-privacy parameter η "
                   "(smaller = more noise)")
TARGET_P = typer.Option(None, "--target-p", help=TARGET_P_HELP)
TARGET_EP = typer.Option(None, "--target-ep", help=TARGET_EP_HELP)
MIN_P = typer.Option(DEFAULT_MIN_P, "--min-p", min=0.0, max=1.0, help=MIN_P_HELP)
# Without a level, every command that sends or trains privatizes at DEFAULT_PROTECTED_P (its
# protected tokens; DEFAULT_TARGET_P under --protect all); clear text only when the user types
# this flag.
NO_PRIVACY_HELP = (f"use the text in clear, unprivatized (the default is P ≈ "
                   f"{DEFAULT_PROTECTED_P:g} on the protected tokens, {DEFAULT_TARGET_P:g} under "
                   "--protect all, when no --eta / --target-p / --target-ep is given)")
NO_PRIVACY = typer.Option(False, "--no-privacy", help=NO_PRIVACY_HELP)
NOISE_SEED = typer.Option(None, "--noise-seed", help="seed the privacy noise: tests and "
                          "benchmarks only, voids the guarantee (seeded: true); default: OS "
                          "entropy")

# -- noise by kind of token (rapt.privacy.by_kind): built by rapt.cli._by_kind.kind_policy ------
PROTECT_WHAT = ("which tokens get the full noise of η: all (every token: the uniform mechanism) "
                "| rare (personal data, and words outside the --frequent-rank N most frequent "
                "words of rapt's public word list) | personal (personal data that Presidio "
                "finds); the others (frequent words) pass in clear unless --other-p / "
                "--other-eta is given")
PROTECT_HELP = PROTECT_WHAT + (f" (default: rare: rare words at --target-p "
                               f"{DEFAULT_PROTECTED_P:g}, personal data and words outside the "
                               "10,000 most frequent at --personal-p 1 (--personal-rank "
                               "10000), frequent words in clear; all with --no-privacy)")
FREQUENT_RANK_HELP = ("with --protect rare: a word is rare when it is outside the N most frequent "
                      "words of rapt's public word list (never your data): 100 | 1000 | 10000")
OTHER_P_HELP = ("with --protect rare|personal: noise the unprotected tokens at the η that gives "
                "this P on rapt's public text sample (as --target-p), at most the protected P")
OTHER_ETA_HELP = ("with --protect rare|personal: noise the unprotected tokens at this η (at least "
                  "the protected η)")
PERSONAL_P_HELP = ("give personal data (Presidio's spans) a level of its own, at the η that "
                   "gives this P on rapt's public text sample, at least the protected P; 1: each "
                   "personal token is swapped for a random one before the noise (η 0: its "
                   "release does not depend on it); with any --protect (default: 1 under "
                   "--protect rare, the protected P otherwise)")
PERSONAL_ETA_HELP = ("personal data's η (at most the protected η; 0: its release does not "
                     "depend on it, as --personal-p 1)")
PERSONAL_RANK_HELP = ("give every word outside the N most frequent words of rapt's public word "
                      "list personal data's noise (--personal-p), as if Presidio had found it: "
                      "names it does not know are rare words; 1000 | 10000, at least "
                      "--frequent-rank; 0: off (default: 10000 under --protect rare, off "
                      "otherwise)")
# None: not given; rapt.cli._by_kind.with_defaults fills in the default (rare)
PROTECT = typer.Option(None, "--protect", help=PROTECT_HELP, show_default=False)
# by_kind.DEFAULT_FREQUENT_RANK (1000); that module imports torch, which `rapt --help` must not
FREQUENT_RANK = typer.Option(BAND_EDGES[1], "--frequent-rank", help=FREQUENT_RANK_HELP)
OTHER_P = typer.Option(None, "--other-p", help=OTHER_P_HELP)
OTHER_ETA = typer.Option(None, "--other-eta", help=OTHER_ETA_HELP)
PERSONAL_P = typer.Option(None, "--personal-p", help=PERSONAL_P_HELP)
PERSONAL_ETA = typer.Option(None, "--personal-eta", help=PERSONAL_ETA_HELP)
PERSONAL_RANK = typer.Option(None, "--personal-rank", help=PERSONAL_RANK_HELP)

# -- compute ------------------------------------------------------------------------------------
PRECISION = typer.Option(None, "--precision", help=PRECISION_HELP)


def protect_for_queries(default: str):
    """--protect of a command that privatizes a tuned prompt's queries: not given (None), the
    prompt's policy, which ``default`` names for the help."""
    return with_help(PROTECT, f"{PROTECT_WHAT} (default: {default})")


def with_help(option, help: str):
    """A copy of a shared option with another help text (same flags, same default)."""
    out = copy.copy(option)
    out.help = help
    return out


def with_default(option, default):
    """A copy of a shared option with another default (same flags, same help)."""
    out = copy.copy(option)
    out.default = default
    return out


def split_names(label_names: str | None) -> list[str] | None:
    """``--label-names a,b,c`` as a list (None when not given)."""
    return [s.strip() for s in label_names.split(",")] if label_names else None


def parse_label_descriptions(text: str, names: list[str]) -> tuple[list[str], bool]:
    """``--label-descriptions`` as one description per label, in label id order, and whether
    they were matched by name: ``NAME=description`` pairs separated by '|' (any order, each
    label once), or plain descriptions in label id order. ValueError naming the problem."""
    parts = [p.strip() for p in text.split("|")]
    keyed = [(k.strip(), v.strip()) for k, sep, v in (p.partition("=") for p in parts) if sep]
    named = [k for k, _ in keyed if k in names]
    unknown = [k for k, _ in keyed if k not in names and k and " " not in k]
    if unknown and len(keyed) == len(parts):
        raise ValueError(f"--label-descriptions: no label named {', '.join(map(repr, unknown))} "
                         f"(labels: {', '.join(names)})")
    if named and (len(named) < len(parts)):
        raise ValueError("--label-descriptions: give every description as NAME=description "
                         f"(labels: {', '.join(names)}), or none of them")
    if named:
        by_name: dict[str, str] = {}
        for k, v in keyed:
            if k in by_name:
                raise ValueError(f"--label-descriptions: label {k!r} is described twice")
            by_name[k] = v
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ValueError(f"--label-descriptions: no description for {', '.join(missing)} "
                             f"(labels: {', '.join(names)})")
        return [by_name[n] for n in names], True
    if len(parts) != len(names):
        raise ValueError(f"--label-descriptions: {len(parts)} given for {len(names)} labels "
                         f"({', '.join(names)}); write them as NAME=description|...")
    return parts, False
