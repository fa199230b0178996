"""Kinds of token: how frequent a token's word is in public text, and whether it is personal data.

Context gives frequent words back to an attacker; the secrets in a text are its rare words and
its personal data. So a privacy figure is reported per kind of token:

* **frequency band** of the token's *word* in a public word list, never in the user's data:
  the 100 most frequent words, ranks 100-1,000, 1,000-10,000, and rarer ones (including every
  word the list does not hold). The list (``rapt/resources/public_word_counts.txt``) is
  counted on public text disjoint from the evaluation tasks (TREC, CB, TrustPilot and rapt's
  bundled public sample; never SST-2 or Financial PhraseBank): see its header for how it was
  made. A word is a run of letters and digits, or one punctuation character, lower-cased
  with accents removed, as BERT's uncased tokenizer splits words. Every word piece of a word
  has the word's band.
* **personal data**: the token overlaps a span that Presidio finds
  (:mod:`rapt.privacy.personal_data`); spans are mapped to word pieces by the fast
  tokenizer's character offsets.

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

from rapt.privacy.personal_data import PersonalDataDetector, PersonalSpan

__all__ = ["BANDS", "BAND_EDGES", "PUBLIC_WORD_SOURCES", "TokenKinds", "WordFrequencies",
           "count_words", "load_word_frequencies", "normalize_word", "public_word_texts",
           "token_kinds", "word_spans", "write_word_frequencies"]

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


@dataclass(frozen=True)
class TokenKinds:
    """Per text, per token (the tokenizer's ids without special tokens, as
    :func:`rapt.privacy.mechanism.tokenize_texts` gives them): ``bands`` (index into
    :data:`BANDS`), ``personal`` (inside a personal-data span), ``entities`` (that span's
    Presidio entity, "" outside one), ``words`` (index of the token's word in its text).
    ``spans``: Presidio's findings per text; ``detector``: what ran (None: no detection)."""

    ids: list[list[int]]
    bands: list[list[int]]
    personal: list[list[bool]]
    entities: list[list[str]]
    words: list[list[int]]
    spans: list[list[PersonalSpan]]
    detector: dict | None = None


def _word_of(start: int, end: int, words: list[tuple[int, int, str]], hint: int) -> int:
    """Index of the first word that the characters start:end overlap, searching from ``hint``
    (tokens come in order); the last word before ``start`` when none does."""
    i = hint
    while i < len(words) and words[i][1] <= start:
        i += 1
    if i < len(words) and words[i][0] < max(end, start + 1):
        return i
    return max(0, i - 1)


def _one_text(text: str, offsets, freq: WordFrequencies, spans: list[PersonalSpan]):
    words = word_spans(text)
    bands, personal, entities, index = [], [], [], []
    w = 0
    for start, end in offsets:
        w = _word_of(start, end, words, w) if words else -1
        index.append(w)
        bands.append(freq.band(words[w][2]) if w >= 0 else len(BANDS) - 1)
        hits = [s for s in spans if s.start < max(end, start + 1) and start < s.end]
        personal.append(bool(hits))
        entities.append(max(hits, key=lambda s: s.score).entity if hits else "")
    return bands, personal, entities, index


def token_kinds(texts: Sequence[str], tokenizer, frequencies: WordFrequencies | None = None,
                detector: PersonalDataDetector | None = None,
                spans: Sequence[Sequence[PersonalSpan]] | None = None) -> TokenKinds:
    """The kind of every token of ``texts``. ``frequencies``: the word list (default rapt's);
    personal data from ``spans`` when given, else found by ``detector``, else none. The
    tokenizer must be a fast one (it gives each token's character offsets)."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{type(tokenizer).__name__} is not a fast tokenizer: token kinds "
                         "need each token's character offsets (use_fast=True)")
    freq = frequencies if frequencies is not None else load_word_frequencies()
    if spans is None:
        spans = detector.find_all(texts) if detector is not None else [[] for _ in texts]
    if len(spans) != len(texts):
        raise ValueError(f"{len(spans)} span lists for {len(texts)} texts")
    enc = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
    out: tuple[list, ...] = ([], [], [], [])
    for text, offsets, found in zip(texts, enc["offset_mapping"], spans, strict=True):
        for acc, got in zip(out, _one_text(text, offsets, freq, list(found)), strict=True):
            acc.append(got)
    return TokenKinds([list(r) for r in enc["input_ids"]], *out,
                      [list(s) for s in spans], None if detector is None else detector.record)
