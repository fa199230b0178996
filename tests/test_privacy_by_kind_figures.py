"""Privacy figures per kind of token: the privacy report's ``by_kind`` (all tokens, rare words,
personal data, frequent words), the privacy line, the rule, and what the console shows."""

from __future__ import annotations

import pytest

from rapt.pipeline import Customization, Encoding
from rapt.privacy.by_kind import FREQUENT, PERSONAL, RARE
from rapt.privacy.kind_recovery import CLASS_KINDS, privacy_by_class, recovery_by_class
from rapt.stats import wilson_interval

TEXTS = ["the movie was good and fun", "a boring plot with bad actors", "really great music",
         "the worst film ever", "it was a nice story", "dull and weak scene"] * 4


def test_recovery_by_class_counts_each_class_and_skips_specials():
    # ids 0 special; classes: personal, rare, frequent
    original = [0, 5, 6, 7, 8, 9, 0]
    guessed = [0, 5, 1, 7, 8, 2, 0]
    classes = [PERSONAL, PERSONAL, PERSONAL, RARE, RARE, FREQUENT, PERSONAL]
    got = recovery_by_class(original, guessed, classes, special_ids=[0])
    assert got["all"]["n_tokens"] == 5 and got["all"]["recovered"] == 3
    assert got["personal"]["n_tokens"] == 2 and got["personal"]["recovery"] == 0.5
    assert got["rare"]["recovery"] == 1.0 and got["frequent"]["recovery"] == 0.0
    lo, hi = wilson_interval(1, 2)
    assert got["personal"]["recovery_ci95"] == [lo, hi]
    with pytest.raises(ValueError, match="align"):
        recovery_by_class([1, 2], [1], [0, 0])


def test_a_kind_with_no_token_is_none_never_zero():
    rep = privacy_by_class([5, 6], [5, 7], [5, 6], [RARE, RARE], frequent_rank=1000)
    assert set(rep) == set(CLASS_KINDS)
    for kind in ("personal", "frequent"):
        assert rep[kind]["n_tokens"] == 0
        assert rep[kind]["empirical_privacy"] is None and rep[kind]["inversion_success"] is None
        assert rep[kind]["replacement_probability"] is None
        assert "no token" in rep[kind]["note"]
    rare = rep["rare"]
    assert rare["replacement_probability"] == 0.5 and rare["inversion_success"] == 1.0
    assert rare["empirical_privacy"] == 0.0 and rare["attacker"] == "nearest neighbour"
    lo, hi = wilson_interval(2, 2)
    assert rare["empirical_privacy_ci95"] == [1 - hi, 1 - lo]
    assert "1,000 most frequent public words" in rare["counts"]


def _classes_for(rows, special):
    """A made-up class per position: specials personal (as row_noise gives them), then
    personal, rare, frequent in turn."""
    return [[PERSONAL if t in special else (i % 3) for i, t in enumerate(r)] for r in rows]


@pytest.mark.parametrize("plain", [0, 3])
def test_measure_reports_each_kind_on_the_text_positions(tiny_bert, plain):
    tok = tiny_bert.tokenizer
    enc = (Encoding.sampled(tok, 32 + plain, plain, 1, len(TEXTS), seed=0) if plain
           else Encoding(32))
    custom = Customization.create(tiny_bert, enc, eta=120.0, noise_seed=1,
                                  privatizer_mode="exact")
    clean = custom.rows(TEXTS)
    private = custom.privatize(clean, measure=False)
    special = set(int(i) for i in tiny_bert.special_ids)
    classes = _classes_for(clean, special)
    rep = custom.measure(clean, private, classes=classes)
    by = rep["by_kind"]
    assert by["all"]["n_tokens"] == rep["n_tokens"]
    assert by["all"]["replacement_probability"] == pytest.approx(rep["replacement_probability"])
    assert by["all"]["inversion_success"] == pytest.approx(rep["inversion_success"])
    # brute force over the text positions
    tc, tp = enc.text_only(tok, clean), enc.text_only(tok, private)
    tcls = enc.text_only(tok, classes)
    for kind, c in (("personal", PERSONAL), ("rare", RARE), ("frequent", FREQUENT)):
        pairs = [(a, b) for r, s, k in zip(tc, tp, tcls, strict=True)
                 for a, b, x in zip(r, s, k, strict=True) if a not in special and x == c]
        assert by[kind]["n_tokens"] == len(pairs) > 0
        changed = sum(a != b for a, b in pairs) / len(pairs)
        assert by[kind]["replacement_probability"] == pytest.approx(changed)
        # nearest neighbour of an output token is that token: it recovers the unchanged ones
        assert by[kind]["empirical_privacy"] == pytest.approx(changed)
    assert sum(by[k]["n_tokens"] for k in ("personal", "rare", "frequent")) == rep["n_tokens"]


def test_measure_without_classes_has_no_figures_by_kind(tiny_bert):
    custom = Customization.create(tiny_bert, Encoding(32), eta=120.0, noise_seed=1,
                                  privatizer_mode="exact")
    custom.privatize(custom.rows(TEXTS[:3]))
    assert custom.privacy["by_kind"] is None
    assert {"eta", "replacement_probability", "inversion_success", "n_tokens"} <= set(
        custom.privacy)


class _Oracle:
    """A channel model that reads back the clean text of ``rows`` (an attacker stronger than
    nearest neighbour on every kind)."""

    attacker = "oracle"

    def __init__(self, text_rows):
        self.text_rows = text_rows

    def prepare_rows(self, texts):
        return [list(self.text_rows[i][:len(t)]) for i, t in enumerate(texts)]

    def reader(self, backbone):
        return backbone


def test_a_stronger_channel_sets_each_kinds_empirical_privacy(tiny_bert):
    custom = Customization.create(tiny_bert, Encoding(32), eta=120.0, noise_seed=1,
                                  privatizer_mode="exact")
    clean = custom.rows(TEXTS)
    private = custom.privatize(clean, measure=False)
    special = set(int(i) for i in tiny_bert.special_ids)
    custom.channel = _Oracle([[t for t in r if t not in special] for r in clean])
    rep = custom.measure(clean, private, classes=_classes_for(clean, special))
    for kind in ("all", "personal", "rare", "frequent"):
        assert rep["by_kind"][kind]["attacker"] == "oracle"
        assert rep["by_kind"][kind]["empirical_privacy"] == 0.0
        assert rep["by_kind"][kind]["inversion_success"] < 1.0  # nearest neighbour's stays
        assert rep["channel"]["by_kind"][kind]["recovery"] == 1.0
