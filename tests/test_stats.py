"""rapt.stats (seed CIs, paired differences) and the identical-truncation helpers."""

from __future__ import annotations

import pytest


def test_mean_ci_matches_student_t():
    from rapt.stats import mean_ci

    m, h = mean_ci([0.6, 0.7, 0.8])
    # t_{0.975, 2} = 4.3027, s = 0.1, n = 3
    assert m == pytest.approx(0.7) and h == pytest.approx(4.3027 * 0.1 / 3 ** 0.5, rel=1e-4)
    assert mean_ci([0.5]) == (0.5, 0.0)
    with pytest.raises(ValueError):
        mean_ci([])


def test_paired_difference_uses_the_pairing():
    from rapt.stats import effect_word, paired_difference

    a = [0.60, 0.70, 0.80, 0.65, 0.75]
    b = [x - 0.02 for x in a]  # the same per seed, shifted: paired CI is tiny, unpaired wide
    d = paired_difference(a, b)
    assert d["mean_diff"] == pytest.approx(0.02) and d["ci95"] < 1e-9 and d["excludes_zero"]
    assert effect_word(d) == "helped"
    assert effect_word(paired_difference(b, a)) == "hurt"
    noisy = paired_difference([0.7, 0.6, 0.8], [0.6, 0.7, 0.75])
    assert not noisy["excludes_zero"] and effect_word(noisy) == "made no significant difference"
    assert not paired_difference([0.9], [0.1])["excludes_zero"]  # one seed proves nothing
    with pytest.raises(ValueError, match="one value per seed"):
        paired_difference([0.1, 0.2], [0.1])


def test_paired_difference_p_value_is_the_paired_t_test():
    from scipy import stats

    from rapt.stats import paired_difference

    a, b = [0.7, 0.6, 0.8, 0.72], [0.6, 0.7, 0.75, 0.6]
    d = paired_difference(a, b)
    want = stats.ttest_rel(a, b).pvalue
    assert d["p_value"] == pytest.approx(want)
    # the CI excludes 0 exactly when p < 0.05 (same t distribution)
    assert d["excludes_zero"] == (d["p_value"] < 0.05)
    assert paired_difference([0.9], [0.1])["p_value"] != paired_difference([0.9], [0.1])[
        "p_value"]  # nan: one seed has no test
    assert paired_difference([0.5, 0.6], [0.4, 0.5])["p_value"] == 0.0  # sd 0, mean 0.1


def test_holm_matches_the_step_down_procedure():
    from rapt.stats import holm

    # worked example: m = 4, sorted 0.01, 0.02, 0.03, 0.5 -> 0.04, 0.06, 0.06 (monotone), 0.5
    assert holm([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    assert holm([0.4, 0.9]) == pytest.approx([0.8, 0.9])  # capped at 1 only above it
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])
    out = holm([0.01, float("nan"), 0.04])  # nan does not count in m
    assert out[0] == pytest.approx(0.02) and out[2] == pytest.approx(0.04) and out[1] != out[1]
    assert holm([]) == []
    with pytest.raises(ValueError, match="p-values"):
        holm([0.1, 1.5])


class _Tok:
    """Whitespace tokenizer with [CLS]=1 ... [SEP]=2, ids = 10 + word length."""

    def __call__(self, texts, add_special_tokens=True, truncation=False, max_length=None):
        out = []
        for t in texts:
            ids = [1] + [10 + len(w) for w in t.split()] + [2]
            if truncation and max_length is not None and len(ids) > max_length:
                ids = ids[:max_length - 1] + [2]
            out.append(ids)
        return {"input_ids": out}


def test_text_length_for_and_identical_truncation(monkeypatch):
    from rapt.tuning import reconstruction as R

    monkeypatch.setattr(R, "plain_offset", lambda tok: 1)
    tok = _Tok()
    texts = ["a " * n for n in range(1, 21)]  # rows of 3..22 tokens
    n, whole = R.text_length_for(tok, texts, 0.95)
    assert n == 21 and whole == pytest.approx(0.95)
    assert R.text_length_for(tok, texts, 1.0) == (22, 1.0)
    with pytest.raises(ValueError):
        R.text_length_for(tok, texts, 0.0)
    plain = [7, 8, 9]
    with_k = R.build_rows(tok, texts, n + 3, plain)
    without = R.build_rows(tok, texts, n)
    assert R.drop_plain(with_k, tok, 3) == without  # the same text, cut at the same place
    assert all(r[1:4] == plain for r in with_k)


def test_builtin_label_descriptions():
    from rapt.data import BUILTINS, label_descriptions_for

    assert label_descriptions_for("sst2-sentences") == ["a negative review", "a positive review"]
    assert label_descriptions_for("my_file.csv") is None and label_descriptions_for("trec") is None
    for name, b in BUILTINS.items():  # one description per label wherever there are any
        assert not b.descriptions or len(b.descriptions) == len(b.label_names), name
