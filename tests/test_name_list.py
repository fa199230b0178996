"""Names found by the Census name lists (rapt.privacy.name_list): the rules on hand-made lists,
the real lists, and the recognizer inside Presidio, whatever the text's case."""

from __future__ import annotations

import pytest

from rapt.privacy.name_list import (
    MIN_FIRST_SHARE,
    PAIR_SCORE,
    SINGLE_SCORE,
    CensusNames,
    find_names,
    load_census_names,
)
from rapt.privacy.public_words import WordFrequencies

# Hand-made lists: "will" and "john" are frequent public words (top 100 and 100-1k), "emily"
# is rare; "precious" was borne by too few people to count as a given name.
NAMES = CensusNames(first={"emily": 0.2, "john": 3.3, "will": 0.1, "sarah": 0.5,
                           "precious": MIN_FIRST_SHARE / 4},
                    last={"walker": 0.2, "smith": 1.0, "little": 0.05, "the": 0.001})


def _freq() -> WordFrequencies:
    counts = {f"w{i}": 10_000 - i for i in range(1_200)}
    counts.update({"will": 9_999_999, "the": 9_999_998, "john": 9_500})  # top 100, 100-1k
    return WordFrequencies(counts)


def _found(text: str) -> list[tuple[str, float]]:
    return [(text[s:e], score) for s, e, score in find_names(text, NAMES, _freq())]


def test_a_given_name_and_a_surname_make_one_person_whatever_the_case():
    assert _found("emily walker wrote to us") == [("emily walker", PAIR_SCORE)]
    assert _found("EMILY WALKER wrote") == [("EMILY WALKER", PAIR_SCORE)]
    # a frequent given name still counts with a surname after it
    assert _found("ask john smith") == [("john smith", PAIR_SCORE)]


def test_a_title_marks_the_surname_after_it():
    assert _found("please forward this to mr smith .") == [("smith", PAIR_SCORE)]
    assert _found("Dr. Walker said") == [("Walker", PAIR_SCORE)]
    assert _found("mr the") == []


def test_a_given_name_alone_is_marked_only_outside_the_frequent_public_words():
    assert _found("call emily tomorrow") == [("emily", SINGLE_SCORE)]
    assert _found("call john tomorrow") == []  # among the 1,000 most frequent public words
    assert _found("we will go") == []


def test_top_100_words_and_rare_given_names_are_never_names():
    assert _found("will smith") == []  # "will" is among the 100 most frequent words
    assert _found("emily the") == [("emily", SINGLE_SCORE)]  # "the" never a surname
    assert _found("precious little") == []  # too rare a given name


def test_the_census_lists_load_whole():
    names = load_census_names()
    assert len(names.last) == 88_799
    assert names.first["emily"] > MIN_FIRST_SHARE and names.last["walker"] > 0
    assert names.record["first_names"] == sum(v >= MIN_FIRST_SHARE for v in names.first.values())


@pytest.fixture(scope="module")
def detectors():
    pytest.importorskip("presidio_analyzer")
    from rapt.privacy.personal_data import PersonalDataDetector

    return (PersonalDataDetector(ner_model=None),
            PersonalDataDetector(ner_model=None, name_list=False))


def test_the_detector_finds_lower_case_names_by_list_and_only_with_it(detectors):
    with_list, without = detectors
    text = "emily walker wrote to us about the refund ."
    got = with_list.find(text)
    assert [(text[s.start:s.end], s.entity, s.recognizer) for s in got] == \
        [("emily walker", "PERSON", "NameListRecognizer")]
    assert without.find(text) == []
    assert "NameListRecognizer" in with_list.record["recognizers"]
    assert with_list.record["name_list"]["surnames"] == 88_799
    assert "PERSON" in with_list.record["entities"]
    assert without.record["name_list"] is None and "PERSON" not in without.record["entities"]


def test_a_common_word_that_is_also_a_name_is_not_marked_alone_but_is_in_a_pair():
    def found(text: str) -> list[str]:
        return [text[s:e] for s, e, _ in find_names(text, NAMES, _freq(), not_alone={"sarah"})]

    assert found("profits sarah sharply") == []
    assert found("sarah smith called") == ["sarah smith"]


def test_with_the_ner_model_the_wordnet_verbs_and_adjectives_are_not_names_alone():
    pytest.importorskip("presidio_analyzer")
    from rapt.privacy.personal_data import PersonalDataDetector

    det = PersonalDataDetector()
    if det.ner_model is None:
        pytest.skip("spaCy's English model is not installed (`make install` installs it)")
    assert det.record["name_list"]["not_alone_words"] > 10_000
    text = "operating profit rose to eur 13.1 mn , frank said emily ."
    listed = {text[s.start:s.end] for s in det.find(text) if s.recognizer == "NameListRecognizer"}
    assert "rose" not in listed and "frank" not in listed
