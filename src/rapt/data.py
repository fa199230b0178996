"""Dataset loaders: the shared benchmark files and a user's own CSV / TSV / JSONL / text files.

Every loader reads the whole file, validates every record and either returns all of them or
raises :class:`DataError` naming the file, the 1-based line and the problem. Nothing is dropped
silently: blank lines (which are not records) are counted in ``Dataset.report``, and ``limit``
keeps the first rows only after the whole file has been read and checked, so label ids never
depend on ``limit``.

Built-in names (files under :func:`data_dir`):

========================  ==============================================  ====================
name                      splits                                          format
========================  ==============================================  ====================
``sst2``                  train, dev (``train.tsv``, ``dev.tsv``)         GLUE TSV with header
``sst2-sentences``        train, dev, test (``stsa.binary.*``)            ``LABEL sentence``
``trec``                  train, test                                     ``COARSE:fine text``
``cb``                    train, val, test (test has no labels)           JSONL pairs
``trustpilot``            a / train (``www2015_a.csv``), b / test (``_b``) CSV, no header
``financial_phrasebank``  train, dev, test (seeded split of one file)     ``SENTENCE@LABEL``
========================  ==============================================  ====================

``validation`` and ``dev`` are accepted for each other (``val`` too).

A name is opened as a built-in, then as a Hugging Face dataset, then as a file. A file's format
is a :class:`Reader` in :data:`FORMATS`, chosen by ``format=``, by suffix or by sniffing the
text; :func:`register_format` adds one. Readers only find records; one validation pass checks
every record's texts and labels.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BUILTINS",
    "FORMATS",
    "PAIR_COLUMNS",
    "DataError",
    "Dataset",
    "Example",
    "ReadSpec",
    "Reader",
    "Record",
    "columns_of",
    "data_dir",
    "format_for",
    "load_dataset",
    "register_format",
]


class DataError(ValueError):
    """Malformed or missing input data. The message names the file, the line and the problem."""

    def __init__(self, problem: str, *, path: str | Path | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        self.problem = problem
        where = self.path or ""
        if line is not None:
            where += f", line {line}"
        if field is not None:
            where += f", field '{field}'"
        super().__init__(f"{where}: {problem}" if where else problem)


@dataclass
class Example:
    """One record. ``label`` is an index into ``Dataset.label_names`` (None when unlabelled);
    ``attrs`` holds the record's other fields (e.g. TrustPilot's gender/age/country);
    ``line`` is the 1-based line where the record starts in its file."""

    text: str
    label: int | None
    text_pair: str | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    line: int = 0


@dataclass
class Dataset:
    """A loaded dataset. ``report`` holds the counts: ``read`` (records in the file), ``kept``
    (records in this dataset), ``blank_lines``, ``unlabelled``, ``per_label`` (kept, by name)."""

    name: str
    examples: list[Example]
    label_names: list[str]
    source: str
    report: dict = field(default_factory=dict)

    @property
    def texts(self) -> list[str]:
        return [e.text for e in self.examples]

    @property
    def text_pairs(self) -> list[str | None]:
        return [e.text_pair for e in self.examples]

    @property
    def labels(self) -> list[int]:
        """Label ids; raises DataError if any example is unlabelled (e.g. CB test)."""
        out = []
        for e in self.examples:
            if e.label is None:
                raise DataError("example has no label (this split is unlabelled)",
                                path=self.source, line=e.line)
            out.append(e.label)
        return out

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)

    def __getitem__(self, i: int) -> Example:
        return self.examples[i]

    def _derive(self, examples: list[Example], how: str) -> Dataset:
        report = dict(self.report)
        report.update(_label_counts(examples, self.label_names))
        report["kept"] = len(examples)
        report["derived"] = report.get("derived", []) + [how]
        return Dataset(self.name, examples, list(self.label_names), self.source, report)

    def subset(self, n: int, seed: int = 0) -> Dataset:
        """``n`` examples drawn without replacement (seeded), in file order; all if n >= len."""
        if n < 0:
            raise ValueError(f"subset size must be >= 0, got {n}")
        if n >= len(self.examples):
            return self._derive(list(self.examples), f"subset(n={n}, seed={seed}): all")
        idx = sorted(random.Random(seed).sample(range(len(self.examples)), n))
        return self._derive([self.examples[i] for i in idx], f"subset(n={n}, seed={seed})")

    def split(self, fraction: float, seed: int = 0, *, stratify: bool = False
              ) -> tuple[Dataset, Dataset]:
        """Random split into (first, rest) with round(fraction * len) examples in the first.

        With ``stratify`` the fraction is applied per label, so rare classes (CB's neutral)
        appear on both sides. Each side keeps file order.
        """
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        rng = random.Random(seed)
        if stratify:
            groups: dict[int | None, list[int]] = {}
            for i, e in enumerate(self.examples):
                groups.setdefault(e.label, []).append(i)
            first: list[int] = []
            for key in sorted(groups, key=lambda k: -1 if k is None else k):
                g = groups[key]
                rng.shuffle(g)
                first += g[: round(fraction * len(g))]
        else:
            perm = list(range(len(self.examples)))
            rng.shuffle(perm)
            first = perm[: round(fraction * len(perm))]
        chosen = set(first)
        a = [e for i, e in enumerate(self.examples) if i in chosen]
        b = [e for i, e in enumerate(self.examples) if i not in chosen]
        how = f"split(fraction={fraction}, seed={seed}, stratify={stratify})"
        return self._derive(a, how + "[0]"), self._derive(b, how + "[1]")


def _label_counts(examples: Sequence[Example], label_names: Sequence[str]) -> dict:
    c = Counter(e.label for e in examples)
    return {
        "per_label": {name: c.get(i, 0) for i, name in enumerate(label_names)},
        "unlabelled": c.get(None, 0),
    }


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


# --------------------------------------------------------------------------- reading helpers


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError("file not found", path=path) from None
    except IsADirectoryError:
        raise DataError("is a folder, expected a data file", path=path) from None
    except OSError as e:
        raise DataError(f"cannot read: {e.strerror}", path=path) from None
    try:
        # utf-8-sig: spreadsheet exports often start with a byte-order mark.
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(
            f"bad encoding: byte 0x{raw[e.start]:02x} is not valid UTF-8 "
            "(save the file as UTF-8)", path=path, line=line) from None


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its end) for every physical line."""
    for i, line in enumerate(io.StringIO(text, newline=None), start=1):
        yield i, line.rstrip("\r\n")


def _csv_records(text: str, path: Path, delimiter: str, quoting: int
                 ) -> Iterator[tuple[int, list[str]]]:
    """(start line, fields) for each record; blank lines come back as an empty list."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting,
                        strict=True)
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise DataError(f"malformed {'CSV' if delimiter == ',' else 'TSV'}: {e}",
                            path=path, line=start) from None
        yield start, row
        start = reader.line_num + 1


def _clean_text(value: Any, path: Path, line: int, name: str) -> str:
    if value is None:
        raise DataError("is null, expected text", path=path, line=line, field=name)
    if not isinstance(value, str):
        raise DataError(f"expected text, got {type(value).__name__} {value!r}",
                        path=path, line=line, field=name)
    s = value.strip()
    if not s:
        raise DataError("empty text", path=path, line=line, field=name)
    return s


class _LabelMap:
    """Raw label strings -> ids.

    Fixed names (built-ins, or the user's ``label_names``): a raw value must be one of them,
    or, for user names, an integer id into them. Otherwise ids follow the sorted order of
    the raw values seen in the file (numeric order when they are all integers).

    Integer ids into user names are 0-based (``base=0``) or 1-based (``base=1``). With
    ``base=None`` the file decides: 1-based when every label is an integer and they are exactly
    1..K for K names (``note`` says so), an error when every label is an integer in 1..K-1
    (0-based and 1-based would both fit), else 0-based.
    """

    def __init__(self, names: Sequence[str] | None, *, allow_index: bool = True,
                 base: int | None = None) -> None:
        if base not in (None, 0, 1):
            raise DataError(f"label_base must be 0 or 1, got {base}")
        self.fixed = names is not None
        self.names = [str(n) for n in names] if names is not None else []
        self.allow_index = allow_index
        self.base = base
        self.note: str | None = None
        self._first: dict[str, tuple[Path, int, str]] = {}  # raw -> where it first appears

    def check(self, raw: str, path: Path, line: int, fld: str) -> None:
        if not raw:
            raise DataError("empty label", path=path, line=line, field=fld)
        self._first.setdefault(raw, (path, line, fld))
        if not self.fixed or raw in self.names:
            return
        # Before the whole file is seen, an id may be 0-based or 1-based: accept 0..K.
        lo, hi = (0, len(self.names)) if self.base is None else (self.base,
                                                                  self.base + len(self.names) - 1)
        n = self._int(raw)
        if n is None or not lo <= n <= hi:
            raise DataError(self._unknown(raw), path=path, line=line, field=fld)

    def _unknown(self, raw: str) -> str:
        msg = f"unknown label {raw!r}; expected one of {self.names}"
        if self.allow_index and self._int(raw) is not None:
            base = 0 if self.base is None else self.base
            msg += (f" or an integer id {base}..{base + len(self.names) - 1} into them "
                    f"({base}-based)")
        return msg

    def _int(self, raw: str) -> int | None:
        if self.allow_index and raw.lstrip("-").isdigit():
            return int(raw)
        return None

    def _resolve_base(self, seen: set[str]) -> int:
        if self.base is not None:
            return self.base
        k = len(self.names)
        ints = {self._int(r) for r in seen}
        if not seen or None in ints or seen & set(self.names):
            return 0  # names (or nothing) in the file: integers are 0-based ids
        if ints == set(range(1, k + 1)):
            self.note = (f"labels 1..{k} read as 1-based ids into the {k} label names "
                         f"({', '.join(f'{i + 1}={n}' for i, n in enumerate(self.names))}); "
                         "pass label_base=0 if that is wrong")
            return 1
        if ints and min(ints) >= 1 and max(ints) <= k - 1:
            raise DataError(
                f"the file's labels {sorted(ints)} are integers that could be 0-based or "
                f"1-based ids into the label names {self.names}; say which with label_base=0 "
                "or label_base=1", path=next(iter(self._first.values()))[0])
        return 0

    def finalize(self, raws: Sequence[str | None]) -> list[int | None]:
        if not self.fixed:
            seen = {r for r in raws if r is not None}
            numeric = all(r.lstrip("-").isdigit() for r in seen)
            self.names = sorted(seen, key=(lambda r: (int(r), r)) if numeric else None)
        ids = {n: i for i, n in enumerate(self.names)}
        base = self._resolve_base({r for r in raws if r is not None}) if self.fixed else 0
        self.base = base
        out: list[int | None] = []
        for r in raws:
            if r is None:
                out.append(None)
            elif r in ids:
                out.append(ids[r])
            else:
                n = self._int(r)
                if n is None or not 0 <= n - base < len(self.names):
                    path, line, fld = self._first.get(r, (None, None, None))
                    raise DataError(self._unknown(r), path=path, line=line, field=fld)
                out.append(n - base)
        return out


def _raw_label(value: Any, path: Path, line: int, fld: str) -> str:
    # JSON may carry labels as numbers or booleans; strings elsewhere.
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return value.strip()
    raise DataError(f"expected a label string or integer, got {value!r}",
                    path=path, line=line, field=fld)


# --------------------------------------------------------------------------- readers
# A reader turns a file's text into raw records (line, field values as found); it checks the
# file's structure (header, JSON, field counts). One validation pass, :func:`_validated_rows`,
# then checks every record's texts and labels and names the file, line and field of an error.

_Row = tuple[int, str, str | None, str | None, dict[str, Any]]  # line, text, pair, raw label, attrs


@dataclass
class ReadSpec:
    """What the caller asked a reader for; the reader records what it found."""

    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    label_required: bool | None = None  # None: labelled iff the label column/key exists
    guessed: bool = False  # the format was guessed from the file's lines
    # Set by the reader: the text / pair columns it read, and whether it detected the pair.
    used_text: str | None = None
    used_pair: str | None = None
    pair_detected: bool = False


@dataclass
class Record:
    """One record as a reader found it, before validation. ``text``/``pair``/``label`` are the raw
    values (a JSON value may be null or a number); ``pair_field`` None means no pair and
    ``label`` None means unlabelled. ``line`` is the 1-based line where the record starts."""

    line: int
    text: Any
    text_field: str = "text"
    pair: Any = None
    pair_field: str | None = None
    label: Any = None  # a string is taken as written (strip it if the format allows spaces)
    label_field: str = "label"
    attrs: dict[str, Any] = field(default_factory=dict)


ReadFn = Callable[[str, Path, ReadSpec], Iterable[Record | None]]


@dataclass(frozen=True)
class Reader:
    """A file format: ``read(text, path, spec)`` yields a :class:`Record` per record and None
    per blank line, raising :class:`DataError` for a malformed structure.

    ``suffixes`` (".csv") pick it from a file's name; ``sniff(text)`` claims a file whose suffix
    names no format or a ``fallback`` one (any text fits "lines"). ``label_first``: validate the
    label before the text, for lines whose label gives them their shape (``LABEL sentence``), so
    a misread line reports its label. ``label_names``: the format's fixed label names, in id
    order, unless the caller gives some. ``default_label``: the field labels come from when no
    label column is named (for the report)."""

    name: str
    read: ReadFn
    suffixes: tuple[str, ...] = ()
    sniff: Callable[[str], bool] | None = None
    fallback: bool = False
    label_first: bool = False
    label_names: tuple[str, ...] | None = None
    default_label: str = "label"


FORMATS: dict[str, Reader] = {}


def register_format(reader: Reader) -> Reader:
    """Add ``reader`` to :data:`FORMATS` (then ``load_dataset(..., format=reader.name)`` and its
    suffixes read with it). Refuses, with ValueError, a name or a suffix already registered."""
    if reader.name in FORMATS:
        raise ValueError(f"format '{reader.name}' is already registered")
    for suffix in reader.suffixes:
        if not suffix.startswith(".") or suffix != suffix.lower():
            raise ValueError(f"format '{reader.name}': suffix {suffix!r} must be lower-case "
                             "and start with '.'")
        taken = format_for(Path("x" + suffix))
        if taken is not None:
            raise ValueError(f"suffix '{suffix}' already reads as format '{taken}'")
    FORMATS[reader.name] = reader
    return reader


def format_for(path: str | Path) -> str | None:
    """The registered format whose suffixes include ``path``'s (case-insensitive), or None."""
    suffix = Path(path).suffix.lower()
    return next((r.name for r in FORMATS.values() if suffix and suffix in r.suffixes), None)


# Text columns/keys guessed when none is given; sentence pairs are detected first, from these
# (first, second) names (GLUE / SuperGLUE: MRPC, STS-B, RTE; MNLI, CB; QQP; QNLI), in order.
TEXT_COLUMNS = ("text", "sentence")
PAIR_COLUMNS = (("sentence1", "sentence2"), ("premise", "hypothesis"),
                ("question1", "question2"), ("question", "sentence"))


def _pick_text_columns(spec: ReadSpec, present: Sequence[str] | dict) -> tuple[str | None,
                                                                               str | None]:
    """(text column, pair column) for a record with these columns/keys; records the choice in
    ``spec``. A pair is detected only when neither is given and both of its names are present;
    a given pair column alone takes its partner from :data:`PAIR_COLUMNS` as the first text."""
    text, pair = spec.text_column, spec.text_pair_column
    if text is None and pair is None:
        found = next(((a, b) for a, b in PAIR_COLUMNS if a in present and b in present), None)
        if found is not None:
            text, pair = found
            spec.pair_detected = True
    if text is None:
        partner = next((a for a, b in PAIR_COLUMNS if b == pair and a in present), None)
        text = partner or next((c for c in TEXT_COLUMNS if c in present), None)
    spec.used_text, spec.used_pair = text, pair
    return text, pair


def _blank_row(row: list[str]) -> bool:
    return not row or (len(row) == 1 and not row[0].strip())


def _table_columns(header: list[str], line: int, path: Path, spec: ReadSpec
                   ) -> tuple[str, str | None, str | None]:
    """(text, pair, label) columns of a table with this header; DataError when one is missing."""
    dup = [h for h, n in Counter(header).items() if n > 1]
    if dup:
        raise DataError(f"duplicate column names {dup}", path=path, line=line)
    text_col, pair_col = _pick_text_columns(spec, header)
    for opt, c in (("text_pair_column", pair_col), ("label_column", spec.label_column)):
        if c is not None and c not in header:
            raise DataError(f"missing column '{c}' given as {opt} (columns: {header})",
                            path=path, line=line)
    if text_col is None or text_col not in header:
        want = spec.text_column or "text' or 'sentence"
        raise DataError(f"missing column '{want}' (columns: {header}); "
                        f"choose one with {_opt('text_column')}", path=path, line=line)
    if pair_col == text_col:
        raise DataError(f"column '{text_col}' is both the text and the text_pair_column",
                        path=path, line=line)
    label_col = spec.label_column or ("label" if "label" in header else None)
    if spec.label_required and label_col is None:
        raise DataError(f"missing column 'label' (columns: {header})", path=path, line=line)
    return text_col, pair_col, label_col


def _read_table(text: str, path: Path, spec: ReadSpec, delimiter: str
                ) -> Iterator[Record | None]:
    """CSV / TSV with a header row naming the columns."""
    # GLUE TSV has bare double quotes inside sentences; TSV is read without quote handling.
    quoting = csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE
    records = _csv_records(text, path, delimiter, quoting)
    header: list[str] | None = None
    header_line = 0
    for line, row in records:
        if _blank_row(row):
            yield None
            continue
        header, header_line = [h.strip() for h in row], line
        break
    if header is None:
        raise DataError("no header row (the file is empty)", path=path, line=1)
    text_col, pair_col, label_col = _table_columns(header, header_line, path, spec)
    cols = {h: i for i, h in enumerate(header)}
    used = {text_col, pair_col, label_col}
    for line, row in records:
        if _blank_row(row):
            yield None
            continue
        if len(row) != len(header):
            raise DataError(f"wrong number of fields: expected {len(header)} ({header}), "
                            f"got {len(row)}", path=path, line=line)
        yield Record(line, row[cols[text_col]], text_col,
                     row[cols[pair_col]] if pair_col else None, pair_col,
                     row[cols[label_col]].strip() if label_col is not None else None,
                     label_col or "label", {h: row[i] for h, i in cols.items() if h not in used})


def _json_object(s: str, path: Path, line: int) -> dict:
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as e:
        raise DataError(f"bad JSON: {e.msg} at column {e.colno}", path=path, line=line) from None
    if not isinstance(obj, dict):
        raise DataError(f"expected a JSON object, got {type(obj).__name__}", path=path, line=line)
    return obj


def _check_keys(obj: dict, text_key: str | None, pair_key: str | None, spec: ReadSpec,
                path: Path, line: int) -> str:
    """The text key, after checking that the record has the text (and pair) keys."""
    for k, opt in ((pair_key, "text_pair_column"), (text_key, "text_column")):
        if k is not None and k not in obj:
            given = f" given as {opt}" if k == getattr(spec, opt) else ""
            raise DataError(f"missing field{given} (keys: {sorted(obj)})", path=path,
                            line=line, field=k)
    if text_key is None:
        raise DataError(f"missing field 'text' (keys: {sorted(obj)}); "
                        f"choose one with {_opt('text_column')}", path=path, line=line)
    if pair_key == text_key:
        raise DataError(f"key '{text_key}' is both the text and the text_pair_column",
                        path=path, line=line)
    return text_key


def _read_jsonl(text: str, path: Path, spec: ReadSpec) -> Iterator[Record | None]:
    text_key: str | None = None
    pair_key: str | None = None
    picked = False  # the first record picks the text keys; the others must have them too
    label_key = spec.label_column or "label"
    # True: every record needs a label; None: the first record decides, the rest must agree.
    labelled: bool | None = True if spec.label_required else None
    for line, s in _lines(text):
        if not s.strip():
            yield None
            continue
        obj = _json_object(s, path, line)
        if not picked:
            text_key, pair_key = _pick_text_columns(spec, obj)
            picked = True
        key = _check_keys(obj, text_key, pair_key, spec, path, line)
        has = label_key in obj and obj[label_key] is not None
        if labelled is None:
            labelled = has
        if labelled and not has:
            raise DataError("missing label (earlier records have one)", path=path,
                            line=line, field=label_key)
        if has and not labelled:
            raise DataError("has a label but earlier records have none", path=path,
                            line=line, field=label_key)
        used = {key, pair_key, label_key}
        label = obj[label_key] if labelled else None
        yield Record(line, obj[key], key, obj[pair_key] if pair_key else None, pair_key,
                     label.strip() if isinstance(label, str) else label, label_key,
                     {k: v for k, v in obj.items() if k not in used})


def _per_line(text: str, parse: Callable[[int, str], Record]) -> Iterator[Record | None]:
    """``parse(line number, stripped line)`` for every non-blank line; None for the blanks."""
    for line, s in _lines(text):
        yield parse(line, s.strip()) if s.strip() else None


def _read_label_text(text: str, path: Path, spec: ReadSpec) -> Iterator[Record | None]:
    """``LABEL sentence`` per line (label first, one space)."""
    def parse(line: int, s: str) -> Record:
        raw, _, rest = s.partition(" ")
        return Record(line, rest, label=raw)

    return _per_line(text, parse)


def _read_text_at_label(text: str, path: Path, spec: ReadSpec) -> Iterator[Record | None]:
    """``SENTENCE@LABEL`` per line (Financial PhraseBank); the label follows the *last* ``@``,
    since sentences may contain ``@`` themselves."""
    def parse(line: int, s: str) -> Record:
        sentence, at, raw = s.rpartition("@")
        if not at:
            raise DataError("expected 'SENTENCE@LABEL' (no '@' on this line)"
                            + ("; the format was guessed from the other lines: pass "
                               "format='lines' to read every line as unlabelled text"
                               if spec.guessed else ""),
                            path=path, line=line, field="label")
        return Record(line, sentence, label=raw.strip())

    return _per_line(text, parse)


_AT_LABEL = re.compile(r"\S\s*@\s*[\w-]+$")


def _looks_text_at_label(text: str) -> bool:
    """True when at least 80 % of the (first 1,000) non-blank lines end in ``@word``."""
    lines = [s.strip() for _, s in _lines(text) if s.strip()][:1000]
    return bool(lines) and sum(bool(_AT_LABEL.search(s)) for s in lines) >= 0.8 * len(lines)


TREC_COARSE = ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]


def _read_trec(text: str, path: Path, spec: ReadSpec) -> Iterator[Record | None]:
    """``COARSE:fine question`` per line; the label is the coarse class."""
    def parse(line: int, s: str) -> Record:
        tag, _, rest = s.partition(" ")
        coarse, colon, fine = tag.partition(":")
        if not colon or not fine:
            raise DataError(f"expected 'COARSE:fine' before the question, got {tag!r}",
                            path=path, line=line, field="label")
        return Record(line, rest, label=coarse, attrs={"fine": fine})

    return _per_line(text, parse)


def _read_lines(text: str, path: Path, spec: ReadSpec) -> Iterator[Record | None]:
    """One unlabelled text per line."""
    return _per_line(text, lambda line, s: Record(line, s))


TRUSTPILOT_COLUMNS = ["review", "rating", "gender", "age", "country"]
TRUSTPILOT_ATTRIBUTES = {
    # attribute -> label names indexed by the raw 0/1 value in the file
    "gender": ["female", "male"],
    "age": ["born_1960_or_later", "born_before_1960"],
}


def _read_trustpilot(text: str, path: Path, spec: ReadSpec) -> Iterator[Record | None]:
    """Headerless CSV: review, rating 1-5, gender 1/0, age 1/0, country."""
    for line, row in _csv_records(text, path, ",", csv.QUOTE_MINIMAL):
        if _blank_row(row):
            yield None
            continue
        if len(row) != len(TRUSTPILOT_COLUMNS):
            raise DataError(f"wrong number of fields: expected {len(TRUSTPILOT_COLUMNS)} "
                            f"({', '.join(TRUSTPILOT_COLUMNS)}), got {len(row)}",
                            path=path, line=line)
        rating, gender, age, country = (v.strip() for v in row[1:])
        if rating not in {"1", "2", "3", "4", "5"}:
            raise DataError(f"rating must be 1-5, got {rating!r}", path=path, line=line,
                            field="rating")
        for name, v in (("gender", gender), ("age", age)):
            if v not in {"0", "1"}:
                raise DataError(f"must be 0 or 1, got {v!r}", path=path, line=line, field=name)
        if not country:
            raise DataError("empty country", path=path, line=line, field="country")
        attrs = {"rating": int(rating), "gender": int(gender), "age": int(age),
                 "country": country}
        raw = {"gender": gender, "age": age}.get(spec.label_column or "", rating)
        yield Record(line, row[0], "review", label=raw,
                     label_field=spec.label_column or "rating", attrs=attrs)


for _reader in (
    Reader("csv", lambda t, p, s: _read_table(t, p, s, ","), suffixes=(".csv",)),
    Reader("tsv", lambda t, p, s: _read_table(t, p, s, "\t"), suffixes=(".tsv",)),
    Reader("jsonl", _read_jsonl, suffixes=(".jsonl", ".ndjson")),
    Reader("label-text", _read_label_text, label_first=True),
    Reader("text-at-label", _read_text_at_label, sniff=_looks_text_at_label, label_first=True),
    Reader("trec", _read_trec, label_first=True, label_names=tuple(TREC_COARSE)),
    Reader("trustpilot", _read_trustpilot, default_label="rating"),
    Reader("lines", _read_lines, suffixes=(".txt",), fallback=True),
):
    register_format(_reader)
del _reader


# --------------------------------------------------------------------------- validation


def _check_label(rec: Record, path: Path, labels: _LabelMap) -> str | None:
    if rec.label is None:
        return None
    # Text formats give the label as written; JSON values (numbers, booleans) become strings.
    raw = (rec.label if isinstance(rec.label, str)
           else _raw_label(rec.label, path, rec.line, rec.label_field))
    labels.check(raw, path, rec.line, rec.label_field)
    return raw


def _validated_rows(reader: Reader, text: str, path: Path, spec: ReadSpec, labels: _LabelMap
                    ) -> tuple[list[_Row], int]:
    """Every record of ``text`` read by ``reader`` and checked (texts non-empty, labels known);
    returns (rows, blank lines). Records are checked as they are read, so the first problem in
    file order is the one reported."""
    rows: list[_Row] = []
    blank = 0
    for rec in reader.read(text, path, spec):
        if rec is None:
            blank += 1
            continue
        raw = _check_label(rec, path, labels) if reader.label_first else None
        t = _clean_text(rec.text, path, rec.line, rec.text_field)
        tp = (_clean_text(rec.pair, path, rec.line, rec.pair_field)
              if rec.pair_field is not None else None)
        if not reader.label_first:
            raw = _check_label(rec, path, labels)
        rows.append((rec.line, t, tp, raw, rec.attrs))
    return rows, blank


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


def _opt(name: str) -> str:
    """A load_dataset keyword as messages write it (``text_column=``); the CLI rewrites these
    into its flags (``rapt.cli._app.flag_words``)."""
    return f"{name}="


def _check_label_spread(fmt: str, ids: Sequence[int | None], names: Sequence[str],
                        path: Path) -> None:
    """A line format whose labels are nearly all distinct is almost surely read wrongly."""
    labelled = sum(i is not None for i in ids)
    if fmt not in ("label-text", "text-at-label") or labelled < 10:
        return
    if len(names) > labelled / 2:
        other = "text-at-label" if fmt == "label-text" else "label-text"
        where = ("the first word of each line" if fmt == "label-text"
                 else "the word after the last '@'")
        raise DataError(
            f"{len(names)} distinct labels in {labelled} lines (e.g. {list(names)[:3]}): "
            f"format {fmt} takes {where} as its label, which does not look like a label "
            f"here; pass format='{other}' ('sentence@label' lines: text-at-label, "
            "'LABEL sentence': label-text) or format='lines' for unlabelled text", path=path)


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
    # One sentence per label for the frozen label-description head (rapt.heads); () = none.
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


def _dataset(src: _Source, limit: int | None) -> Dataset:
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
    if src.seeded_splits:
        examples = _seeded_split(examples, src.seeded_splits, str(src.split))
    if limit is not None:
        examples = examples[:limit]
    report = {
        "file": str(src.path),
        "format": src.shown_format or src.fmt,
        "split": src.split,
        "read": read,
        "kept": len(examples),
        "limit": limit,
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

    ``limit`` keeps the first ``limit`` records after reading and checking the whole file.
    Raises DataError naming file, line and problem for anything malformed.
    """
    if limit is not None and limit < 0:
        raise DataError(f"limit must be >= 0, got {limit}")
    opts = _Options(text_column=text_column, text_pair_column=text_pair_column,
                    label_column=label_column, label_names=label_names, attribute=attribute,
                    format=format, label_base=label_base)
    return _dataset(_open(str(name_or_path), split, opts), limit)
