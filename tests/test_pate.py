"""PromptPATE: teachers, calibration, voting, student selection, end-to-end, input checks."""

from __future__ import annotations

import numpy as np
import pytest
from _tiny import make_word_llama

from rapt.gnmax import GNMaxConfig
from rapt.pate import (
    PateInputError,
    PromptTemplate,
    PublicSet,
    calibrate,
    make_teachers,
    pate_experiment,
    prompt_probs,
    run_pate,
    select_student,
    teacher_votes,
    validate_inputs,
)

POS = ["good", "great", "fun", "brilliant", "best", "nice", "funny", "fine"]
NEG = ["bad", "awful", "boring", "terrible", "worst", "poor", "weak", "dull"]



def sentiment_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        y = int(rng.integers(2))
        w = rng.choice(POS if y else NEG, size=2)
        out.append((f"the movie was {w[0]} and {w[1]}", y, None))
    return out


class KeywordScorer:
    """An oracle LLM: P(positive) from keyword counts, noisy per prompt; counts calls."""

    label_words = ["bad", "good"]

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.calls: list[tuple[str, int]] = []

    def label_probs(self, prefix, suffixes):
        self.calls.append((prefix, len(suffixes)))
        bias = self.rng.normal(0, 0.3)
        out = []
        for s in suffixes:
            score = sum(w in s.split() for w in POS) - sum(w in s.split() for w in NEG) + bias
            p = 1 / (1 + np.exp(-2 * score))
            out.append([0.4 * (1 - p), 0.4 * p])
        return np.array(out)

    def top_labels(self, prefix, suffixes):
        return self.label_probs(prefix, suffixes).argmax(axis=1)


TEMPLATE = PromptTemplate("{text} it was", ("bad", "good"))


def test_teachers_disjoint_and_sized():
    t = make_teachers(100, 12, 3, seed=0)
    flat = [i for ti in t for i in ti]
    assert len(t) == 12 and all(len(ti) == 3 for ti in t)
    assert len(set(flat)) == len(flat) == 36 and max(flat) < 100
    assert t == make_teachers(100, 12, 3, seed=0) and t != make_teachers(100, 12, 3, seed=1)
    with pytest.raises(PateInputError, match="need 36 private examples, only 35"):
        make_teachers(35, 12, 3)


def test_contextual_calibration_hand_case():
    p = np.array([[0.6, 0.2], [0.3, 0.3]])
    cf = np.array([[0.3, 0.1]])  # content-free input leans 3:1 to label 0
    np.testing.assert_allclose(calibrate(p, cf), [[0.5, 0.5], [0.25, 0.75]])


def test_prompt_and_template():
    demos = [("fun", 1, None), ("dull", 0, None)]
    assert TEMPLATE.prefix(demos) == "fun it wasgood\n\ndull it wasbad\n\n"
    sc = KeywordScorer()
    p = prompt_probs(sc, TEMPLATE, [("fun", 1, None)], [("good fun", None), ("bad", None)])
    assert p.shape == (2, 2) and np.allclose(p.sum(axis=1), 1)
    assert sc.calls[-1][1] == 3  # content-free input rides in the same call as the queries


def test_teacher_votes_and_student_never_sees_private():
    priv = sentiment_data(60, 0)
    pub = [(t, None) for t, _, _ in sentiment_data(40, 1)]
    sc = KeywordScorer()
    teachers = [[priv[i] for i in t] for t in make_teachers(len(priv), 10, 2)]
    votes, probs = teacher_votes(sc, TEMPLATE, teachers, pub)
    assert votes.shape == (10, 40) and probs.shape == (10, 40, 2)
    run = run_pate(sc, TEMPLATE, priv, pub, GNMaxConfig(threshold=7, sigma1=1, sigma2=1),
                   n_teachers=10, shots=2, n_candidates=5, votes=votes, seed=0)
    assert run.student is not None and 0 < len(run.released) <= 40
    pub_texts = {t for t, _ in pub}
    priv_texts = {t for t, _, _ in priv} - pub_texts
    assert all(d[0] in pub_texts for d in run.student.demos)
    # no private text is ever in a student-selection prompt or query
    student_calls = sc.calls[-run.student.candidates:]
    assert not any(t in prefix for prefix, _ in student_calls for t in priv_texts)


def test_select_student_validation():
    with pytest.raises(PateInputError, match="too few"):
        select_student(KeywordScorer(), TEMPLATE, [("good", 1, None)])


def test_validate_inputs():
    with pytest.raises(PateInputError, match="public set is empty"):
        validate_inputs(100, 10, 1, 0)
    with pytest.raises(PateInputError, match="private examples"):
        validate_inputs(10, 10, 2, 5)
    with pytest.raises(PateInputError, match="label words"):
        validate_inputs(100, 10, 1, 5, template=TEMPLATE, num_labels=3)


def test_end_to_end_tiny_llama():
    from rapt.attacks.mia import student_mia
    from rapt.llm import HFLabelScorer

    bb = make_word_llama()
    sc = HFLabelScorer(bb, ["bad", "good"], batch_size=8)
    priv, test = sentiment_data(40, 0), sentiment_data(16, 2)
    iid = sentiment_data(24, 1)
    pubs = [PublicSet("iid", [(t, None) for t, _, _ in iid], [y for _, y, _ in iid]),
            PublicSet("ood", [("the plot was long", None), ("music and story", None)] * 6)]
    cfg = GNMaxConfig(threshold=3, sigma1=1.0, sigma2=1.0, delta=1e-6)
    res = pate_experiment(sc, TEMPLATE, priv, test, pubs, cfg, n_teachers=8, shots=2,
                          n_candidates=3, max_val=6, seed=0)
    assert set(res["runs"]) == {"iid", "ood"}
    for row in res["runs"].values():
        assert row["queried"] == (24 if row["public"] == "iid" else 12)
        assert row["epsilon"] > 0 and np.isfinite(row["epsilon"])
    for key in ("zero_shot_acc", "ensemble_acc", "best_private"):
        assert key in res
    assert 0 <= res["best_private"]["test_acc"] <= 1
    # the student prompt holds no private example: the MIA runs against it
    demos = res["runs"]["iid"]["student_demos"]
    if demos:
        m = student_mia(sc, TEMPLATE, [tuple(d) for d in demos], priv[:16], priv[16:])
        assert 0 <= m.mean_auc <= 1


def test_cli_rejects_bad_inputs_before_work(shared_data, monkeypatch):
    from typer.testing import CliRunner

    import rapt.cli.pate_cmd as cmd
    from rapt.cli import app

    def no_model(*a, **k):
        raise AssertionError("model loaded before input validation")

    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    monkeypatch.setattr(cmd, "_scorer", no_model)
    r = CliRunner().invoke(app, ["pate", "--task", "trec", "--teachers", "3000", "--shots", "2",
                                 "--queries", "10", "--public", "iid"])
    assert r.exit_code == 2 and "private examples" in r.output
    r = CliRunner().invoke(app, ["pate", "--task", "trec", "--queries", "0"])
    assert r.exit_code == 2 and "public set is empty" in r.output
    r = CliRunner().invoke(app, ["pate", "--task", "trec", "--label-words", "a,b",
                                 "--queries", "5", "--public", "iid"])
    assert r.exit_code == 2 and "label words" in r.output
    r = CliRunner().invoke(app, ["mia", "--task", "cb", "--nonmembers", "5000"])
    assert r.exit_code == 2 and "non-members" in r.output


class FakeLLM:
    """Stands in for the LLM in CLI tests: deterministic pseudo-probabilities per text."""

    def __init__(self, words) -> None:
        self.label_words = list(words)

    def label_probs(self, prefix, suffixes):
        out = []
        for s in suffixes:
            r = np.random.default_rng(abs(hash((prefix[-20:], s))) % 2**32)
            out.append(r.dirichlet(np.ones(len(self.label_words))) * 0.5)
        return np.array(out)

    def top_labels(self, prefix, suffixes):
        return self.label_probs(prefix, suffixes).argmax(axis=1)


def test_cli_pate_and_mia_end_to_end(shared_data, monkeypatch, tmp_path):
    import json

    from typer.testing import CliRunner

    import rapt.cli.pate_cmd as cmd
    from rapt.cli import app

    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    monkeypatch.setattr(cmd, "_scorer", lambda backbone, words, bs: FakeLLM(words))
    out = tmp_path / "pate.json"
    r = CliRunner().invoke(app, ["pate", "--task", "sst2-sentences", "--teachers", "5",
                                 "--queries", "8", "--test-size", "6", "--candidates", "2",
                                 "--max-val", "3", "--threshold", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rep = json.loads(out.read_text())
    assert set(rep["runs"]) == {"sst2-sentences (IID)", "trustpilot (OOD)"}
    assert rep["test_size"] == 6 and rep["sigma2"] == 0.5 and rep["delta"] == 1e-6
    flat = [i for t in rep["teacher_indices"] for i in t]
    assert len(flat) == len(set(flat)) == 5
    out2 = tmp_path / "mia.json"
    r = CliRunner().invoke(app, ["mia", "--task", "trec", "--prompts", "3", "--nonmembers", "4",
                                 "--out", str(out2)])
    assert r.exit_code == 0, r.output
    mia = json.loads(out2.read_text())
    assert mia["prompts"] == 3 and len(mia["aucs"]) == 3 and len(mia["mean_roc"]["fpr"]) == 101


def test_top_token_only_votes():
    from rapt.gnmax import vote_counts
    from rapt.llm import HFLabelScorer

    sc = HFLabelScorer(make_word_llama(), ["bad", "good"])
    priv = sentiment_data(12, 0)
    pub = [(t, None) for t, _, _ in sentiment_data(5, 1)]
    teachers = [[priv[i] for i in t] for t in make_teachers(len(priv), 4, 2)]
    votes, probs = teacher_votes(sc, TEMPLATE, teachers, pub, top_token_only=True)
    assert probs is None and votes.shape == (4, 5) and set(votes.ravel()) <= {-1, 0, 1}
    counts = vote_counts(votes, 2)
    assert np.all(counts.sum(axis=1) == (votes >= 0).sum(axis=0))
