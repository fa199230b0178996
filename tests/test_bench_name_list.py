"""benchmarks/bench_name_list.py: its counts on hand-made detectors."""

from __future__ import annotations

from benchmarks.bench_name_list import markdown, one_task
from rapt.privacy.personal_data import PersonalSpan


class _Cased:
    """Finds "Emily Walker" only when capitalised, as spaCy's model tends to."""

    def find(self, text):
        i = text.find("Emily Walker")
        return [] if i < 0 else [PersonalSpan(i, i + 12, "PERSON", 0.85, "SpacyRecognizer")]


class _Lists:
    """Finds "walker" in any case, and "grace" (a false alarm)."""

    def names_by_list(self, text):
        low = text.lower()
        out = []
        for word in ("walker", "grace"):
            i = low.find(word)
            if i >= 0:
                out.append((i, i + len(word), 0.6))
        return out


def test_recall_in_lower_case_and_marks_beyond_spacy_are_counted_word_by_word():
    texts = ["Emily Walker wrote .", "with grace ."]
    r = one_task(texts, True, _Cased(), _Lists())
    assert r["reference_words"] == 2  # emily, walker
    assert r["lower_spacy"] == 0 and r["lower_list"] == 1 and r["lower_either"] == 1
    assert r["beyond_spacy"] == 1 and r["top_beyond"] == [("grace", 1)]
    assert r["words"] == 7
    doc = {"command": "c", "wall_s": 1.0, "machine": {"platform": "p"}, "spacy": "s",
           "row_limit": 2, "seed": 0,
           "name_list": {"source": "src", "first_names": 1, "surnames": 2,
                         "min_first_share_percent": 0.02},
           "results": [{"task": "t", **r}]}
    assert "| t | 2 | 7 | 2 | 0.0 % | 50.0 % | 50.0 % | 14.3 % | grace ×1 |" in markdown(doc)


def test_a_lower_case_task_has_no_reference():
    r = one_task(["emily walker wrote ."], False, _Cased(), _Lists())
    assert r["reference_words"] == 0 and r["beyond_spacy"] == 1
