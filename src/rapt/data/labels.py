"""Raw labels to label ids: :class:`_LabelMap` (fixed names, integer ids 0- or 1-based, or the
sorted values a file holds) and the check that a line format's labels look like labels."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rapt.data.dataset import DataError


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
