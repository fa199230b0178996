"""The one Typer application; each CLI module adds its commands to it."""

import re
from typing import Any, NoReturn

import typer

# Plain click help: rich markup would eat "[unused]" and the like as style tags, and rich's
# option tables cut long option names ("--num-virtual-toke…") on 80-column terminals. Help is
# laid out up to 120 columns, never wider than the terminal.
TYPER_SETTINGS: dict[str, Any] = {
    "rich_markup_mode": None,
    "context_settings": {"max_content_width": 120},
}

app = typer.Typer(
    name="rapt",
    help="Privacy-preserving customization of hosted language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    **TYPER_SETTINGS,
)


def sub_app(**kwargs: Any) -> typer.Typer:
    """A command group with the application's help settings."""
    return typer.Typer(**TYPER_SETTINGS, **kwargs)


@app.callback()
def _root() -> None:
    """Privacy-preserving customization of hosted language models."""


@app.command()
def version() -> None:
    """Print the rapt version."""
    from rapt import __version__

    typer.echo(__version__)


# Shared help texts of the privacy options: one calibration for every command.
TARGET_P_HELP = ("instead of --eta: the η that gives this replacement probability P (0 < P < "
                 "1) on rapt's bundled public text sample, never on your data; the same "
                 "--target-p gives the same η in every command for one backbone")
TARGET_EP_HELP = ("instead of --eta / --target-p: the largest η at which the best of the "
                  "attackers of rapt's shipped attack table (measured on public text) recovers "
                  "at most 1 − X of the tokens, i.e. empirical privacy ≥ X (0 < X < 1; an "
                  "upper bound on privacy: a stronger attacker may recover more); the table "
                  "holds the backbones minilm and smollm2-135m")


# rapt.data.load_dataset's keywords, which its messages write as ``name=``: every command that
# reads a file has these flags, whatever its own parameter is called (``fmt`` is --format).
_DATA_FLAGS = ("text_column", "text_pair_column", "label_column", "label_names", "label_base",
               "format", "attribute", "limit")


def _data_flags(msg: str) -> str:
    """``msg`` with load_dataset's keywords written as flags: ``name='value'`` and
    ``name=value`` → ``--name value``, a bare ``name=`` → ``--name``, and the column keywords
    also bare (``label_column`` → ``--label-column``) outside paths and file names."""
    words = "|".join(_DATA_FLAGS)
    msg = re.sub(rf"(?<![-\w])({words})=(?:'([^'\s]+)'|(\S?))",
                 lambda m: "--" + m.group(1).replace("_", "-")
                 + (" " + (m.group(2) or m.group(3)) if m.group(2) or m.group(3) else ""), msg)
    cols = "|".join(w for w in _DATA_FLAGS if "_" in w)
    return re.sub(rf"(?<![-\w./\\])({cols})(?![\w=/-]|\.\w)",  # not in a path
                  lambda m: "--" + m.group(1).replace("_", "-"), msg)


def flag_words(msg: str) -> str:
    """``msg`` with the parameter names of the Python API written as the command line's flags
    (the one rewriter of the CLI's messages): load_dataset's keywords always, then the running
    command's parameters: ``TuneConfig.lr`` → ``--lr``, ``no_privacy=True`` →
    ``--no-privacy``, ``head='verbalizer'`` → ``--head verbalizer``, ``label_words`` →
    ``--label-words`` (bare names only when they hold an underscore)."""
    msg = _data_flags(msg)
    ctx = _current_context()
    if ctx is None:
        return msg
    flags = {}
    for p in ctx.command.params:
        longs = [o for o in getattr(p, "opts", []) if o.startswith("--")]
        if getattr(p, "param_type_name", "") == "option" and longs and p.name:
            flags[p.name] = longs[0]
    for name in sorted(flags, key=len, reverse=True):
        flag = flags[name]
        msg = re.sub(rf"\b[A-Z]\w*Config\.{name}(?==)", name, msg)
        msg = re.sub(rf"\b[A-Z]\w*Config\.{name}\b", flag, msg)
        msg = re.sub(rf"(?<![-\w.]){name}=True\b", flag, msg)
        msg = re.sub(rf"(?<![-\w.]){name}=(?:'([^'\s]*)'|\"([^\"\s]*)\"|([^\s,;)'\"]+))",
                     lambda m, f=flag: f"{f} {m.group(1) or m.group(2) or m.group(3)}", msg)
        msg = re.sub(rf"(?<![-\w.]){name}=", flag, msg)
        if "_" in name:  # not inside a path or file name ("/tmp/text_column.csv")
            msg = re.sub(rf"(?<![-\w./\\]){name}(?![\w/-]|\.\w)", flag, msg)
    return msg


def _current_context() -> Any:
    """The running command's click context (typer vendors its own copy of click)."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:  # an older typer on the real click
        from click import get_current_context
    return get_current_context(silent=True)


def fail(msg: str) -> NoReturn:
    """Print one clear error line for a problem the user caused and exit with status 2."""
    typer.echo(f"error: {flag_words(msg)}", err=True)
    raise typer.Exit(2)


def load_backbone_or_fail(name: str, *, embeddings_only: bool = False):
    """``rapt.models.load_backbone(name)`` (``load_embeddings`` with ``embeddings_only``: the
    tokenizer and embedding matrix, no model), or one clear error line (unknown name,
    unreadable folder, a package that is not installed) and exit status 2."""
    from rapt.models import BackboneNotFoundError, load_backbone, load_embeddings
    from rapt.progress import quiet_library_bars

    quiet_library_bars()  # transformers' "Loading weights" bar would flood a log file
    try:
        return load_embeddings(name) if embeddings_only else load_backbone(name)
    except (BackboneNotFoundError, OSError, ValueError) as e:
        fail(str(e))


def load_data_or_fail(data: str, split: str = "train", *, limit: int | None = None,
                      text_column: str | None = None, label_column: str | None = None,
                      attribute: str | None = None, label_names: list[str] | None = None,
                      fmt: str | None = None, label_base: int | None = None,
                      text_pair_column: str | None = None, limit_seed: int = 0):
    """``rapt.data.load_dataset`` with the shared data options, its notes on stderr; a bad
    file is one error line naming file, line and field (exit 2). ``limit``: a random sample
    seeded by ``limit_seed`` (the command's --seed), in file order."""
    from rapt.data import DataError, load_dataset

    try:
        ds = load_dataset(data, split, text_column=text_column, label_column=label_column,
                          attribute=attribute, limit=limit, label_names=label_names,
                          format=fmt, label_base=label_base, text_pair_column=text_pair_column,
                          limit_seed=limit_seed)
    except (DataError, FileNotFoundError) as e:
        fail(str(e))
    echo_data_notes(ds)
    return ds


def echo_data_notes(ds) -> None:
    """What the loader guessed about a dataset (format, label base, sentence-pair columns), one
    stderr note each, in the CLI's flag names."""
    if ds.report.get("format_guessed"):
        typer.echo(f"note: {ds.source}: lines end in '@label', read as text-at-label "
                   "(pass --format lines for unlabelled text)", err=True)
    for note in ds.report.get("notes", []):
        typer.echo(f"note: {flag_words(note)}", err=True)


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


def check_eta_options(eta: float | None, target_p: float | None,
                      target_ep: float | None = None) -> None:
    """Bad --eta / --target-p / --target-ep values, or more than one given, are user errors
    (exit 2); cheap, so a command can check them before it loads anything."""
    from rapt.config import eta_problem

    given = [f for f, v in (("--eta", eta), ("--target-p", target_p), ("--target-ep", target_ep))
             if v is not None]
    if len(given) == 2:
        fail(f"give {given[0]} or {given[1]}, not both")
    if len(given) > 2:
        fail("give only one of --eta, --target-p and --target-ep")
    if target_p is not None and not 0 < target_p < 1:
        fail(f"--target-p must lie strictly between 0 and 1 (got {target_p})")
    if target_ep is not None and not 0 < target_ep < 1:
        fail(f"--target-ep must lie strictly between 0 and 1 (got {target_ep})")
    if eta is not None and eta_problem(eta):
        fail(f"--eta {eta_problem(eta)}")


def privacy_level(eta: float | None, target_p: float | None, target_ep: float | None,
                  no_privacy: bool, *, clear: str | None,
                  can_be_clear: bool = True, protect: str | None = None) -> float | None:
    """The --target-p of a command that sends or trains: ``target_p`` as given; without any
    level :data:`rapt.privacy.rule.DEFAULT_TARGET_P` (``protect`` all or None), announced on
    stderr; None with --no-privacy, announced as the warning ``--no-privacy: {clear}`` (None:
    the caller announces it; with a level too: exit 2). Clear text is never a default
    (``can_be_clear``: whether the command has --no-privacy at all, for the default's line).
    With ``protect`` rare or personal the default is the protected classes'
    :data:`rapt.privacy.rule.DEFAULT_PROTECTED_P`."""
    from rapt.privacy.rule import DEFAULT_PROTECTED_P, DEFAULT_TARGET_P

    check_eta_options(eta, target_p, target_ep)
    given = eta is not None or target_p is not None or target_ep is not None
    if no_privacy:
        if given:
            fail("--no-privacy uses the text in clear: give it or a level (--eta, --target-p, "
                 "--target-ep), not both")
        if clear is not None:
            typer.echo(f"warning: --no-privacy: {clear}", err=True)
        return None
    if not given:
        by_kind = protect not in (None, "all")
        level = DEFAULT_PROTECTED_P if by_kind else DEFAULT_TARGET_P
        what = "the protected tokens' default level" if by_kind else "the default level"
        typer.echo(f"privacy: {what}, P ≈ {level:g} (--target-p {level:g})"
                   + ("; --no-privacy for clear text" if can_be_clear else ""), err=True)
        return level
    return target_p


def eta_for_target_ep(backbone: str, target_ep: float, *, err: bool = True) -> float:
    """The η of ``--target-ep`` through the shipped attack table (no model needed: the table is
    keyed by the backbone's name), with one line saying so; one error line and exit 2 when the
    table cannot give it (another backbone, a target out of its range)."""
    from rapt.privacy.attack_table import EP_MEANING, AttackTableError
    from rapt.privacy.attack_table import eta_for_target_ep as from_table

    try:
        eta = from_table(backbone, target_ep)
    except AttackTableError as e:
        fail(f"--target-ep {target_ep:g}: {e}")
    from rapt.numfmt import eta as eta_text

    typer.echo(f"η = {eta_text(eta)} for empirical privacy ≥ {target_ep:g} ({EP_MEANING}, by "
               "rapt's attack table: shipped table, public text)", err=err)
    return eta


def resolve_eta(bb: Any, eta: float | None, target_p: float | None,
                target_ep: float | None = None) -> tuple[float | None, bool]:
    """(η, calibrated): ``eta`` as given, the η calibrated for ``target_p`` on rapt's public
    text sample (the same call everywhere, so the same P gives the same η), or the η of
    ``target_ep`` from the shipped attack table; (None, False) when none is given. Bad values
    are refused by :func:`check_eta_options`."""
    check_eta_options(eta, target_p, target_ep)
    if target_ep is not None:
        return eta_for_target_ep(bb.name, target_ep), True
    if target_p is not None:
        from rapt.privacy.mechanism import calibrate_eta_public

        return calibrate_eta_public(bb, target_p), True
    return eta, False


def echo_privacy(report: dict, *, backbone: str, err: bool = False, prefix: str = "",
                 suffix: str = "", min_p: float | None = None, what: str = "release") -> None:
    """The privacy line of a release (η, measured P, nearest-neighbour inversion success),
    between ``prefix`` and ``suffix`` (e.g. what was sent; where η came from), under it the
    shipped attack table's strongest attacker at this backbone and η, and the weak-privacy
    warning of :mod:`rapt.privacy.rule` (threshold ``min_p``, default its own)."""
    from rapt.privacy.mechanism import privacy_line

    typer.echo(prefix + privacy_line(report) + suffix, err=err)
    # Noise by kind: the table measured uniform noise, which this release gives its protected
    # tokens only (its all-token figure is the privacy line's, above)
    echo_table_line(backbone, report.get("eta"), err=err,
                    prefix="protected tokens (the table's figure is uniform noise at their η): "
                    if report.get("protected_kinds") else "")
    warn_weak_privacy(report, backbone=backbone, min_p=min_p, what=what)


def warn_weak_privacy(report: dict | None, *, backbone: str, min_p: float | None = None,
                      what: str = "release", eta: float | None = None) -> bool:
    """One stderr warning when :func:`rapt.privacy.rule.judge` flags the release as weak (the
    same rule in every command); -> whether it did."""
    from rapt.privacy.rule import DEFAULT_MIN_P, weak_privacy_warning

    msg = weak_privacy_warning(report, backbone=backbone, eta=eta, what=what,
                               min_p=DEFAULT_MIN_P if min_p is None else min_p)
    if msg is not None:
        typer.echo(f"warning: {msg}", err=True)
    return msg is not None


def echo_table_line(backbone: str, eta: float | None, *, err: bool = False,
                    prefix: str = "") -> None:
    """The strongest attacker's recovery at (backbone, η) by the shipped attack table
    (:func:`rapt.privacy.attack_table.table_line`); nothing without η."""
    if eta is None:
        return
    from rapt.privacy.attack_table import table_line

    typer.echo(prefix + table_line(backbone, float(eta)), err=err)


def check_out_or_fail(out) -> None:
    """A prediction file's suffix must name its format (.jsonl / .csv): checked before work."""
    if out is None:
        return
    from rapt.predictions import check_out_path

    try:
        check_out_path(out)
    except ValueError as e:
        fail(str(e))


def echo_predictions(preds, out, *, eta: float | None = None, fixes: str | None = None) -> None:
    """The one prediction output of `predict`, `sap predict` and `client predict`
    (:mod:`rapt.predictions`): every row to ``out`` (JSONL/CSV by suffix) when given, else a
    summary and the first rows; accuracy and the confusion table when the input has labels.
    ``fixes``: what to try should they look collapsed (:func:`collapse_fixes` of the run)."""
    if out is not None:
        from rapt.predictions import write_predictions

        fmt = write_predictions(out, preds)
        typer.echo(f"wrote {len(preds)} predictions to {out} ({fmt})")
    for line in preds.report_lines(show_rows=out is None, eta=eta):
        typer.echo(line)
    warn_collapse(preds.pred, preds.gold, preds.names, when="these predictions",
                  fixes=fixes or collapse_fixes(method=None, private=eta is not None,
                                                retune=True))


def collapse_fixes(*, method: str | None, private: bool, dp: bool = False,
                   retune: bool = False, extra: tuple[str, ...] = ()) -> str:
    """What to try after a collapsed run, fitted to it: a lower privacy level only when it
    was privatized (a larger ε only under DP), another method than the one it used (None:
    unknown), then ``extra``; ``retune``: phrased for predictions of a tuned model."""
    tries = ["more epochs (--epochs)"]
    if private or dp:
        lower = (["a smaller --target-p"] if private else []) + (
            ["a larger --dp-epsilon"] if dp else [])
        tries.append(f"a lower privacy level ({', or '.join(lower)})")
    if method == "lora":
        tries.append("--method prefix (ahead of LoRA on 250 sentence pairs, 2 settings of "
                     "benchmarks/results/defaults.md)")
    elif method is not None:
        tries.append("--method lora (the most accurate in 5 of 8 settings of "
                     "benchmarks/results/defaults.md)")
    else:
        tries.append("another --method")
    tries += list(extra)
    text = ", ".join(tries[:-1]) + " or " + tries[-1]
    return f"if the model collapsed in training too, tune it again with {text}" if retune else text


def warn_collapse(pred, gold, names, *, when: str, fixes: str) -> bool:
    """Stderr warnings when predictions are near-constant or no better than the majority class
    (:func:`rapt.stats.collapse_warnings`), and what to change; -> whether it warned."""
    from rapt.stats import collapse_warnings

    return echo_collapse(collapse_warnings(pred, gold, names), when=when, fixes=fixes)


def echo_collapse(msgs: list[str], *, when: str, fixes: str) -> bool:
    """Stderr: each collapse warning in ``msgs``, then what to change; -> whether it warned."""
    for m in msgs:
        typer.echo(f"warning: {when}: {m}", err=True)
    if msgs:
        typer.echo(f"  what to try: {fixes}", err=True)
    return bool(msgs)


def no_loading_bars() -> None:
    """Silence transformers' "Loading weights" bar: the client and the service load a backbone
    as a detail of their work, and the bar would sit among their own lines (or flood a log)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a dependency
        return
    hf_logging.disable_progress_bar()
