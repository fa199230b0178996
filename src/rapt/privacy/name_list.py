"""Names found by list, not by capital letters: the 1990 US Census name lists as a recognizer.

spaCy's small English model finds a name by its shape in cased text; in lower-cased text
(SST-2, hurried tickets) it marked no copy of ``emily walker`` planted 16 times, and the
nearest-neighbour attacker read the name back whole from a by-kind release
(``benchmarks/results/canaries_default_denoiser_lowercase.md``). This recognizer reads the
words themselves against the Census Bureau's 1990 lists of given names (male and female) and
surnames (public domain; shipped as data files in the ``names`` package, MIT, pinned in
pyproject). Words are normalized as :mod:`rapt.privacy.public_words` does (lower case, no
accents), so case plays no part. It marks as PERSON:

* a given name followed by a surname (``emily walker``), score :data:`PAIR_SCORE`;
* a title (``mr``, ``mrs``, ``ms``, ``miss``, ``dr``, ``prof``, with or without a full stop)
  followed by a surname, the surname only, score :data:`PAIR_SCORE`;
* a given name alone when its word is not among rapt's :data:`FREQUENT_RANK` most frequent
  public words (``emily``, ``sarah``: yes; ``john``, ``will``, ``may``: no) and not an
  adjective, adverb or verb of WordNet (the lemma lists inside spaCy's English model, when it
  is installed: ``rose``, ``frank``, ``mark``, ``grace`` are not marked alone), score
  :data:`SINGLE_SCORE`; never a month (``april``, ``june``).

A given name counts when at least :data:`MIN_FIRST_SHARE` % of people bore it (1,056 names,
90 % of the list's people): rarer entries are mostly common words ("precious", "golden",
"brain"). No word among the 100 most frequent public words is marked. What this misses:
names outside the lists (most names not common in the US in 1990), a surname alone, and a
given name that is also a frequent or common word ("john" alone, in clear under
``--protect rare``; "mark" alone). What it marks wrongly: nouns that are also given names
("faith", "penny", "crystal" alone), and a given name
before a word that is also a surname. Under the default those words are protected as rare
words anyway, so the cost is the share of them that noise at P 0.7 kept
(``benchmarks/results/name_list.md`` counts what the lists add).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from rapt.privacy.public_words import (
    WordFrequencies,
    load_word_frequencies,
    word_spans,
)

__all__ = ["FREQUENT_RANK", "MIN_FIRST_SHARE", "MONTHS", "PAIR_SCORE", "SINGLE_SCORE", "TITLES",
           "CensusNames", "find_names", "load_census_names", "name_list_recognizer"]

MIN_FIRST_SHARE = 0.02  # % of people
FREQUENT_RANK = 1_000  # a given name alone is marked only outside this many public words
PAIR_SCORE = 0.6
SINGLE_SCORE = 0.4
TITLES = frozenset({"mr", "mrs", "ms", "miss", "dr", "prof"})
# Given names that are months: dates, which Presidio's DATE_TIME finds where they are dates.
MONTHS = frozenset({"january", "february", "march", "april", "may", "june", "july",
                    "august", "september", "october", "november", "december"})
_FILES = {"first": ("dist.male.first", "dist.female.first"), "last": ("dist.all.last",)}
_SOURCE = "US Census Bureau 1990 name lists (public domain), from the `names` package 0.3.0"


@dataclass(frozen=True)
class CensusNames:
    """``first``: given name -> the largest share (% of people) of the male and female lists;
    ``last``: surname -> share (%). Names lower-cased."""

    first: Mapping[str, float]
    last: Mapping[str, float]

    @property
    def record(self) -> dict:
        return {"source": _SOURCE, "first_names": sum(v >= MIN_FIRST_SHARE
                                                      for v in self.first.values()),
                "surnames": len(self.last), "min_first_share_percent": MIN_FIRST_SHARE}


def load_census_names() -> CensusNames:
    """The lists as the ``names`` package ships them: ``NAME  share  cumulative  rank`` lines."""
    from importlib.resources import files

    try:
        root = files("names")
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("the Census name lists come from the `names` package "
                                  "(pip install names==0.3.0; `make install` installs it)") from e
    out: dict[str, dict[str, float]] = {}
    for kind, names in _FILES.items():
        table = out.setdefault(kind, {})
        for name in names:
            for n, line in enumerate(root.joinpath(name).read_text().splitlines(), 1):
                parts = line.split()
                if not parts:
                    continue
                if len(parts) != 4:
                    raise ValueError(f"names/{name}, line {n}: expected 4 fields, got {line!r}")
                word, share = parts[0].lower(), float(parts[1])
                table[word] = max(table.get(word, 0.0), share)
    return CensusNames(out["first"], out["last"])


def find_names(text: str, names: CensusNames, frequencies: WordFrequencies,
               not_alone: Collection[str] = ()) -> list[tuple[int, int, float]]:
    """(start, end, score) of every name the rules of this module find in ``text``, by start;
    characters ``start:end`` of ``text``. ``not_alone``: words never marked as a given name
    standing alone (common words that are also names)."""
    words = word_spans(text)
    top100 = [frequencies.in_top(w, 100) for _, _, w in words]  # never part of a name
    found, i = [], 0
    while i < len(words):
        start, end, w = words[i]
        nxt = words[i + 1] if i + 1 < len(words) else None
        surname_next = nxt is not None and nxt[2] in names.last and not top100[i + 1]
        is_first = names.first.get(w, 0.0) >= MIN_FIRST_SHARE and not top100[i]
        if is_first and surname_next:
            found.append((start, nxt[1], PAIR_SCORE))
            i += 2
            continue
        if w in TITLES:  # "mr smith", "Dr. Walker"
            j = i + 2 if nxt is not None and nxt[2] == "." else i + 1
            if j < len(words) and words[j][2] in names.last and not top100[j]:
                found.append((words[j][0], words[j][1], PAIR_SCORE))
                i = j + 1
                continue
        if (is_first and not frequencies.in_top(w, FREQUENT_RANK) and w not in not_alone
                and w not in MONTHS):
            found.append((start, end, SINGLE_SCORE))
        i += 1
    return found


def name_list_recognizer(frequencies: WordFrequencies | None = None,
                         not_alone: Collection[str] = ()):
    """A Presidio recognizer (entity PERSON, name ``NameListRecognizer``) running
    :func:`find_names` with rapt's public word list (default: the bundled one); its ``record``
    says what it read."""
    from presidio_analyzer import EntityRecognizer, RecognizerResult

    # A recognizer of our own, not Presidio's PatternRecognizer(deny_list=...): that compiles
    # the 90k names into one regular expression and has no rule for pairs, titles or how
    # frequent a word is in public text.
    names = load_census_names()
    freq = frequencies if frequencies is not None else load_word_frequencies()
    not_alone = frozenset(not_alone)

    class NameListRecognizer(EntityRecognizer):
        def load(self) -> None:  # the lists are read above, once
            pass

        def analyze(self, text, entities, nlp_artifacts=None):
            if "PERSON" not in entities:
                return []
            meta = {RecognizerResult.RECOGNIZER_NAME_KEY: self.name,
                    RecognizerResult.RECOGNIZER_IDENTIFIER_KEY: self.id}
            return [RecognizerResult("PERSON", s, e, score, recognition_metadata=dict(meta))
                    for s, e, score in find_names(text, names, freq, not_alone)]

    rec = NameListRecognizer(supported_entities=["PERSON"], name="NameListRecognizer")
    rec.record = {**names.record, "not_alone_words": len(not_alone)}
    # The rules' own findings, before Presidio merges them with spaCy's (benchmarks compare).
    rec.find = lambda text: find_names(text, names, freq, not_alone)
    return rec
