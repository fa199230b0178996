"""rapt.local (the user's own model, the fused pool, the verdict) and the local model's files
beside an output folder (rapt.artifacts.write_local_model / read_local_model)."""

from __future__ import annotations

import json
import stat

import numpy as np
import pytest

from rapt.artifacts import ArtifactError, beside, read_local_model, write_local_model
from rapt.local import Comparison, Fusion, LocalBaseline, fit_user_side, holdout_split, verdict

WORDS = {0: "awful boring dull terrible worst", 1: "great fun brilliant lovely best",
         2: "plot actor scene story music"}


def _rows(n: int, num_labels: int = 3, seed: int = 0) -> tuple[list[str], list[int]]:
    """``n`` short texts whose class shows in some of their words, mixed with filler."""
    rng = np.random.default_rng(seed)
    filler = "the a it was and of this that".split()
    texts, labels = [], []
    for i in range(n):
        y = i % num_labels
        words = list(rng.choice(WORDS[y].split(), 2)) + list(rng.choice(filler, 4))
        texts.append(" ".join(rng.permutation(words)))
        labels.append(y)
    return texts, labels


@pytest.fixture(scope="module")
def three_class():
    texts, labels = _rows(60)
    return texts, labels, LocalBaseline.fit(texts, labels, 3, seed=0)


def _mode(p) -> int:
    return stat.S_IMODE(p.stat().st_mode)


# ------------------------------------------------------------------------ files beside OUT

def test_state_round_trip_through_the_files_predicts_the_same(tmp_path, three_class):
    texts, _, model = three_class
    # lbfgs leaves a multi-class coef_ in Fortran order; safetensors writes the raw buffer, so
    # a non-contiguous array saved as it is comes back with its rows and columns scrambled
    assert model.pipeline.named_steps["lr"].coef_.shape[0] == 3
    fusion = Fusion(0.7, 1.3, 20, {"remote": 0.5, "local": 0.8, "fused": 0.85})
    out = tmp_path / "run"
    write_local_model(out, model, fusion)
    got, got_fusion = read_local_model(out)
    queries = texts[:10] + ["an unseen word and great fun", ""]
    np.testing.assert_array_equal(got.predict_proba(queries), model.predict_proba(queries))
    assert got_fusion == fusion
    assert (got.C, got.cv_accuracy, got.folds, got.n_rows, got.num_labels) == (
        model.C, model.cv_accuracy, model.folds, model.n_rows, 3)
    assert got.fit_seconds == pytest.approx(model.fit_seconds)


def test_the_files_lie_beside_out_owner_only(tmp_path, three_class):
    out = tmp_path / "run"
    out.mkdir()
    paths = write_local_model(out, three_class[2])
    assert {p.name for p in paths} == {"run.local.NOT-PRIVATE.json",
                                       "run.local.NOT-PRIVATE.safetensors"}
    assert all(p.parent == tmp_path and _mode(p) == 0o600 for p in paths)
    assert list(out.iterdir()) == []  # nothing inside the folder one shares
    doc = json.loads(beside(out, "local.NOT-PRIVATE.json").read_text())
    assert "never publish" in doc["warning"] and doc["fusion"] is None
    assert read_local_model(out)[1] is None


def test_no_local_model_is_none(tmp_path):
    assert read_local_model(tmp_path / "run") is None


@pytest.mark.parametrize("damage", ["no-json", "no-safetensors", "bad-json", "bad-format",
                                    "bad-tensors", "wrong-shape", "bad-fusion"])
def test_a_damaged_local_model_is_an_error_naming_the_file(tmp_path, three_class, damage):
    out = tmp_path / "run"
    write_local_model(out, three_class[2], Fusion(1.0, 1.0))
    js, st = beside(out, "local.NOT-PRIVATE.json"), beside(out, "local.NOT-PRIVATE.safetensors")
    doc = json.loads(js.read_text())
    if damage == "no-json":
        js.unlink()
    elif damage == "no-safetensors":
        st.unlink()
    elif damage == "bad-json":
        js.write_text("{not json")
    elif damage == "bad-format":
        js.write_text(json.dumps({**doc, "format": "something-else"}))
    elif damage == "bad-tensors":
        st.write_bytes(b"\x00" * 20)
    elif damage == "wrong-shape":
        doc["baseline"]["vocabulary"] = {"only": 0}
        js.write_text(json.dumps(doc))
    else:
        js.write_text(json.dumps({**doc, "fusion": {"remote": -1, "local": 1}}))
    with pytest.raises(ArtifactError) as e:
        read_local_model(out)
    named = st if damage == "no-safetensors" else js
    assert str(named) in str(e.value)


# ------------------------------------------------------------------------ the local model

def test_a_class_missing_from_the_rows_keeps_its_column(tmp_path):
    texts, labels = _rows(40, num_labels=2)
    model = LocalBaseline.fit(texts, labels, 3, seed=0)  # class 2 has no row
    p = model.predict_proba(texts[:5])
    assert p.shape == (5, 3) and (p[:, 2] == 0).all()
    np.testing.assert_allclose(p.sum(-1), 1.0)
    write_local_model(tmp_path / "run", model)
    got, _ = read_local_model(tmp_path / "run")
    np.testing.assert_array_equal(got.predict_proba(texts[:5]), p)


def test_the_local_model_learns_the_words_and_reports_cv(three_class):
    texts, labels, model = three_class
    assert model.folds == 3 and model.n_rows == 60 and model.fit_seconds > 0
    assert model.cv_accuracy is not None and model.cv_accuracy > 0.8
    assert (model.predict(texts) == np.asarray(labels)).mean() > 0.9
    with pytest.raises(ValueError, match="at least 2 classes"):
        LocalBaseline.fit(texts[:3], [1, 1, 1], 3)
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        LocalBaseline.fit(texts[:3], [0, 1, 3], 3)


# ------------------------------------------------------------------------ hold-out split

@pytest.mark.parametrize("n", [100, 101, 250, 5000])
def test_holdout_split_sizes_and_stratification(n):
    labels = np.arange(n) % 4
    labels[: n // 2] = 0  # unbalanced: class 0 is more than half
    train, held = holdout_split(labels, seed=3)
    assert len(held) == min(500, round(0.2 * n))
    assert len(np.intersect1d(train, held)) == 0 and len(train) + len(held) == n
    assert (np.sort(np.concatenate([train, held])) == np.arange(n)).all()
    # each class gives its share of the slice within one row
    quota = np.bincount(labels, minlength=4) * len(held) / n
    assert (np.abs(np.bincount(labels[held], minlength=4) - quota) < 1).all()


def test_holdout_split_holds_every_class_of_two_rows_or_more():
    labels = np.array([0] * 200 + [1] * 2 + [2])  # class 1: 2 rows, class 2: a single one
    _, held = holdout_split(labels, seed=0)
    assert len(held) == 41 and set(labels[held]) == {0, 1}


def test_holdout_split_is_a_function_of_the_labels_and_the_seed():
    labels = [0, 1, 1, 2] * 50
    a, b = holdout_split(labels, seed=7), holdout_split(list(labels), seed=7)
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert not np.array_equal(holdout_split(labels, seed=8)[1], a[1])


@pytest.mark.parametrize("n", [0, 10, 97])
def test_holdout_split_is_empty_below_20_rows(n):
    train, held = holdout_split(np.arange(n) % 2, seed=0)
    assert len(held) == 0 and (train == np.arange(n)).all()


# ------------------------------------------------------------------------ fusion

def _sides(seed: int, n: int = 300, c: int = 3):
    """(labels, an informative side (75 % right), pure noise) for one seeded draw."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    good = np.full((n, c), 0.1)
    good[np.arange(n), y] = 0.8
    flip = rng.random(n) < 0.25
    good[flip] = rng.dirichlet(np.ones(c), int(flip.sum()))
    return y, good, rng.dirichlet(np.ones(c), n)


def test_fusion_gives_a_noise_side_no_weight():
    """Over 20 seeded draws the noise side's weight is 0 in most and never above the grid's
    first step; the informative side always keeps a weight near 1."""
    zero_remote = zero_local = 0
    for seed in range(20):
        y, good, noise = _sides(seed)
        remote_noise = Fusion.fit(noise, good, y)
        local_noise = Fusion.fit(good, noise, y)
        assert remote_noise.remote <= 0.1 and remote_noise.local >= 0.8
        assert local_noise.local <= 0.1 and local_noise.remote >= 0.8
        zero_remote += remote_noise.remote == 0.0
        zero_local += local_noise.local == 0.0
        assert remote_noise.accuracy["fused"] >= remote_noise.accuracy["local"] - 0.02
    assert zero_remote >= 14 and zero_local >= 14


def test_fusion_of_two_informative_sides_uses_both_and_helps():
    y, remote, _ = _sides(0, n=500)
    rng = np.random.default_rng(5)  # a second side, right as often, wrong on other rows
    local = np.full((500, 3), 0.1)
    local[np.arange(500), y] = 0.8
    flip = rng.random(500) < 0.25
    local[flip] = rng.dirichlet(np.ones(3), int(flip.sum()))
    f = Fusion.fit(remote, local, y)
    assert f.remote > 0 and f.local > 0 and f.n_rows == 500
    assert f.accuracy["fused"] > max(f.accuracy["remote"], f.accuracy["local"])
    np.testing.assert_allclose(f(remote, local).sum(-1), 1.0)
    assert Fusion.from_dict(f.to_dict()) == f


def test_fusion_refuses_mismatched_shapes_and_bad_weights():
    with pytest.raises(ValueError, match="differ in shape"):
        Fusion(1, 1)(np.ones((2, 2)) / 2, np.ones((2, 3)) / 3)
    with pytest.raises(ValueError, match="at least one held-out row"):
        Fusion.fit(np.ones((0, 2)), np.ones((0, 2)), [])
    with pytest.raises(ValueError, match=">= 0"):
        Fusion.from_dict({"remote": float("nan"), "local": 1})


def test_fit_user_side_scores_the_local_model_without_the_held_out_rows():
    texts, labels = _rows(120)
    train, held = holdout_split(labels, seed=0)
    y = np.asarray(labels)
    remote = np.full((len(held), 3), 1 / 3)  # a remote side that knows nothing
    final, fusion, comp = fit_user_side(texts, labels, 3, held, remote, seed=0)
    assert final.n_rows == 120 and fusion.n_rows == len(held) == 24
    assert comp.remote == pytest.approx(fusion.accuracy["remote"])
    assert comp.local > 0.8 and comp.n_rows == 24 and comp.basis == "held-out"
    part = LocalBaseline.fit([texts[i] for i in train], y[train], 3, seed=0)
    assert comp.local == pytest.approx(
        (part.predict([texts[i] for i in held]) == y[held]).mean())
    assert fusion.remote == 0.0  # a uniform remote side carries nothing
    only, none, cv = fit_user_side(texts, labels, 3, np.arange(0), None)
    assert none is None and cv.remote is None and cv.local == only.cv_accuracy
    assert "cross-validation" in cv.basis


# ------------------------------------------------------------------------ verdict

def test_verdict_local_wins_suggests_local_only():
    s = verdict(Comparison(0.85, 0.70, 0.84, 200))
    assert s.startswith("On your data, a local model beats this privatized model by 15.0 "
                        "points (85.0 % vs 70.0 %, on 200 of your rows (held-out))")
    assert "rapt predict --local-only" in s


def test_verdict_remote_wins():
    s = verdict(Comparison(0.70, 0.85, None, 200))
    assert "this privatized model beats a local model by 15.0 points (85.0 % vs 70.0 %" in s
    assert "--local-only" not in s


def test_verdict_even_and_fused_better():
    s = verdict(Comparison(0.800, 0.805, None, 50))
    assert "score about the same (80.5 % vs 80.0 %, on 50 of your rows" in s
    s = verdict(Comparison(0.800, 0.805, 0.85, 50))
    assert "Fused (both, combined on your machine) scores 85.0 %" in s
    assert "`rapt predict` uses it by default" in s


def test_verdict_without_a_remote_score():
    s = verdict(Comparison(0.9, None, None, 0, "3-fold cross-validation"))
    assert "scores 90.0 % on your rows (3-fold cross-validation)" in s
    assert "was not scored on held-out rows" in s


def test_texts_without_words_get_a_clear_error():
    from rapt.local import LocalBaseline

    with pytest.raises(ValueError, match="no word of two or more"):
        LocalBaseline.fit(["a b", "c d", "e f", "g h"], [0, 1, 0, 1], 2)


@pytest.mark.parametrize(("p", "says"), [(None, "without privacy"), (0.6, "at no row count"),
                                         (0.4, "below about 500 rows"), (0.2, "1,000 rows")])
def test_grid_note_names_what_the_grid_measured_at_the_level(p, says):
    from rapt.local.verdict import grid_note

    assert says in grid_note(p)
