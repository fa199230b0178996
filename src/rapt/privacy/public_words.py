"""rapt's public word list: how often each word occurs in public text, never the user's.

The list (``rapt/resources/public_word_counts.txt``) is counted on public text disjoint from
the evaluation tasks (TREC, CB, TrustPilot and rapt's bundled public sample; never SST-2 or
Financial PhraseBank): see its header for how it was made. A word is a run of letters and
digits, or one punctuation character, lower-cased with accents removed, as BERT's uncased
tokenizer splits words. :mod:`rapt.privacy.kinds` bands tokens by it; the name-list recognizer
(:mod:`rapt.privacy.name_list`) leaves frequent words alone by it.

Ties at a band's edge go to the rarer band: a word is among the K most frequent only when it
is counted more often than the word at rank K + 1, so the bands do not depend on how words
with equal counts happen to be ordered.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BANDS", "BAND_EDGES", "PUBLIC_WORD_SOURCES", "WordFrequencies", "count_words",
           "load_word_frequencies", "normalize_word", "public_word_texts", "word_spans",
           "write_word_frequencies"]

BAND_EDGES = (100, 1_000, 10_000)
BANDS = ("top 100", "100-1k", "1k-10k", "rarer")
RESOURCE = "resources/public_word_counts.txt"
# Public text for the word list: every split of the built-in families that are not evaluation
# tasks here (SST-2 and Financial PhraseBank are), plus the bundled public sample.
PUBLIC_WORD_SOURCES = (("trec", "train"), ("trec", "test"), ("cb", "train"), ("cb", "val"),
                       ("cb", "test"), ("trustpilot", "a"), ("trustpilot", "b"))
_WORD = re.compile(r"[^\W_]+|[^\w\s]|_")


def normalize_word(word: str) -> str:
    """Lower case without accents (``Café`` -> ``cafe``), as BERT's uncased tokenizer reads."""
    decomposed = unicodedata.normalize("NFD", word.lower())
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn")


def word_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, normalized word) of every word in ``text``, in order."""
    return [(m.start(), m.end(), normalize_word(m.group())) for m in _WORD.finditer(text)]


def count_words(texts: Iterable[str]) -> Counter[str]:
    """How often each normalized word occurs in ``texts``."""
    counts: Counter[str] = Counter()
    for t in texts:
        counts.update(w for _, _, w in word_spans(t))
    return counts


def public_word_texts() -> tuple[list[str], list[dict]]:
    """The public texts the word list is counted on (:data:`PUBLIC_WORD_SOURCES` and the
    bundled sample) -> (texts, one provenance record per source)."""
    from importlib.resources import files

    from rapt.data import load_dataset

    texts: list[str] = []
    record = []
    for name, split in PUBLIC_WORD_SOURCES:
        ds = load_dataset(name, split)
        got = [t for t in ds.texts if t] + [t for t in ds.text_pairs if t]
        texts.extend(got)
        record.append({"name": name, "split": split, "texts": len(got)})
    sample = files("rapt").joinpath("resources/public_sample.txt").read_text(encoding="utf-8")
    got = [t for t in sample.splitlines() if t.strip()]
    texts.extend(got)
    record.append({"name": "rapt/resources/public_sample.txt", "split": "all",
                   "texts": len(got)})
    return texts, record


@dataclass(frozen=True)
class WordFrequencies:
    """A public word list: ``counts`` (normalized word -> count) holds every word counted at
    least ``min_count`` times, so a word it lacks ranks below all of them. ``header``: the
    list's provenance lines."""

    counts: Mapping[str, int]
    min_count: int = 1
    header: tuple[str, ...] = ()
    _floors: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = sorted(self.counts.values(), reverse=True)
        # Count a word must exceed to be among the K most frequent: that of rank K + 1 (when
        # the list is shorter than K, every listed word is in: the rest were counted less).
        floors = tuple(ordered[k] if len(ordered) > k else self.min_count - 1
                       for k in BAND_EDGES)
        object.__setattr__(self, "_floors", floors)

    def band(self, word: str) -> int:
        """Index into :data:`BANDS` of a normalized word."""
        c = self.counts.get(word, 0)
        for i, floor in enumerate(self._floors):
            if c > floor:
                return i
        return len(BANDS) - 1

    def in_top(self, word: str, rank: int) -> bool:
        """True when the normalized ``word`` is among the ``rank`` most frequent listed words
        (``rank``: one of :data:`BAND_EDGES`)."""
        if rank not in BAND_EDGES:
            raise ValueError(f"rank must be one of {', '.join(map(str, BAND_EDGES))} (the "
                             f"list's band edges), got {rank}")
        return self.band(word) <= BAND_EDGES.index(rank)

    def band_sizes(self) -> dict[str, int]:
        """How many listed words fall in each band (the rarer band also holds every word the
        list lacks)."""
        sizes = Counter(self.band(w) for w in self.counts)
        return {name: sizes.get(i, 0) for i, name in enumerate(BANDS)}


def load_word_frequencies(path: str | Path | None = None) -> WordFrequencies:
    """A word list written by :func:`write_word_frequencies` (default: rapt's bundled one):
    ``# `` header lines (``# min_count: N`` among them), then ``word<TAB>count`` lines."""
    if path is None:
        from importlib.resources import files

        text, where = files("rapt").joinpath(RESOURCE).read_text(encoding="utf-8"), RESOURCE
    else:
        text, where = Path(path).read_text(encoding="utf-8"), str(path)
    header, counts, min_count = [], {}, 1
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            header.append(line[1:].strip())
            if line.startswith("# min_count:"):
                min_count = int(line.split(":", 1)[1])
            continue
        word, _, count = line.partition("\t")
        if not word or not count.strip().isdigit():
            raise ValueError(f"{where}, line {n}: expected 'word<TAB>count', got {line!r}")
        counts[word] = int(count)
    return WordFrequencies(counts, min_count, tuple(header))


def write_word_frequencies(path: str | Path, counts: Mapping[str, int], *, min_count: int,
                           header: Sequence[str]) -> Path:
    """Write the words counted at least ``min_count`` times, most frequent first (ties in
    alphabetical order), after ``header`` lines (each written as ``# line``)."""
    kept = sorted(((w, c) for w, c in counts.items() if c >= min_count),
                  key=lambda wc: (-wc[1], wc[0]))
    lines = [f"# {h}" for h in header] + [f"# min_count: {min_count}"]
    lines += [f"{w}\t{c}" for w, c in kept]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
