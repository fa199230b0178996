"""Where records come from: the built-in datasets under :func:`data_dir`, a Hugging Face
dataset, or a user's file; each opener gives the text, its format and how to read its labels."""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rapt.data.dataset import DataError, Example
from rapt.data.formats import (
    FORMATS,
    TREC_COARSE,
    TRUSTPILOT_ATTRIBUTES,
    ReadSpec,
    _read_text,
    format_for,
)
from rapt.data.labels import _LabelMap
from rapt.data.messages import _opt

# --------------------------------------------------------------------------- data folder


def data_dir() -> Path:
    """The folder holding the built-in datasets.

    ``$RAPT_DATA_DIR`` when set; otherwise the first ``shared/data`` folder found walking up
    from the current directory, then from this package's location (the repository sits next
    to ``shared/``, so ``<repo>/../shared/data`` is found either way).
    """
    env = os.environ.get("RAPT_DATA_DIR")
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise DataError(f"$RAPT_DATA_DIR points to {p}, which is not a folder")
        return p
    tried = []
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for d in (start, *start.parents):
            cand = d / "shared" / "data"
            if cand.is_dir():
                return cand
        tried.append(str(start))
    raise DataError(
        "no data folder: $RAPT_DATA_DIR is not set and no shared/data folder was found above "
        + " or ".join(tried) + "; set RAPT_DATA_DIR or pass a file path"
    )


# A Hugging Face hub id: owner/name, or hf:ID[:CONFIG] for any id (hf:imdb, hf:nyu-mll/glue:sst2).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+|hf:[\w./-]+(:[\w.-]+)?")
_HF_SPLITS = {"dev": ("validation", "dev", "val"), "validation": ("validation", "dev", "val"),
              "val": ("validation", "dev", "val"), "test": ("test",), "train": ("train",)}


@dataclass
class _HFRecords:
    jsonl: str  # one JSON object per row: rows go through the JSONL parser's checks
    class_names: dict[str, list[str]]  # ClassLabel columns -> their class names


def _hf_records(name: str, path: Path, split: str) -> _HFRecords | None:
    """A Hugging Face dataset as JSONL text, or None when ``name`` is neither a folder written by
    ``save_to_disk`` nor (when no such file exists) a hub id. Needs the optional ``datasets``
    package (``pip install rapt[hf]``); rows are then checked like a user's JSONL file, with
    "line" = 1-based row number."""
    saved = path.is_dir() and any((path / f).exists() for f in
                                  ("dataset_info.json", "dataset_dict.json", "state.json"))
    hub = not path.exists() and bool(_HUB_ID.fullmatch(name))
    if not (saved or hub):
        return None
    try:
        import datasets
    except ImportError:
        raise DataError("reading a Hugging Face dataset needs the 'datasets' package: "
                        "pip install 'rapt[hf]'", path=path) from None
    try:
        if saved:
            ds = datasets.load_from_disk(str(path))
        else:
            hub_id, _, config = name.removeprefix("hf:").partition(":")
            ds = datasets.load_dataset(hub_id, config or None)
    except Exception as e:  # the library raises many types (network, format, missing config)
        raise DataError(f"cannot load this Hugging Face dataset: {type(e).__name__}: {e}",
                        path=path) from None
    if isinstance(ds, datasets.DatasetDict):
        have = list(ds)
        pick = next((s for s in _HF_SPLITS.get(split, (split,)) if s in ds), None)
        if pick is None:
            raise DataError(f"no split '{split}' (splits: {have})", path=path)
        ds = ds[pick]
    class_names = {c: list(f.names) for c, f in ds.features.items()
                   if isinstance(f, datasets.ClassLabel)}
    lines = []
    for row in ds:
        # ClassLabel -1 is the hub's "no label" (e.g. GLUE test splits).
        row = {k: (None if k in class_names and v == -1 else v) for k, v in row.items()}
        lines.append(json.dumps(row, ensure_ascii=False, default=str))
    return _HFRecords("\n".join(lines) + "\n", class_names)


# --------------------------------------------------------------------------- built-ins


@dataclass(frozen=True)
class _Builtin:
    folder: str
    files: dict[str, str]  # split -> file name
    format: str
    label_names: tuple[str, ...]
    raw_labels: tuple[str, ...]  # raw value in the file for each label id
    unlabelled_splits: tuple[str, ...] = ()
    columns: tuple[str | None, str | None, str | None] = (None, None, None)  # text, pair, label
    # One file cut into named splits by a fixed-seed shuffle: ((split, size), ...); the last
    # split named with size None takes the rest.
    seeded_splits: tuple[tuple[str, int | None], ...] = ()
    # One sentence per label for the frozen label-description head (rapt.tuning.heads); () = none.
    descriptions: tuple[str, ...] = ()


BUILTINS: dict[str, _Builtin] = {
    "sst2": _Builtin("sst2", {"train": "train.tsv", "dev": "dev.tsv"}, "tsv",
                     ("negative", "positive"), ("0", "1"), columns=("sentence", None, "label"),
                     descriptions=("a negative review", "a positive review")),
    "sst2-sentences": _Builtin(
        "sst2", {"train": "stsa.binary.train", "dev": "stsa.binary.dev",
                 "test": "stsa.binary.test"}, "label-text",
        ("negative", "positive"), ("0", "1"),
        descriptions=("a negative review", "a positive review")),
    "trec": _Builtin("trec", {"train": "train.txt", "test": "test.txt"}, "trec",
                     tuple(TREC_COARSE), tuple(TREC_COARSE)),
    "cb": _Builtin("cb", {"train": "train.jsonl", "val": "val.jsonl", "test": "test.jsonl"},
                   "jsonl", ("entailment", "contradiction", "neutral"),
                   ("entailment", "contradiction", "neutral"), unlabelled_splits=("test",),
                   columns=("premise", "hypothesis", "label")),
    "trustpilot": _Builtin(
        "trustpilot", {"a": "www2015_a.csv", "b": "www2015_b.csv"}, "trustpilot",
        ("1", "2", "3", "4", "5"), ("1", "2", "3", "4", "5"),
        descriptions=tuple(f"a {n}-star review" for n in ("one", "two", "three", "four",
                                                           "five"))),
    # SAP (Shen et al. 2023) Table 1: 1,808 / 226 / 226. The file has 2,264 sentences; test and
    # dev get the paper's sizes, train the rest (1,812).
    "financial_phrasebank": _Builtin(
        "financial_phrasebank", {"all": "Sentences_AllAgree.txt"}, "text-at-label",
        ("negative", "neutral", "positive"), ("negative", "neutral", "positive"),
        seeded_splits=(("test", 226), ("dev", 226), ("train", None)),
        descriptions=("negative financial news", "neutral financial news",
                      "positive financial news")),
}
SEEDED_SPLIT_SEED = 0  # fixed: the split is part of the benchmark's definition


def label_descriptions_for(name: str) -> list[str] | None:
    """The built-in dataset ``name``'s label descriptions (one per label, for the frozen
    label-description head), or None for files and built-ins without them."""
    b = BUILTINS.get(str(name))
    return list(b.descriptions) if b is not None and b.descriptions else None
_SPLIT_ALIASES = {"validation": ["dev", "val"], "dev": ["val"], "val": ["dev"],
                  "train": ["a"], "test": ["b"]}


def _builtin_file(name: str, b: _Builtin, split: str) -> tuple[Path, str]:
    if b.seeded_splits:
        names = [n for n, _ in b.seeded_splits]
        want = next((s for s in [split, *_SPLIT_ALIASES.get(split, [])] if s in names), None)
        if want is None:
            raise DataError(f"dataset '{name}' has no split '{split}'; splits: {sorted(names)}")
        path = data_dir() / b.folder / next(iter(b.files.values()))
        if not path.is_file():
            raise DataError(f"built-in dataset '{name}' needs this file, which is missing "
                            "(set RAPT_DATA_DIR to the data folder)", path=path)
        return path, want
    for s in [split, *_SPLIT_ALIASES.get(split, [])]:
        if s in b.files:
            path = data_dir() / b.folder / b.files[s]
            if not path.is_file():
                raise DataError(f"built-in dataset '{name}' split '{s}' needs this file, "
                                "which is missing (set RAPT_DATA_DIR to the data folder)",
                                path=path)
            return path, s
    aliases = sorted(f"{a} = {t}" for a, ts in _SPLIT_ALIASES.items() for t in ts[:1]
                     if t in b.files and a not in b.files)
    raise DataError(f"dataset '{name}' has no split '{split}'; splits: {sorted(b.files)}"
                    + (f" (aliases: {', '.join(aliases)})" if aliases else ""))


def _seeded_split(examples: list[Example], sizes: tuple[tuple[str, int | None], ...],
                  split: str) -> list[Example]:
    """The examples of ``split`` under a shuffle with :data:`SEEDED_SPLIT_SEED`, in file order."""
    perm = list(range(len(examples)))
    random.Random(SEEDED_SPLIT_SEED).shuffle(perm)
    start = 0
    for name, size in sizes:
        stop = len(perm) if size is None else start + size
        if name == split:
            return [examples[i] for i in sorted(perm[start:stop])]
        start = stop
    raise DataError(f"no split '{split}'")  # _builtin_file already checked the name


# --------------------------------------------------------------------------- sources
# Where the records come from, tried in order: a built-in name, a Hugging Face dataset (a
# save_to_disk folder or a hub id), a user's file. Each opener returns None when the name is
# not its kind; the first that answers gives the text, its format and how to read its labels.


@dataclass(frozen=True)
class _Options:
    """load_dataset's keywords for reading a user's file."""

    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    label_names: Sequence[str] | None = None
    attribute: str | None = None
    format: str | None = None
    label_base: int | None = None


@dataclass
class _Source:
    path: Path
    text: str
    fmt: str  # a key of FORMATS
    spec: ReadSpec
    labels: _LabelMap
    display: str  # Dataset.name
    names: list[str] | None = None  # fixed label names; None: the label map's
    split: str | None = None  # the split reported (built-ins and Hugging Face only)
    shown_format: str | None = None  # the format reported, when not ``fmt``
    seeded_splits: tuple[tuple[str, int | None], ...] = ()
    guessed: bool = False
    check_spread: bool = False  # refuse labels that look misread (user files, no label names)


def _open_builtin(name: str, split: str, o: _Options) -> _Source | None:
    if name not in BUILTINS:
        return None
    user_opts = ("text_column", "text_pair_column", "label_column", "label_names", "format",
                 "label_base")
    given = [k for k in user_opts if getattr(o, k) is not None]
    if given:
        raise DataError(f"{', '.join(_opt(k) for k in given)} apply to your own files; "
                        f"built-in dataset '{name}' has a fixed layout")
    b = BUILTINS[name]
    path, split = _builtin_file(name, b, split)
    text_col, pair_col, label_col = b.columns
    names, raw_names = list(b.label_names), list(b.raw_labels)
    if o.attribute is not None:
        if name != "trustpilot" or o.attribute not in TRUSTPILOT_ATTRIBUTES:
            allowed = sorted(TRUSTPILOT_ATTRIBUTES) if name == "trustpilot" else []
            raise DataError(f"dataset '{name}' has no attribute '{o.attribute}' to use as "
                            f"label; attributes: {allowed}")
        names, raw_names = list(TRUSTPILOT_ATTRIBUTES[o.attribute]), ["0", "1"]
        label_col = o.attribute
    # Unlabelled splits (CB test) are "auto": labelled iff the records carry labels.
    spec = ReadSpec(text_col, pair_col, label_col,
                    label_required=None if split in b.unlabelled_splits else True)
    return _Source(path, _read_text(path), b.format, spec,
                   _LabelMap(raw_names, allow_index=False), name, names, split,
                   seeded_splits=b.seeded_splits)


def _open_huggingface(name: str, split: str, o: _Options) -> _Source | None:
    if o.format is not None:
        return None
    path = Path(name).expanduser()
    hf = _hf_records(name, path, split)
    if hf is None:
        return None
    label_col = o.attribute or o.label_column
    label_names, label_base = o.label_names, o.label_base
    if label_names is None:
        # A ClassLabel feature names its classes and stores 0-based ids.
        label_names = hf.class_names.get(label_col or "label")
        label_base = 0 if label_names else label_base
    spec = ReadSpec(o.text_column, o.text_pair_column, label_col,
                    label_required=True if label_col else None)
    return _Source(path, hf.jsonl, "jsonl", spec, _LabelMap(label_names, base=label_base),
                   path.stem, split=split, shown_format="huggingface",
                   check_spread=label_names is None)


def _file_format(path: Path, format: str | None) -> tuple[str, bool, str | None]:
    """(format, guessed, the file's text if it was read to guess) for a user's file: ``format``,
    else the suffix's, else (or over a fallback such as .txt) the first sniffer's that claims
    the text."""
    fmt, guessed, text = format or format_for(path), False, None
    if format is None and (fmt is None or FORMATS[fmt].fallback) and path.is_file():
        text = _read_text(path)
        sniffed = next((r.name for r in FORMATS.values() if r.sniff and r.sniff(text)), None)
        if sniffed is not None:
            fmt, guessed = sniffed, True
    if fmt is None:
        raise DataError(f"cannot tell the format from the extension '{path.suffix}'; "
                        f"pass {_opt('format')} one of {sorted(FORMATS)}", path=path)
    if fmt not in FORMATS:
        raise DataError(f"unknown format '{fmt}'; formats: {sorted(FORMATS)}", path=path)
    return fmt, guessed, text


def _open_file(name: str, split: str, o: _Options) -> _Source:
    path = Path(name).expanduser()
    if not path.exists():
        raise DataError(f"no such file, and not a built-in dataset ({', '.join(BUILTINS)})"
                        + (" or a Hugging Face hub id" if _HUB_ID.fullmatch(name) else ""),
                        path=path)
    if path.is_dir():
        raise DataError("is a folder, not a data file (a Hugging Face dataset folder "
                        "written by save_to_disk holds dataset_info.json or "
                        "dataset_dict.json)", path=path)
    fmt, guessed, text = _file_format(path, o.format)
    names = None
    if fmt == "trustpilot":
        if o.attribute not in (None, *TRUSTPILOT_ATTRIBUTES):
            raise DataError(f"TrustPilot files have no attribute '{o.attribute}'; "
                            f"attributes: {sorted(TRUSTPILOT_ATTRIBUTES)}", path=path)
        raw_names = ["0", "1"] if o.attribute else [str(i) for i in range(1, 6)]
        names = list(TRUSTPILOT_ATTRIBUTES[o.attribute]) if o.attribute else raw_names
        spec = ReadSpec(label_column=o.attribute)
        labels = _LabelMap(raw_names, allow_index=False)
    else:
        label_col = o.attribute or o.label_column
        spec = ReadSpec(o.text_column, o.text_pair_column, label_col,
                        label_required=True if label_col else None, guessed=guessed)
        fixed = FORMATS[fmt].label_names
        # A format's fixed names (TREC's coarse classes) keep their order, whichever a file holds.
        labels = (_LabelMap(fixed, allow_index=False) if fixed is not None
                  and o.label_names is None else _LabelMap(o.label_names, base=o.label_base))
    return _Source(path, text if text is not None else _read_text(path), fmt, spec, labels,
                   path.stem, names, guessed=guessed, check_spread=o.label_names is None)


def _open(name: str, split: str, o: _Options) -> _Source:
    for opener in (_open_builtin, _open_huggingface):
        src = opener(name, split, o)
        if src is not None:
            return src
    return _open_file(name, split, o)
