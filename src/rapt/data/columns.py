"""Which columns of a table look like text and which like a label, from a sample of its
rows: what a data error proposes when it cannot find the text column (MRPC's TSV names its
columns ``Quality``, ``#1 String``, ``#2 String``), and what `rapt data check` proposes for
the columns a file has but the reader did not use.

A guess, stated as one: text has several words per value; a label has few distinct short
values; the rest (ids, numbers, dates) is neither.
"""

from __future__ import annotations

from collections.abc import Sequence

from rapt.data.messages import _opt

SAMPLE_ROWS = 200  # rows a guess looks at
TEXT_MIN_WORDS = 3.0  # mean words per value from which a column reads as text
LABEL_MAX_VALUES = 20  # distinct values up to which a short column reads as a label


def column_kinds(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> dict[str, str]:
    """Each column's kind: "text", "label" or "other", from ``rows`` (values in the order of
    ``columns``; rows of another length are skipped)."""
    kinds = {}
    for i, name in enumerate(columns):
        values = [str(r[i]).strip() for r in rows if len(r) == len(columns)]
        values = [v for v in values if v]
        kinds[name] = _kind(values)
    return kinds


def _kind(values: list[str]) -> str:
    if not values:
        return "other"
    distinct = len(set(values))
    words = sum(len(v.split()) for v in values) / len(values)
    if words >= TEXT_MIN_WORDS:
        return "text"
    if words < TEXT_MIN_WORDS and distinct <= LABEL_MAX_VALUES and distinct < len(values):
        return "label"
    return "other"


def proposal(kinds: dict[str, str], *, text: str | None = None, pair: str | None = None,
             label: str | None = None) -> str:
    """What the columns look like and the options that would read them, for the roles not
    filled yet (``text`` / ``pair`` / ``label``: the columns already read as such): e.g.
    "'#1 String', '#2 String' look like text, 'Quality' like a label: text_column='#1 String'
    text_pair_column='#2 String' label_column='Quality'". Empty when nothing fits."""
    taken = {text, pair, label}
    texts = [c for c, k in kinds.items() if k == "text" and c not in taken]
    labels = [c for c, k in kinds.items() if k == "label" and c not in taken]
    looks = []
    if texts:
        looks.append(f"{_names(texts)} look{'s' if len(texts) == 1 else ''} like text")
    if labels:
        looks.append(f"{_names(labels)} like a label" if looks else
                     f"{_names(labels)} look{'s' if len(labels) == 1 else ''} like a label")
    options = []
    if text is None and texts:
        options.append(_option("text_column", texts.pop(0)))
    if pair is None and texts:  # a second text: the pair of a sentence-pair task
        options.append(_option("text_pair_column", texts[0]))
    if label is None and labels:
        options.append(_option("label_column", labels[0]))
    if not looks:
        return ""
    return ", ".join(looks) + (": " + " ".join(options) if options else "")


def _names(columns: list[str]) -> str:
    return ", ".join(f"'{c}'" for c in columns)


def _option(name: str, column: str) -> str:
    return f"{_opt(name)}'{column}'"
