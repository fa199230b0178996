"""PromptPATE: teachers, calibration, voting, student selection, end-to-end, input checks."""

from __future__ import annotations

import numpy as np
import pytest
from _tiny import make_word_llama

from rapt.pate.gnmax import ConfidentGNMax, GNMaxConfig, vote_counts
from rapt.pate.pate import (
    PateInputError,
    PromptTemplate,
    PublicSet,
    calibrate,
    compose_epsilon,
    epsilon_from_rdp,
    make_teachers,
    pate_experiment,
    prompt_probs,
    rdp_data_independent_release,
    release_noise_seeds,
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


class FixedScorer:
    """Known raw label probabilities per query text (rows need not sum to 1); records calls."""

    label_words = ["bad", "good"]

    def __init__(self, rows: dict[str, list[float]]) -> None:
        self.rows = rows
        self.calls: list[tuple[str, list[str]]] = []

    def label_probs(self, prefix, suffixes):
        self.calls.append((prefix, list(suffixes)))
        return np.array([self.rows[s] for s in suffixes], dtype=float)

    def top_labels(self, prefix, suffixes):
        return self.label_probs(prefix, suffixes).argmax(axis=1)


# Content-free "N/A it was" leans 3:1 to "bad". Query 1 leans 3:2 to "bad" before calibration and
# to "good" after it; query 2 leans to "good" either way. By hand (normalize, divide by the
# normalized content-free row [3/4, 1/4], normalize):
#   q1: [0.6, 0.4] / [0.75, 0.25] = [0.8, 1.6]  -> [1/3, 2/3]
#   q2: [0.25, 0.75] / [0.75, 0.25] = [1/3, 3] -> [0.1, 0.9]
FIXED_ROWS = {"N/A it was": [0.3, 0.1], "meh it was": [0.3, 0.2], "fun it was": [0.1, 0.3]}


def test_prompt_and_template():
    """prompt_probs calibrates each query by the content-free row, checked against hand values.
    Catches: calibrating by a query row (raw[1:2] or raw[-1:]) instead of raw[:1], dropping
    calibration, or returning the content-free row among the outputs."""
    demos = [("fun", 1, None), ("dull", 0, None)]
    assert TEMPLATE.prefix(demos) == "fun it wasgood\n\ndull it wasbad\n\n"
    sc = FixedScorer(FIXED_ROWS)
    p = prompt_probs(sc, TEMPLATE, [("fun", 1, None)], [("meh", None), ("fun", None)])
    np.testing.assert_allclose(p, [[1 / 3, 2 / 3], [0.1, 0.9]], rtol=1e-12)
    # one call: the content-free input first, then the queries, after the demo prefix
    assert sc.calls == [("fun it wasgood\n\n", ["N/A it was", "meh it was", "fun it was"])]
    raw = prompt_probs(sc, TEMPLATE, [], [("meh", None), ("fun", None)], calibrated=False)
    np.testing.assert_allclose(raw, [[0.6, 0.4], [0.25, 0.75]], rtol=1e-12)
    # the teachers vote with the calibrated argmax: query 1 flips from "bad" to "good"
    votes, probs = teacher_votes(sc, TEMPLATE, [[("fun", 1, None)], [("dull", 0, None)]],
                                 [("meh", None), ("fun", None)])
    np.testing.assert_array_equal(votes, [[1, 1], [1, 1]])
    np.testing.assert_allclose(probs[1], [[1 / 3, 2 / 3], [0.1, 0.9]], rtol=1e-12)
    votes_raw, _ = teacher_votes(sc, TEMPLATE, [[("fun", 1, None)]],
                                 [("meh", None), ("fun", None)], calibrated=False)
    np.testing.assert_array_equal(votes_raw, [[0, 1]])


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
    """pate_experiment's report: the private release (composed ε over both public sets from the
    same teachers, data-independent ε, δ, seeded) is apart from the not-private diagnostics."""
    from rapt.attacks.mia import student_mia
    from rapt.pate.scorer import HFLabelScorer

    bb = make_word_llama()
    sc = HFLabelScorer(bb, ["bad", "good"], batch_size=8)
    priv, test = sentiment_data(40, 0), sentiment_data(16, 2)
    iid = sentiment_data(24, 1)
    pubs = [PublicSet("iid", [(t, None) for t, _, _ in iid], [y for _, y, _ in iid]),
            PublicSet("ood", [("the plot was long", None), ("music and story", None)] * 6)]
    cfg = GNMaxConfig(threshold=3, sigma1=1.0, sigma2=1.0, delta=1e-6)
    res = pate_experiment(sc, TEMPLATE, priv, test, pubs, cfg, n_teachers=8, shots=2,
                          n_candidates=3, max_val=6, seed=0)
    rel, diag = res["private_release"], res["diagnostics_not_private"]
    assert set(rel["students"]) == set(diag["runs"]) == {"iid", "ood"}
    assert rel["seeded"] is False and res["seeded"] is False and "warning" not in rel
    assert rel["delta"] == 1e-6 and rel["releases_composed"] == 2
    assert "not differentially private" in rel["note"].replace("NOT", "not")
    assert diag["epsilon"] == "infinite" and "NOT covered" in diag["note"]
    # nothing computed straight from the votes or private data sits in the release
    flat = repr(rel)
    for key in ("epsilon_curve", "consensus", "teacher_indices", "zero_shot_acc",
                "best_private", "ensemble_acc", "student_test_acc", "candidate_val_acc"):
        assert key not in flat and key in repr(diag)
    assert "epsilon" not in repr(rel["students"])  # only the composed ε is released
    for name, st in rel["students"].items():
        d = diag["runs"][name]
        assert st["queried"] == (24 if name == "iid" else 12)
        assert d["epsilon_alone"] > 0 and np.isfinite(d["epsilon_alone"])
        assert d["epsilon_alone"] <= d["epsilon_data_independent_alone"]
        assert len(d["epsilon_curve"]) == st["queried"]
        assert d["epsilon_curve"][-1] == pytest.approx(d["epsilon_alone"])
    # two students from the same teachers: ε composes (more than either release alone)
    assert rel["epsilon"] > max(d["epsilon_alone"] for d in diag["runs"].values())
    assert rel["epsilon_data_independent"] > max(
        d["epsilon_data_independent_alone"] for d in diag["runs"].values())
    assert rel["epsilon"] <= rel["epsilon_data_independent"]
    assert 0 <= diag["best_private"]["test_acc"] <= 1
    # the student prompt holds no private example: the MIA runs against it
    demos = rel["students"]["iid"]["student_demos"]
    if demos:
        assert rel["students"]["iid"]["student_prompt"] == TEMPLATE.prefix(
            [tuple(d) for d in demos])
        m = student_mia(sc, TEMPLATE, [tuple(d) for d in demos], priv[:16], priv[16:])
        assert 0 <= m.mean_auc <= 1


def _tied_votes(n_teachers: int = 10, n_queries: int = 60) -> np.ndarray:
    """Half the teachers vote 0, half vote 1, on every query: each label is a coin flip."""
    return np.repeat([[0], [1]], n_teachers // 2, axis=0).repeat(n_queries, axis=1)


def test_noise_seed_is_separate_from_the_split_seed():
    """``seed`` (data splits) no longer seeds the GNMax noise: two runs with seed=0 and no
    noise seed draw different noise (P(all 60 tied labels agree) = 2^-60) and are marked
    unseeded; two runs with one noise seed are identical and marked seeded. The old code
    (ConfidentGNMax(seed=seed)) gave identical labels for seed=0."""
    priv = sentiment_data(60, 0)
    pub = [(t, None) for t, _, _ in sentiment_data(60, 1)]
    cfg = GNMaxConfig(threshold=0, sigma1=1.0, sigma2=1.0)
    kw = dict(n_teachers=10, shots=2, n_candidates=2, max_val=4, votes=_tied_votes(), seed=0)
    a, b = (run_pate(KeywordScorer(), TEMPLATE, priv, pub, cfg, **kw) for _ in range(2))
    assert a.teachers == b.teachers  # the split seed still fixes the partition
    assert not a.seeded and not b.seeded
    assert a.gnmax.answered.all() and b.gnmax.answered.all()
    assert not np.array_equal(a.gnmax.labels, b.gnmax.labels)
    c, d = (run_pate(KeywordScorer(), TEMPLATE, priv, pub, cfg, noise_seed=5, **kw)
            for _ in range(2))
    assert c.seeded and d.seeded and c.release()["seeded"] is True
    np.testing.assert_array_equal(c.gnmax.labels, d.gnmax.labels)
    assert a.release()["seeded"] is False


def test_experiment_noise_seed_marks_report_and_gives_releases_own_noise():
    """pate_experiment(noise_seed=...) marks the report seeded, warns in it and repeats; two
    public sets with identical tied votes still get independent noise streams (one seed reused
    for both releases would give both the same labels)."""
    priv, test = sentiment_data(60, 0), sentiment_data(4, 2)
    same = [(t, None) for t, _, _ in sentiment_data(40, 1)]
    pubs = [PublicSet("a", same), PublicSet("b", same)]

    class TiedScorer(KeywordScorer):
        def label_probs(self, prefix, suffixes):  # teachers alternate: half vote 0, half 1
            self.calls.append((prefix, len(suffixes)))
            y = len(self.calls) % 2
            return np.array([[0.1 + 0.8 * (1 - y), 0.1 + 0.8 * y]] * len(suffixes))

    cfg = GNMaxConfig(threshold=0, sigma1=1.0, sigma2=1.0)
    kw = dict(n_teachers=10, shots=2, n_candidates=2, max_val=4, baselines=False,
              calibrated=False)
    res = pate_experiment(TiedScorer(), TEMPLATE, priv, test, pubs, cfg, noise_seed=3, **kw)
    rel = res["private_release"]
    assert rel["seeded"] is True and res["seeded"] is True
    assert "NO differential-privacy guarantee" in rel["warning"]
    again = pate_experiment(TiedScorer(), TEMPLATE, priv, test, pubs, cfg, noise_seed=3, **kw)
    assert again["private_release"] == rel  # repeatable
    runs = res["diagnostics_not_private"]["runs"]
    assert runs["a"]["consensus"] == runs["b"]["consensus"] == [0.5] * 40  # tied, both sets
    seeds = release_noise_seeds(3, 2)
    assert seeds == release_noise_seeds(3, 2) and seeds[0] != seeds[1]
    assert release_noise_seeds(None, 2) == [None, None]
    la, lb = (ConfidentGNMax(cfg, seed=k).run(vote_counts(_tied_votes(10, 40), 2)).labels
              for k in seeds)
    assert not np.array_equal(la, lb)
    unseeded = pate_experiment(TiedScorer(), TEMPLATE, priv, test, pubs, cfg, **kw)
    assert unseeded["private_release"]["seeded"] is False
    assert "warning" not in unseeded["private_release"]


def test_data_independent_epsilon_of_a_release():
    """The data-independent ε charges the threshold check on every processed query and GNMax on
    every answered one: it equals ConfidentGNMax(data_dependent=False) on the same noise.
    Catches: charging GNMax on unanswered queries, omitting the threshold check, or swapping σ1
    and σ2."""
    priv = sentiment_data(60, 0)
    pub = [(t, None) for t, _, _ in sentiment_data(60, 1)]
    votes = np.tile(np.r_[np.zeros(7), np.ones(3)][:, None], (1, 60)).astype(int)
    votes[:, ::3] = np.r_[np.zeros(5), np.ones(5)][:, None]  # a third of the queries tied 5:5
    cfg = GNMaxConfig(threshold=6.5, sigma1=1.0, sigma2=3.0)
    run = run_pate(KeywordScorer(), TEMPLATE, priv, pub, cfg, n_teachers=10, shots=2,
                   n_candidates=2, max_val=4, votes=votes, noise_seed=11)
    answered = int(run.gnmax.answered.sum())
    assert 0 < answered < 60  # both branches are exercised
    indep_cfg = GNMaxConfig(threshold=6.5, sigma1=1.0, sigma2=3.0, data_dependent=False)
    ref = ConfidentGNMax(indep_cfg, seed=11).run(vote_counts(votes, 2))
    np.testing.assert_array_equal(ref.answered, run.gnmax.answered)
    np.testing.assert_allclose(run.rdp_data_independent, ref.rdp, rtol=1e-12)
    assert run.epsilon_data_independent == pytest.approx(ref.epsilon, rel=1e-12)
    assert run.gnmax.epsilon < run.epsilon_data_independent
    np.testing.assert_allclose(rdp_data_independent_release(cfg, 60, answered),
                               60 * cfg.orders / 2 + answered * cfg.orders / 9)


def test_compose_epsilon_of_releases_from_the_same_teachers():
    """Two identical releases compose to the conversion of the summed RDP: the same as one run
    over the doubled query list (its ε curve at 2Q), and more than either release alone.
    Catches: max instead of sum, summing ε instead of RDP, reporting the last release only."""
    cfg = GNMaxConfig(threshold=0, sigma1=2.0, sigma2=4.0, data_dependent=False)
    counts = np.tile([9.0, 1.0], (25, 1))
    one = ConfidentGNMax(cfg, seed=0).run(counts)
    doubled = ConfidentGNMax(cfg, seed=1).run(np.tile(counts, (2, 1)))
    assert one.answered.all() and doubled.answered.all()
    eps2, order2 = compose_epsilon([one.rdp, one.rdp], cfg.orders, cfg.delta)
    assert eps2 == pytest.approx(epsilon_from_rdp(2 * one.rdp, cfg.orders, cfg.delta)[0],
                                 rel=1e-12)
    assert eps2 == pytest.approx(float(doubled.epsilon_curve[-1]), rel=1e-9)
    assert eps2 == pytest.approx(doubled.epsilon, rel=1e-9) and order2 == doubled.order
    assert one.epsilon < eps2 < 2 * one.epsilon  # RDP composition beats adding ε
    assert compose_epsilon([], cfg.orders, cfg.delta)[0] == 0.0
    # data-dependent releases compose the same way
    dd_cfg = GNMaxConfig(threshold=150, sigma1=1.0, sigma2=20.0)
    dd = ConfidentGNMax(dd_cfg, seed=0).run(np.tile([190.0, 6.0, 4.0], (50, 1)))
    dd2 = ConfidentGNMax(dd_cfg, seed=0).run(np.tile([190.0, 6.0, 4.0], (100, 1)))
    assert compose_epsilon([dd.rdp, dd.rdp], dd_cfg.orders, dd_cfg.delta)[0] == \
        pytest.approx(dd2.epsilon, rel=1e-9)


def test_budget_caps_the_composition_of_releases():
    """With a budget, the second public set's release stops where the composition would pass
    it (the old code let each release spend the whole budget on its own)."""
    priv, test = sentiment_data(60, 0), sentiment_data(4, 2)
    pubs = [PublicSet(n, [(t, None) for t, _, _ in sentiment_data(8, k)])
            for k, n in enumerate(["a", "b"])]
    base = GNMaxConfig(threshold=0, sigma1=2.0, sigma2=6.0, data_dependent=False)
    per_query = rdp_data_independent_release(base, 1, 1)
    budget = epsilon_from_rdp(10 * per_query, base.orders, base.delta)[0] + 1e-9
    cfg = GNMaxConfig(threshold=0, sigma1=2.0, sigma2=6.0, data_dependent=False,
                      epsilon_budget=budget)
    res = pate_experiment(KeywordScorer(), TEMPLATE, priv, test, pubs, cfg, n_teachers=10,
                          shots=2, n_candidates=2, max_val=2, baselines=False)
    st = res["private_release"]["students"]
    assert st["a"]["queried"] == 8 and not st["a"]["stopped_by_budget"]
    assert st["b"]["queried"] == 2 and st["b"]["stopped_by_budget"]
    assert res["private_release"]["epsilon"] <= budget
    assert res["private_release"]["epsilon"] == pytest.approx(budget, rel=1e-6)


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
    rel, diag = rep["private_release"], rep["diagnostics_not_private"]
    assert set(rel["students"]) == set(diag["runs"]) == {"sst2-sentences (IID)",
                                                          "trustpilot (OOD)"}
    assert rep["test_size"] == 6 and rep["sigma2"] == 0.5 and rel["delta"] == 1e-6
    flat = [i for t in diag["teacher_indices"] for i in t]
    assert len(flat) == len(set(flat)) == 5
    # no --noise-seed: OS entropy, marked unseeded, no warning; ε lines on stderr
    assert rel["seeded"] is False and rep["seeded"] is False and rep["noise_seed"] is None
    assert "warning" not in r.stderr.lower() and "SEEDED" not in r.stderr
    assert "2 releases from the same 5 teachers, composed" in r.stderr
    assert f"ε (data-independent) = {rel['epsilon_data_independent']:.4g}" in r.stderr
    assert "itself not private" in r.stderr
    # --noise-seed: a warning on stderr and seeded: true in the report
    out3 = tmp_path / "pate_seeded.json"
    args = ["pate", "--task", "sst2-sentences", "--teachers", "5", "--queries", "8",
            "--test-size", "6", "--candidates", "2", "--max-val", "3", "--threshold", "1",
            "--no-baselines", "--public", "iid", "--noise-seed", "4", "--out", str(out3)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    seeded = json.loads(out3.read_text())
    assert seeded["private_release"]["seeded"] is True and seeded["noise_seed"] == 4
    assert "warning: the GNMax vote noise is seeded" in r.stderr
    assert "SEEDED noise" in r.stderr
    r2 = CliRunner().invoke(app, args)  # the same seed repeats the release
    assert json.loads(out3.read_text())["private_release"] == seeded["private_release"]
    assert r2.exit_code == 0
    out2 = tmp_path / "mia.json"
    r = CliRunner().invoke(app, ["mia", "--task", "trec", "--prompts", "3", "--nonmembers", "4",
                                 "--out", str(out2)])
    assert r.exit_code == 0, r.output
    mia = json.loads(out2.read_text())
    assert mia["prompts"] == 3 and len(mia["aucs"]) == 3 and len(mia["mean_roc"]["fpr"]) == 101


def test_top_token_only_votes():
    from rapt.pate.gnmax import vote_counts
    from rapt.pate.scorer import HFLabelScorer

    sc = HFLabelScorer(make_word_llama(), ["bad", "good"])
    priv = sentiment_data(12, 0)
    pub = [(t, None) for t, _, _ in sentiment_data(5, 1)]
    teachers = [[priv[i] for i in t] for t in make_teachers(len(priv), 4, 2)]
    votes, probs = teacher_votes(sc, TEMPLATE, teachers, pub, top_token_only=True)
    assert probs is None and votes.shape == (4, 5) and set(votes.ravel()) <= {-1, 0, 1}
    counts = vote_counts(votes, 2)
    assert np.all(counts.sum(axis=1) == (votes >= 0).sum(axis=0))
