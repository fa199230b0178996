"""The entry point: :func:`load_dataset` (open, read, check, map labels, report) and
:func:`columns_of`."""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Sequence
from pathlib import Path

from rapt.data.dataset import DataError, Dataset, Example, _label_counts
from rapt.data.formats import FORMATS, _csv_records, _lines, _read_text, _validated_rows, format_for
from rapt.data.labels import _check_label_spread
from rapt.data.sources import BUILTINS, _open, _Options, _seeded_split, _Source


def columns_of(name_or_path: str | Path, format: str | None = None) -> list[str] | None:
    """The column names (CSV/TSV header) or the first record's keys (JSONL) of a user's file;
    None for built-in names, line formats and files that cannot be read (loading them reports
    why)."""
    name = str(name_or_path)
    path = Path(name).expanduser()
    fmt = format or format_for(path)
    if name in BUILTINS or fmt not in ("csv", "tsv", "jsonl") or not path.is_file():
        return None
    try:
        text = _read_text(path)
        if fmt == "jsonl":
            first = next((s for _, s in _lines(text) if s.strip()), None)
            obj = json.loads(first) if first is not None else None
            return sorted(obj) if isinstance(obj, dict) else None
        delimiter = "," if fmt == "csv" else "\t"
        quoting = csv.QUOTE_MINIMAL if fmt == "csv" else csv.QUOTE_NONE
        for _, row in _csv_records(text, path, delimiter, quoting):
            if row and not (len(row) == 1 and not row[0].strip()):
                return [h.strip() for h in row]
    except (DataError, json.JSONDecodeError):
        return None
    return None


def limited(examples: list, limit: int | None, seed: int | None = 0) -> list:
    """``limit`` rows of ``examples``: a random sample seeded by ``seed``, in file order (the
    first ``limit`` with ``seed=None``). A sample, not the head: a file stored in label order
    (financial_phrasebank's splits) would otherwise give one class."""
    if limit is None or limit >= len(examples):
        return list(examples)
    if seed is None:
        return list(examples[:limit])
    keep = sorted(random.Random(seed).sample(range(len(examples)), limit))
    return [examples[i] for i in keep]


def _dataset(src: _Source, limit: int | None, limit_seed: int | None = 0) -> Dataset:
    """Read and check every record of ``src``, map the labels, and report (see load_dataset)."""
    lmap, spec = src.labels, src.spec
    rows, blank = _validated_rows(FORMATS[src.fmt], src.text, src.path, spec, lmap)
    ids = lmap.finalize([r[3] for r in rows])
    names = src.names if src.names is not None else list(lmap.names)
    if src.check_spread:
        _check_label_spread(src.fmt, ids, names, src.path)
    examples = [Example(text=t, label=i, text_pair=tp, attrs=attrs, line=line)
                for (line, t, tp, _raw, attrs), i in zip(rows, ids, strict=True)]
    read = len(examples)
    if not read:  # every command that reads a file stops here, not on an empty list later
        raise DataError("no rows in this file (it is empty, or holds only a header or blank "
                        "lines)", path=src.path)
    if src.seeded_splits:
        examples = _seeded_split(examples, src.seeded_splits, str(src.split))
    examples = limited(examples, limit, limit_seed)
    report = {
        "file": str(src.path),
        "format": src.shown_format or src.fmt,
        "split": src.split,
        "read": read,
        "kept": len(examples),
        "limit": limit,
        "limit_seed": limit_seed if limit is not None else None,
        "blank_lines": blank,
        "format_guessed": src.guessed,
        "label_base": lmap.base if lmap.fixed and lmap.allow_index else None,
        "notes": [lmap.note] if lmap.note else [],
        # the columns/keys the texts came from (None for line formats)
        "text_column": spec.used_text,
        "text_pair_column": spec.used_pair,
        "pair_detected": spec.pair_detected,
        **_label_counts(examples, names),
        # which field the labels came from (None when the records carry no labels)
        "label_source": (spec.label_column or FORMATS[src.fmt].default_label)
        if any(i is not None for i in ids) else None,
    }
    if spec.pair_detected:
        report["notes"].append(
            f"{src.path}: sentence pairs, first text from '{spec.used_text}', second from "
            f"'{spec.used_pair}' (detected; text_column= and text_pair_column= choose "
            "others)")
    return Dataset(name=src.display, examples=examples, label_names=list(names),
                   source=str(src.path), report=report)


# --------------------------------------------------------------------------- entry point


def load_dataset(
    name_or_path: str | Path,
    split: str = "train",
    *,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    label_column: str | None = None,
    label_names: Sequence[str] | None = None,
    attribute: str | None = None,
    limit: int | None = None,
    format: str | None = None,
    label_base: int | None = None,
    limit_seed: int | None = 0,
) -> Dataset:
    """Load a built-in dataset by name, or a user's file.

    Built-in names (``split`` picks the file): ``sst2`` (train/dev), ``sst2-sentences``
    (train/dev/test), ``financial_phrasebank`` (train/dev/test = 1,812 / 226 / 226, a
    fixed-seed split of ``Sentences_AllAgree.txt``; labels negative/neutral/positive),
    ``trec`` (train/test; labels ABBR, DESC, ENTY, HUM, LOC, NUM, the fine
    class in ``attrs["fine"]``), ``cb`` (train/val/test; ``text`` = premise, ``text_pair`` =
    hypothesis, labels entailment/contradiction/neutral; test is unlabelled) and
    ``trustpilot``: split ``a`` (alias ``train``) = ``www2015_a.csv``, ``b`` (alias ``test``)
    = ``www2015_b.csv``; label = rating - 1 (names "1".."5"); ``attrs`` carry rating, gender
    (1 = male), age (1 = born before 1960) and country. ``attribute="gender"|"age"`` makes that
    attribute the label (names female/male, born_1960_or_later/born_before_1960).

    A path is read in ``format`` (default from the extension: .csv, .tsv, .jsonl/.ndjson, .txt
    = one unlabelled text per line; also ``label-text`` (``LABEL sentence``),
    ``text-at-label`` (``sentence@label``), ``trec``, ``trustpilot``). A .txt file (or one with
    an unknown extension) whose non-blank lines at least 80 % end in ``@word`` is read as
    ``text-at-label`` (``report["format_guessed"]`` is then True). A ``label-text`` or
    ``text-at-label`` file with more distinct labels than half its lines (10 or more) is
    rejected: its format was almost surely wrong. CSV/TSV
    need a header. With neither ``text_column`` nor ``text_pair_column`` given, sentence pairs
    are detected from the columns/keys ``sentence1``/``sentence2``, ``premise``/``hypothesis``,
    ``question1``/``question2`` or ``question``/``sentence`` (both present; a note in
    ``report["notes"]`` names them); otherwise ``text_column`` defaults to ``text`` or
    ``sentence`` (or, given ``text_pair_column`` alone, to its partner in those pairs).
    ``report["text_column"]`` / ``["text_pair_column"]`` name the columns read.
    ``label_column`` defaults to ``label`` when present (else the examples are unlabelled,
    counted in the report).
    ``attribute`` on a file names a column to use as the label instead of ``label_column``
    (which then stays in ``attrs``). Label strings map to ids in sorted order (numeric when all
    are integers), or to their index in ``label_names``. Integers are accepted as ids into
    ``label_names``: 0-based, or 1-based with ``label_base=1``; by default (None) 1-based
    exactly when every label is an integer and they are 1..K for K names (recorded in
    ``report["notes"]``), an error when they all lie in 1..K-1 (either would fit), else 0-based.

    Texts are stripped of surrounding whitespace. CSV follows RFC 4180 quoting (quoted fields
    may span lines; ``Example.line`` is the record's first line); TSV is read as GLUE does, with
    no quote handling, so a tab can never appear inside a field.

    A folder written by Hugging Face ``save_to_disk``, or (where the network allows) a hub id
    ``owner/name`` or ``hf:ID[:CONFIG]``, is read with the optional ``datasets`` package
    (``rapt[hf]``): ``split`` picks the split (dev/validation/val are aliases), rows are checked
    as JSONL records ("line" = 1-based row), and a ``ClassLabel`` label column supplies the
    label names (its -1 = unlabelled).

    ``limit`` keeps ``limit`` records after reading and checking the whole file: a random
    sample seeded by ``limit_seed`` (default 0; same seed, same rows), in file order among the
    chosen rows; ``limit_seed=None`` keeps the first ``limit`` instead.
    Raises DataError naming file, line and problem for anything malformed, and for a file
    with no rows.
    """
    if limit is not None and limit < 0:
        raise DataError(f"limit must be >= 0, got {limit}")
    opts = _Options(text_column=text_column, text_pair_column=text_pair_column,
                    label_column=label_column, label_names=label_names, attribute=attribute,
                    format=format, label_base=label_base)
    return _dataset(_open(str(name_or_path), split, opts), limit, limit_seed)
