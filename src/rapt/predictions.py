"""One prediction format for `rapt predict`, `rapt sap predict` and `rapt client predict`.

A row: its id (0-based position in the input, or the caller's), the text (and pair text), the
predicted label by *name*, the gold label's name when the input has one, and the class
probabilities keyed by label name. Written as JSONL or CSV, chosen by the output file's suffix
(:func:`check_out_path` refuses any other before work starts); without a file, :meth:`summary`
gives the counts per label and the first rows. When every row has a gold label, the accuracy
and a per-class confusion table come with it.

A prediction that combines several models (the remote prompt on the privatized query, the
user's local model on the clean one, their fusion) keeps each one's probabilities in
``sources``: written per row beside the combined ones, each scored when the rows are labelled.

    preds = Predictions(["neg", "pos"], probs, texts=ds.texts, gold=[e.label for e in ds])
    write_predictions(Path("out.csv"), preds)
    print("\\n".join(preds.report_lines()))
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SUFFIXES", "Predictions", "check_out_path", "write_predictions"]

SUFFIXES = {".jsonl": "jsonl", ".csv": "csv"}
SHOWN = 10  # rows printed without --out


def check_out_path(path: Path | str) -> str:
    """The format of an output file (``jsonl`` / ``csv``) by its suffix; ValueError naming the
    file and the suffixes rapt writes otherwise."""
    fmt = SUFFIXES.get(Path(path).suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: cannot tell the prediction format from the suffix "
                         f"{Path(path).suffix or '(none)'!r}; name the file *.jsonl or *.csv")
    return fmt


@dataclass
class Predictions:
    """Class probabilities ``probs`` (N rows of C values, in label-id order) with the label
    ``names`` (C), and what identifies each row: ``texts`` / ``text_pairs`` (None where a row
    has no pair) and ``ids`` (default 0..N-1). ``gold``: label ids, None where unknown.
    ``sources``: the probabilities (N x C each) of the models ``probs`` combines, by name
    (e.g. remote, local, fused); None for a single model."""

    names: Sequence[str]
    probs: Sequence[Sequence[float]]
    texts: Sequence[str] | None = None
    text_pairs: Sequence[str | None] | None = None
    gold: Sequence[int | None] | None = None
    ids: Sequence[int | str] | None = None
    sources: dict[str, Sequence[Sequence[float]]] | None = None

    def __post_init__(self) -> None:
        self.names = [str(n) for n in self.names]
        self.probs = [[float(p) for p in row] for row in self.probs]
        n, c = len(self.probs), len(self.names)
        if len(set(self.names)) != c:
            raise ValueError(f"label names must be distinct (got {self.names})")
        for i, row in enumerate(self.probs):
            if len(row) != c:
                raise ValueError(f"row {i} has {len(row)} probabilities for {c} labels")
        for what in ("texts", "text_pairs", "gold", "ids"):
            seq = getattr(self, what)
            if seq is not None and len(seq) != n:
                raise ValueError(f"{what}: {len(seq)} entries for {n} predictions")
        if self.sources is not None:
            self.sources = {str(k): [[float(p) for p in row] for row in v]
                            for k, v in self.sources.items()}
            for k, v in self.sources.items():
                if len(v) != n or any(len(row) != c for row in v):
                    raise ValueError(f"sources[{k!r}]: not {n} rows of {c} probabilities")

    def __len__(self) -> int:
        return len(self.probs)

    @property
    def pred(self) -> list[int]:
        """Predicted label ids (argmax; the first on ties)."""
        return [max(range(len(row)), key=row.__getitem__) for row in self.probs]

    @property
    def labelled(self) -> bool:
        """Every row has a gold label (accuracy and the confusion table are defined)."""
        return bool(self.gold) and all(g is not None for g in self.gold)

    def accuracy(self, source: str | None = None) -> float | None:
        """Share of rows whose prediction is the gold label (None unless every row has one);
        ``source``: the prediction of one of :attr:`sources` instead of the combined one."""
        if not self.labelled:
            return None
        probs = self.probs if source is None else (self.sources or {})[source]
        pred = [max(range(len(row)), key=row.__getitem__) for row in probs]
        return sum(int(p == g) for p, g in zip(pred, self.gold, strict=True)) / len(self)

    def confusion(self) -> list[list[int]]:
        """counts[gold][predicted] over the labelled rows."""
        c = len(self.names)
        counts = [[0] * c for _ in range(c)]
        for p, g in zip(self.pred, self.gold or [], strict=False):
            if g is not None:
                counts[int(g)][p] += 1
        return counts

    def counts(self) -> list[int]:
        """Rows predicted per label id."""
        out = [0] * len(self.names)
        for p in self.pred:
            out[p] += 1
        return out

    def records(self) -> list[dict]:
        """One dict per row: row, text, text_pair (pairs only), label, gold (labelled inputs
        only), probabilities keyed by label name."""
        has_pairs = self.text_pairs is not None and any(t is not None for t in self.text_pairs)
        out = []
        for i, (p, row) in enumerate(zip(self.pred, self.probs, strict=True)):
            rec: dict = {"row": self.ids[i] if self.ids is not None else i}
            if self.texts is not None:
                rec["text"] = self.texts[i]
            if has_pairs:
                rec["text_pair"] = self.text_pairs[i]
            rec["label"] = self.names[p]
            if self.gold is not None and any(g is not None for g in self.gold):
                g = self.gold[i]
                rec["gold"] = self.names[int(g)] if g is not None else None
            rec["probabilities"] = {n: round(v, 6) for n, v in zip(self.names, row, strict=True)}
            for src, probs in (self.sources or {}).items():
                rec[f"probabilities_{src}"] = {n: round(v, 6) for n, v in zip(
                    self.names, probs[i], strict=True)}
            out.append(rec)
        return out

    def render(self, fmt: str) -> str:
        """The whole output file as text: ``jsonl`` or ``csv`` (probabilities as columns
        ``p(NAME)``)."""
        recs = self.records()
        if fmt == "jsonl":
            return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
        if fmt != "csv":
            raise ValueError(f"unknown prediction format {fmt!r} (jsonl or csv)")
        probs = ["probabilities"] + [f"probabilities_{s}" for s in self.sources or {}]
        base = [k for k in (recs[0] if recs else {"row": 0, "label": ""}) if k not in probs]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        # p(NAME): the prediction's; p_SOURCE(NAME): each combined model's
        w.writerow(base + [f"p{k[len('probabilities'):]}({n})" for k in probs
                           for n in self.names])
        for r in recs:
            w.writerow([r[k] if r[k] is not None else "" for k in base]
                       + [r[k][n] for k in probs for n in self.names])
        return buf.getvalue()

    def summary(self) -> str:
        """'N predictions: neg 12 (40.0 %), pos 18 (60.0 %)'."""
        n = max(1, len(self))
        parts = [f"{name} {k} ({100 * k / n:.1f} %)"
                 for name, k in zip(self.names, self.counts(), strict=True)]
        return f"{len(self)} predictions: " + ", ".join(parts)

    def first_rows(self, k: int = SHOWN) -> list[str]:
        """'label<TAB>text[<TAB>pair]' lines of the first ``k`` rows (or row ids without text),
        then how many more there are."""
        lines = []
        for r in self.records()[:k]:
            shown = [str(r.get("text", r["row"]))]
            if r.get("text_pair") is not None:
                shown.append(str(r["text_pair"]))
            lines.append("\t".join([r["label"], *shown]))
        if len(self) > k:
            lines.append(f"... and {len(self) - k} more (write them all with --out FILE.jsonl "
                         "or FILE.csv)")
        return lines

    def confusion_table(self) -> list[str]:
        """Per-class confusion lines (rows: gold, columns: predicted) with each class's recall;
        empty without gold labels."""
        if not self.labelled:
            return []
        m = self.confusion()
        corner = "gold \\ predicted"
        first = max(len(corner), *(len(n) for n in self.names)) + 2
        width = max(8, *(len(n) for n in self.names)) + 1
        head = corner.ljust(first) + "".join(n.rjust(width) for n in self.names)
        lines = ["confusion (rows: gold, columns: predicted)", head + "recall".rjust(width)]
        for g, name in enumerate(self.names):
            total = sum(m[g])
            recall = f"{m[g][g] / total:.3f}" if total else "-"
            lines.append(name.ljust(first) + "".join(str(v).rjust(width) for v in m[g])
                         + recall.rjust(width))
        return lines

    def report_lines(self, *, show_rows: bool = True, eta: float | None = None) -> list[str]:
        """What a command prints: the summary, the first rows (``show_rows``), and for labelled
        input the accuracy (noting the queries' η) and the confusion table."""
        lines = [self.summary()]
        if show_rows:
            lines += self.first_rows()
        from rapt import numfmt

        acc = self.accuracy()
        if acc is not None:
            lines.append(f"accuracy {numfmt.pct(acc)} on {len(self)} examples"
                         + (f" (queries privatized with η = {numfmt.eta(eta)})" if eta else ""))
            if self.sources:
                lines.append("accuracy by model: " + ", ".join(
                    f"{s} {numfmt.pct(self.accuracy(s))}" for s in self.sources))
            lines += self.confusion_table()
        return lines


def write_predictions(path: Path | str, preds: Predictions) -> str:
    """Write ``preds`` to ``path`` in the format its suffix names; -> that format."""
    fmt = check_out_path(path)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(preds.render(fmt), encoding="utf-8")
    return fmt
