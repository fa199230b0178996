"""Kinds of token: how frequent a token's word is in public text, and whether it is personal data.

Context gives frequent words back to an attacker; the secrets in a text are its rare words and
its personal data. So a privacy figure is reported per kind of token:

* **frequency band** of the token's *word* in a public word list, never in the user's data:
  the 100 most frequent words, ranks 100-1,000, 1,000-10,000, and rarer ones (including every
  word the list does not hold) (:mod:`rapt.privacy.public_words`: counted on public text
  disjoint from the evaluation tasks). Every word piece of a word has the word's band.
* **personal data**: the token overlaps a span that Presidio finds
  (:mod:`rapt.privacy.personal_data`); spans are mapped to word pieces by the fast
  tokenizer's character offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rapt.privacy.personal_data import PersonalDataDetector, PersonalSpan
from rapt.privacy.public_words import (
    BAND_EDGES,
    BANDS,
    PUBLIC_WORD_SOURCES,
    WordFrequencies,
    count_words,
    load_word_frequencies,
    normalize_word,
    public_word_texts,
    word_spans,
    write_word_frequencies,
)

# The word list's names are re-exported: kinds is where callers have long found them.
__all__ = ["BANDS", "BAND_EDGES", "PUBLIC_WORD_SOURCES", "TokenKinds", "WordFrequencies",
           "count_words", "load_word_frequencies", "normalize_word", "public_word_texts",
           "token_kinds", "word_spans", "write_word_frequencies"]


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
