"""`rapt data check` (load a dataset, print counts) and `rapt data cti` (contributing tokens)."""

from __future__ import annotations

import json
import math

import typer

from rapt.cli._app import app, fail, flag_words, load_data_or_fail, sub_app
from rapt.cli.options import (
    FORMAT,
    LABEL_BASE,
    LABEL_COLUMN,
    LABEL_NAMES,
    TEXT_COLUMN,
    TEXT_PAIR_COLUMN,
    split_names,
)

data_app = sub_app(help="Inspect datasets: load checks and contributing tokens (CTI).",
                       no_args_is_help=True)
app.add_typer(data_app, name="data")


def _load(name: str, split: str, text_column: str | None, text_pair_column: str | None,
          label_column: str | None, label_names: str | None, attribute: str | None,
          limit: int | None, fmt: str | None, label_base: int | None = None):
    return load_data_or_fail(name, split, text_column=text_column,
                             text_pair_column=text_pair_column, label_column=label_column,
                             label_names=split_names(label_names), attribute=attribute,
                             limit=limit, fmt=fmt, label_base=label_base)


_NAME = typer.Argument(..., help="built-in name (sst2, sst2-sentences, trec, cb, trustpilot) "
                       "or a file path (.csv/.tsv with header, .jsonl, .txt)")
_SPLIT = typer.Option("train", "--split", "-s", help="split of a built-in dataset")
_TEXT = TEXT_COLUMN
_PAIR = TEXT_PAIR_COLUMN
_LABEL = LABEL_COLUMN
_NAMES = LABEL_NAMES
_BASE = LABEL_BASE
_ATTR = typer.Option(None, "--attribute", help="use a private attribute as label (gender, age)")
_LIMIT = typer.Option(None, "--limit", help="keep N records, a random sample (seed 0: the "
                      "same N every run) in file order (all are checked)")
_FORMAT = FORMAT


@data_app.command("check")
def check(
    name: str = _NAME,
    split: str = _SPLIT,
    text_column: str | None = _TEXT,
    text_pair_column: str | None = _PAIR,
    label_column: str | None = _LABEL,
    label_names: str | None = _NAMES,
    attribute: str | None = _ATTR,
    limit: int | None = _LIMIT,
    fmt: str | None = _FORMAT,
    label_base: int | None = _BASE,
    show: int = typer.Option(3, "--show", help="print the first N examples"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Load a dataset, validate every record and print the counts (exit 2 on bad input)."""
    ds = _load(name, split, text_column, text_pair_column, label_column, label_names,
               attribute, limit, fmt, label_base)
    r = ds.report
    if as_json:
        typer.echo(json.dumps({"name": ds.name, "label_names": ds.label_names, **r}, indent=2))
        return
    typer.echo(f"{ds.name}: {r['file']} ({r['format']})")
    typer.echo(f"  records read {r['read']}, kept {r['kept']}"
               + (f" (limit {r['limit']})" if r["limit"] is not None else "")
               + f", blank lines {r['blank_lines']}, unlabelled {r['unlabelled']}")
    if r["label_source"] is not None:
        typer.echo(f"  labels from '{r['label_source']}':")
        for label, n in r["per_label"].items():
            share = n / max(1, r["kept"])
            typer.echo(f"    {label:>24}  {n:>7}  {share:6.1%}")
    _echo_columns(ds)
    for e in ds.examples[:show]:
        label = ds.label_names[e.label] if e.label is not None else "-"
        text = e.text if len(e.text) <= 100 else e.text[:97] + "..."
        pair = f" || {e.text_pair[:60]}" if e.text_pair else ""
        typer.echo(f"  line {e.line}: [{label}] {text}{pair}")


def _echo_columns(ds) -> None:
    """A table's (or JSONL's) columns as read (text, pair, label) and the others, with the
    options that would read those that look like text or a label."""
    from rapt.data.columns import SAMPLE_ROWS, column_kinds, proposal

    r = ds.report
    if r.get("format") not in ("csv", "tsv", "jsonl") or not r.get("text_column"):
        return
    text, pair, label = r["text_column"], r.get("text_pair_column"), r.get("label_source")
    others = list(ds.examples[0].attrs) if ds.examples else []
    read = [f"text '{text}'"] + ([f"pair '{pair}'"] if pair else []) + (
        [f"label '{label}'"] if label else [])
    typer.echo(f"  columns read: {', '.join(read)}"
               + (f"; not read: {', '.join(repr(c) for c in others)}" if others else ""))
    rows = [[e.attrs.get(c, "") for c in others] for e in ds.examples[:SAMPLE_ROWS]]
    guess = proposal(column_kinds(others, rows), text=text, pair=pair, label=label)
    if guess:
        typer.echo(f"  of those not read, {flag_words(guess)}")


@data_app.command("cti")
def cti(
    name: str = _NAME,
    split: str = _SPLIT,
    backbone: str = typer.Option("minilm", "--backbone", "-b",
                                 help="backbone whose tokenizer defines the tokens"),
    coverage: float = typer.Option(0.01, "--coverage",
                                   help="max fraction of token occurrences (SAP: 0.01)"),
    k: int | None = typer.Option(None, "--k", help="fixed k instead of the coverage rule"),
    rule: str = typer.Option("uniform", "--rule",
                             help="uniform: one k for all classes (SAP's rule); per-class: each "
                                  "class fills the coverage budget (ours, not the paper's)"),
    smoothing: float = typer.Option(1.0, "--smoothing",
                                    help="α of the add-α estimate of p(token | class) (the "
                                         "paper gives none; smaller α ranks rare one-class "
                                         "tokens higher)"),
    top: int = typer.Option(15, "--top", help="tokens to print per class"),
    text_column: str | None = _TEXT,
    text_pair_column: str | None = _PAIR,
    label_column: str | None = _LABEL,
    label_names: str | None = _NAMES,
    attribute: str | None = _ATTR,
    limit: int | None = _LIMIT,
    fmt: str | None = _FORMAT,
    batch_size: int = typer.Option(1024, "--batch-size", help="texts per tokenizer call"),
) -> None:
    """Print the top contributing tokens per class (SAP utility importance)."""
    from rapt.data import DataError
    from rapt.privacy.cti import CTI_RULES, contributing_tokens

    if rule not in CTI_RULES:
        fail(f"--rule must be one of {', '.join(CTI_RULES)}, got {rule!r}")
    if not (math.isfinite(smoothing) and smoothing > 0):
        fail(f"--smoothing must be a positive number, got {smoothing!r}")
    ds = _load(name, split, text_column, text_pair_column, label_column, label_names,
               attribute, limit, fmt)
    try:
        labels = ds.labels
    except DataError as e:
        fail(f"CTI needs labels: {e}")
    if ds.num_labels < 2:
        fail(f"CTI needs at least 2 classes; {ds.name} has {ds.label_names}")
    tok, ids = _tokenize(ds, backbone, batch_size)
    special = set(tok.all_special_ids)
    res = contributing_tokens(ids, labels, num_classes=ds.num_labels, vocab_size=len(tok),
                              special_ids=special, coverage=coverage, k=k, rule=rule,
                              smoothing=smoothing)
    n_tok = int(res.counts.sum())
    typer.echo(f"{ds.name} ({split}): {len(ds)} examples, {n_tok} non-special tokens, "
               f"tokenizer '{backbone}'")
    how = ("fixed k" if k is not None else f"largest k with coverage <= {coverage:.2%}"
           if rule == "uniform" else f"per-class k filling coverage <= {coverage:.2%}")
    how += f", α = {smoothing:g}"
    ks = res.k if rule == "uniform" or k is not None else "/".join(map(str, res.k_per_class))
    typer.echo(f"k = {ks} ({how}): "
               f"{len(res.token_ids)} contributing tokens covering "
               f"{res.coverage:.3%} of token occurrences")
    if res.k == 0:
        typer.echo("  even the union of every class's top token exceeds the coverage budget; "
                   "use --k or a larger --coverage to inspect the ranking")
    _print_ranking(res, ds.label_names, tok, max(top, 0))


def _tokenize(ds, backbone: str, batch_size: int):
    """(tokenizer of ``backbone``, token ids of every example with its text pair)."""
    from transformers import AutoTokenizer

    from rapt.models import BackboneNotFoundError, resolve, text_as_text
    from rapt.progress import progress_bar

    try:
        source, gguf_file, _ = resolve(backbone)
        tok = text_as_text(AutoTokenizer.from_pretrained(
            source, **({"gguf_file": gguf_file} if gguf_file else {})))
    except (BackboneNotFoundError, OSError) as e:
        fail(f"cannot load the tokenizer of '{backbone}': {e}")
    ids: list[list[int]] = []
    pairs = ds.text_pairs
    for i in progress_bar(range(0, len(ds), batch_size), desc="tokenizing", unit="batch"):
        texts = ds.texts[i:i + batch_size]
        second = pairs[i:i + batch_size] if pairs[i] is not None else None
        # verbose=False: long reviews exceed the model's max length; CTI counts every token.
        enc = tok(texts, second, verbose=False) if second else tok(texts, verbose=False)
        ids += enc["input_ids"]
    return tok, ids


def _print_ranking(res, label_names: list[str], tok, shown: int) -> None:
    """Each class's ``shown`` best tokens by UI, contributing ones starred."""
    for c, cname in enumerate(label_names):
        best = [t for t in res.ranking[c, :shown].tolist() if t >= 0]
        typer.echo(f"class {cname}:")
        for rank, t in enumerate(best, start=1):
            mark = "*" if t in res.per_class[c] else " "
            n_c = int(res.counts[c, t])
            n_other = int(res.counts[:, t].sum()) - n_c
            typer.echo(f"  {mark}{rank:>3} {tok.convert_ids_to_tokens(t):>16}  "
                       f"UI {float(res.scores[c, t]):7.3f}  in class {n_c:>6}  "
                       f"elsewhere {n_other:>6}")
    typer.echo("(* = contributing token)")
