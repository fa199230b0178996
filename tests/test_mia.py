"""Prompt membership inference: AUC statistics and the attack on constructed scorers."""

from __future__ import annotations

import numpy as np
import pytest

from rapt.attacks.mia import (
    mean_roc,
    prompt_mia,
    roc_auc,
    roc_curve,
    student_mia,
    true_label_scores,
)
from rapt.pate.pate import PateInputError, PromptTemplate

TEMPLATE = PromptTemplate("text: {text} label:", (" no", " yes"))


class MemorizingScorer:
    """P(true label) = 0.9 for texts that appear in the prompt, else 0.6 ± noise."""

    label_words = [" no", " yes"]

    def __init__(self, labels: dict[str, int], seed: int = 0, leak: bool = True) -> None:
        self.labels, self.leak = labels, leak
        self.rng = np.random.default_rng(seed)

    def label_probs(self, prefix, suffixes):
        out = []
        for s in suffixes:
            text = s[len("text: "):-len(" label:")]
            member = self.leak and f"text: {text} label:" in prefix
            p = 0.9 if member else float(np.clip(0.6 + 0.1 * self.rng.standard_normal(), 0, 0.85))
            row = np.zeros(2)
            row[self.labels[text]] = p
            row[1 - self.labels[text]] = (1 - p) / 2
            out.append(row)
        return np.array(out)

    def top_labels(self, prefix, suffixes):
        return self.label_probs(prefix, suffixes).argmax(axis=1)


def _private(n: int = 120):
    return [(f"example {i}", i % 2, None) for i in range(n)]


def test_auc_definition_and_ties():
    assert roc_auc([3.0], [1.0, 2.0]) == 1.0
    assert roc_auc([0.0], [1.0, 2.0]) == 0.0
    assert roc_auc([1.0], [1.0]) == 0.5
    # hand count over the 2x3 pairs: 3 wins + 1 tie -> 3.5 / 6
    assert roc_auc([2.0, 5.0], [1.0, 2.0, 6.0]) == pytest.approx(3.5 / 6)
    with pytest.raises(ValueError):
        roc_auc([], [1.0])


def test_auc_random_scores_is_half():
    rng = np.random.default_rng(0)
    aucs = [roc_auc(rng.random(1), rng.random(50)) for _ in range(2000)]
    assert abs(np.mean(aucs) - 0.5) < 0.02
    assert abs(roc_auc(rng.random(4000), rng.random(4000)) - 0.5) < 0.02


def test_auc_matches_trapezoid_area_of_roc():
    rng = np.random.default_rng(1)
    m, n = rng.normal(1, 1, 30).round(1), rng.normal(0, 1, 40).round(1)  # with ties
    fpr, tpr = roc_curve(m, n)
    assert fpr[0] == tpr[0] == 0 and fpr[-1] == tpr[-1] == 1
    assert np.trapezoid(tpr, fpr) == pytest.approx(roc_auc(m, n))
    grid, mean_tpr = mean_roc([(fpr, tpr), (np.array([0, 1.0]), np.array([0, 1.0]))])
    assert mean_tpr[-1] == 1 and np.all(np.diff(mean_tpr) >= 0) and len(grid) == 101


def test_attack_perfect_on_memorizing_model():
    priv = _private()
    scorer = MemorizingScorer({t: y for t, y, _ in priv})
    res = prompt_mia(scorer, TEMPLATE, priv, n_prompts=20, shots=1, n_nonmembers=50, seed=0)
    assert res.aucs.shape == (20,) and np.all(res.aucs == 1.0)
    res4 = prompt_mia(scorer, TEMPLATE, priv, n_prompts=5, shots=4, n_nonmembers=30, seed=1)
    assert np.all(res4.aucs == 1.0) and all(len(m) == 4 for m in res4.member_scores)


def test_attack_chance_without_leak():
    priv = _private()
    scorer = MemorizingScorer({t: y for t, y, _ in priv}, leak=False)
    res = prompt_mia(scorer, TEMPLATE, priv, n_prompts=200, shots=1, n_nonmembers=50, seed=0)
    assert abs(res.mean_auc - 0.5) < 0.06
    s = res.summary()
    assert s["prompts"] == 200 and 0 <= s["mean_auc"] <= 1


def test_student_attack_sees_no_members():
    priv = _private()
    scorer = MemorizingScorer({t: y for t, y, _ in priv}, seed=3)
    student = [("a public text", 1, None)]
    scorer.labels["a public text"] = 1
    res = student_mia(scorer, TEMPLATE, student, priv[:60], priv[60:])
    assert 0.3 < res.mean_auc < 0.7  # private members are not in the student prompt


def test_mia_input_validation():
    priv = _private(10)
    scorer = MemorizingScorer({t: y for t, y, _ in priv})
    with pytest.raises(PateInputError, match="non-members"):
        prompt_mia(scorer, TEMPLATE, priv, n_prompts=2, shots=1, n_nonmembers=50)
    with pytest.raises(PateInputError):
        student_mia(scorer, TEMPLATE, [], [], priv)


def test_true_label_scores_exact():
    """The attack score is the raw P(true label word) from the prompted model (hand values);
    normalized=True renormalizes over the label words. Catches reading the wrong column (label
    index), the wrong row, or calibrating the scores."""

    class Fixed:
        label_words = [" no", " yes"]

        def __init__(self):
            self.calls = []

        def label_probs(self, prefix, suffixes):
            self.calls.append((prefix, list(suffixes)))
            rows = {"text: a label:": [0.2, 0.6], "text: b label:": [0.3, 0.1]}
            return np.array([rows[x] for x in suffixes])

    sc = Fixed()
    demos = [("a", 1, None)]
    cands = [("a", 1, None), ("b", 0, None), ("b", 1, None)]
    np.testing.assert_allclose(true_label_scores(sc, TEMPLATE, demos, cands), [0.6, 0.3, 0.1])
    assert sc.calls[0] == ("text: a label: yes\n\n",
                           ["text: a label:", "text: b label:", "text: b label:"])
    np.testing.assert_allclose(true_label_scores(sc, TEMPLATE, demos, cands, normalized=True),
                               [0.75, 0.75, 0.25])
