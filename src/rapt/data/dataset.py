"""The dataset model: :class:`Example`, :class:`Dataset` and :class:`DataError`."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
