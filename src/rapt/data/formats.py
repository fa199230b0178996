"""File formats: a :class:`Reader` per format in :data:`FORMATS` (:func:`register_format` adds
one), and the one validation pass that checks every reader's records."""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapt.data.dataset import DataError
from rapt.data.labels import _LabelMap, _raw_label
from rapt.data.messages import _opt

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


def _table_columns(header: list[str], line: int, path: Path, spec: ReadSpec,
                   sample: Callable[[], list[list[str]]] = list
                   ) -> tuple[str, str | None, str | None]:
    """(text, pair, label) columns of a table with this header; DataError when one is missing
    (the text column's names the columns that look like text or a label in ``sample()``, the
    first data rows, and the options that would read them)."""
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
                        + _which_columns(header, sample(), pair_col, spec.label_column),
                        path=path, line=line)
    if pair_col == text_col:
        raise DataError(f"column '{text_col}' is both the text and the text_pair_column",
                        path=path, line=line)
    label_col = spec.label_column or ("label" if "label" in header else None)
    if spec.label_required and label_col is None:
        raise DataError(f"missing column 'label' (columns: {header})", path=path, line=line)
    return text_col, pair_col, label_col


def _which_columns(header: list[str], rows: list[list[str]], pair: str | None,
                   label: str | None) -> str:
    """What a missing text column's error proposes: the columns that look like text or a
    label and the options that would read them, or the options to choose from."""
    from rapt.data.columns import column_kinds, proposal

    label = label or ("label" if "label" in header else None)
    guess = proposal(column_kinds(header, rows), pair=pair, label=label)
    if _opt("text_column") in guess:
        return f"{guess} (a guess from the first {len(rows)} rows)"
    return ((f"{guess} (a guess from the first {len(rows)} rows); " if guess else "")
            + f"choose one with {_opt('text_column')} (for sentence pairs the second with "
            f"{_opt('text_pair_column')}; the label with {_opt('label_column')})")


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
    def sample() -> list[list[str]]:  # the first data rows, for an error's guess
        from itertools import islice

        from rapt.data.columns import SAMPLE_ROWS

        return [row for _, row in islice(records, SAMPLE_ROWS) if not _blank_row(row)]

    text_col, pair_col, label_col = _table_columns(header, header_line, path, spec, sample)
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
        keys = sorted(obj)
        raise DataError(f"missing field 'text' (keys: {keys}); "
                        + _which_columns(keys, [[obj[k] for k in keys]], pair_key,
                                         spec.label_column), path=path, line=line)
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
