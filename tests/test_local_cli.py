"""The user's side on the command line: `rapt tune` holds a slice out of the remote prompt's
training, scores it as queries and fits the local model beside OUT; `rapt predict` fuses the
local model's clean-query probabilities with the remote ones (--local, --no-local,
--local-only); `rapt sap tune` fits the local model too."""

from __future__ import annotations

import json

import pytest
from _tiny import TOY_ROWS, toy_cli_inputs
from typer.testing import CliRunner

from rapt.artifacts import beside
from rapt.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(tmp, backbone path, data, OUT of a `rapt tune` with the local model, its output)."""
    tmp = tmp_path_factory.mktemp("localcli")
    bb, data = toy_cli_inputs(tmp)
    out = tmp / "run"
    r = runner.invoke(app, _tune(bb, data, out))
    assert r.exit_code == 0, r.output
    return tmp, bb, data, out, r


def _tune(bb, data, out, *extra) -> list[str]:
    return ["tune", str(data), "--out", str(out), "--backbone", bb, "--eta", "20",
            "--epochs", "1", "--batch-size", "8", "--noise-seed", "0",
            "--num-virtual-tokens", "2", "--method", "prompt", *extra]


def _meta(out) -> dict:
    return json.loads((out / "config.json").read_text())["meta"]


def test_tune_holds_out_a_slice_and_saves_the_local_model_beside_out(tuned):
    _, _, _, out, r = tuned
    assert "holding out 24 of 120 rows" in r.stderr
    assert _meta(out)["n_examples"] == 96  # the prompt never saw the held-out rows
    assert "fitted on all 120 rows in " in r.stdout and "by 3-fold cross-validation on them" \
        in r.stdout
    assert "s on this machine's CPU" in r.stdout  # the local model's time, once
    assert r.stdout.count("machine's CPU") == 1
    assert "held out (24 rows the prompt never trained on, privatized as queries)" in r.stdout
    assert "On your data (24 held-out rows" in r.stdout  # the verdict
    # the words give the class: the local model alone is right on every held-out row, and
    # the verdict, the saved record and predict's default (below) agree on it
    assert "The local model is right on the same rows as fused" in r.stdout
    assert "`rapt predict` uses it alone by default and sends nothing" in r.stdout
    assert "`rapt predict` uses: the local model alone (nothing sent)" in r.stdout
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "prompt.safetensors"]
    doc = json.loads(beside(out, "local.NOT-PRIVATE.json").read_text())
    assert doc["fusion"]["n_rows"] == 24 and doc["baseline"]["n_rows"] == 120
    assert set(doc["fusion"]["accuracy"]) == {"remote", "local", "fused", "majority"}
    assert doc["fusion"]["mode"] == "local" and doc["fusion"]["accuracy"]["local"] == 1.0
    shared = json.dumps(_meta(out))  # nothing of it in the folder one shares
    assert not any(k in shared for k in ("fusion", "vocabulary", "cv_accuracy", "NOT-PRIVATE"))


def test_tune_shows_a_bar_for_the_held_out_slice_and_a_clock_for_the_local_fit(tuned):
    """Old behaviour: after "saved the ...-tuned model" the slice was privatized and scored,
    and the local model fitted, without a line (67-69 s on AG News); the collapse check on the
    training rows too."""
    r = tuned[-1]
    err = r.stderr
    assert "check: the model on its training rows: 100% (96/96 rows)" in err
    assert err.index("privatize: done in") < err.index("measure: P and nearest-neighbour "
                                                       "inversion of what was privatized: done")
    assert "held-out rows: privatize, then score: 100% (48/48 rows)" in err
    assert err.index("held-out rows: privatize, then score: done in") \
        < err.index("local model: fitting on your clean rows: ...") \
        < err.index("local model: fitting on your clean rows: done in")
    out = r.output  # stdout and stderr as a terminal shows them
    assert out.index("saved the prompt-tuned model") < out.index("held-out rows: privatize")


def test_tune_prints_accuracies_in_percent_each_with_its_rows(tuned):
    """Old behaviour: "3-fold CV accuracy 0.8460 on 2000 rows" and "accuracy remote 0.8000,
    local 0.8600" beside a verdict in percent, the held-out local score from a model fitted
    without the slice, unsaid."""
    import re

    out = tuned[-1].stdout
    assert re.search(r"fitted on all 120 rows in \d+\.\d s on this machine's CPU; "
                     r"\d+\.\d % by 3-fold cross-validation on them", out), out
    assert re.search(r"accuracy remote \d+\.\d %, local \d+\.\d % \(fitted without these "
                     r"rows\), fused \d+\.\d %", out), out
    assert not re.search(r"\b0\.\d{3,4}\b", out.split("local model (")[1]), out


def test_tune_no_local_is_as_before(tuned):
    tmp, bb, data, _, _ = tuned
    out = tmp / "plain"
    r = runner.invoke(app, _tune(bb, data, out, "--no-local"))
    assert r.exit_code == 0, r.output
    assert "holding out" not in r.stderr and "local model" not in r.stdout
    assert _meta(out)["n_examples"] == 120
    assert not beside(out, "local.NOT-PRIVATE.json").exists()


@pytest.fixture(scope="module")
def small(tuned):
    """(OUT, output) of a `rapt tune` on 20 rows: too few to hold a slice out."""
    tmp, bb, _, _, _ = tuned
    data = tmp / "small.csv"
    data.write_text("text,label\n" + TOY_ROWS * 5)
    out = tmp / "small"
    r = runner.invoke(app, _tune(bb, data, out))
    assert r.exit_code == 0, r.output
    return out, r


def test_tune_below_100_rows_holds_nothing_out_and_gives_the_cv_estimate(small):
    out, r = small
    assert "holding out" not in r.stderr and _meta(out)["n_examples"] == 20
    assert "3-fold cross-validation" in r.stdout and "was not scored on held-out" in r.stdout
    assert json.loads(beside(out, "local.NOT-PRIVATE.json").read_text())["fusion"] is None


def _predict(out, data, *extra):
    r = runner.invoke(app, ["predict", str(out), str(data), "--noise-seed", "1", "--limit",
                            "16", "--json-report", *extra])
    assert r.exit_code == 0, r.output
    return r, json.loads(r.stdout.strip().splitlines()[-1])


def test_predict_does_what_the_tunes_verdict_chose(tuned, tmp_path, monkeypatch):
    """By default predict follows the mode recorded beside ARTIFACT by `rapt tune` (here the
    local model alone: nothing privatized); a record that says fused or remote is followed
    too."""
    import shutil

    from rapt.pipeline import Customization

    _, _, data, out, _ = tuned
    real = Customization.privatize
    calls = []
    monkeypatch.setattr(Customization, "privatize",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    r, rep = _predict(out, data)
    assert rep["mode"] == "local-only" and rep["chosen_at_tune"] == "local" and not calls
    assert "the local model alone, on the clean queries (nothing is privatized or sent), " \
        "what `rapt tune`'s verdict chose on 24 held-out rows" in r.stderr
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shutil.copy(beside(out, "local.NOT-PRIVATE.safetensors"),
                beside(copy, "local.NOT-PRIVATE.safetensors"))
    doc = json.loads(beside(out, "local.NOT-PRIVATE.json").read_text())
    for mode in ("fused", "remote"):
        doc["fusion"]["mode"] = mode
        beside(copy, "local.NOT-PRIVATE.json").write_text(json.dumps(doc))
        _, rep = _predict(copy, data)
        assert rep["mode"] == mode and rep["chosen_at_tune"] == mode and calls
        assert rep["accuracy"] == rep[f"accuracy_{mode}"]


def test_predict_fused_fuses_the_local_model(tuned):
    tmp, _, data, out, _ = tuned
    r, rep = _predict(out, data, "--fused", "--out", str(tmp / "p.jsonl"))
    # the prompt's pass over the privatized queries has its bar
    assert "classify: 100% (16/16 rows)" in r.stderr
    assert {"artifact", "examples", "accuracy", "eta", "privacy"} <= set(rep)
    assert rep["mode"] == "fused" and rep["privacy"]["eta"] == 20.0
    assert {"accuracy_remote", "accuracy_local", "accuracy_fused"} <= set(rep)
    assert rep["accuracy"] == rep["accuracy_fused"]
    assert "accuracy by model: remote" in r.stdout
    assert "the remote and local predictions fused (weights remote" in r.stderr
    rows = [json.loads(x) for x in (tmp / "p.jsonl").read_text().splitlines()]
    assert len(rows) == 16
    for row in rows:
        fused = row["probabilities_fused"]
        assert row["probabilities"] == fused and row["label"] == max(fused, key=fused.get)
        assert set(row["probabilities_remote"]) == set(row["probabilities_local"]) == {
            "neg", "pos"}
    r, _ = _predict(out, data, "--fused", "--out", str(tmp / "p.csv"))
    head = (tmp / "p.csv").read_text().splitlines()[0].split(",")
    assert head[-8:] == ["p(neg)", "p(pos)", "p_remote(neg)", "p_remote(pos)", "p_local(neg)",
                         "p_local(pos)", "p_fused(neg)", "p_fused(pos)"]


def test_predict_no_local_is_the_remote_prediction_alone(tuned):
    tmp, _, data, out, _ = tuned
    _, fused = _predict(out, data, "--fused")
    r, rep = _predict(out, data, "--no-local", "--out", str(tmp / "n.jsonl"))
    assert rep["mode"] == "remote" and rep["accuracy"] == fused["accuracy_remote"]
    assert "accuracy_fused" not in rep and "accuracy by model" not in r.stdout
    row = json.loads((tmp / "n.jsonl").read_text().splitlines()[0])
    assert set(row) == {"row", "text", "label", "gold", "probabilities"}


def test_predict_local_only_privatizes_and_sends_nothing(tuned, monkeypatch):
    from rapt.pipeline import Customization

    _, _, data, out, _ = tuned
    monkeypatch.setattr("rapt.cli.predict_cmd.load_backbone_or_fail",
                        lambda *a, **k: pytest.fail("--local-only loaded the backbone"))
    monkeypatch.setattr(Customization, "privatize",
                        lambda *a, **k: pytest.fail("--local-only privatized"))
    r, rep = _predict(out, data, "--local-only")
    assert rep["mode"] == "local-only" and rep["privacy"] is None and rep["eta"] is None
    assert rep["accuracy"] == rep["local_cv_accuracy"] == 1.0  # the words give the class
    assert "nothing is privatized or sent" in r.stderr


def test_predict_local_names_another_runs_local_model(tuned):
    tmp, bb, data, out, _ = tuned
    plain = tmp / "plain2"
    assert runner.invoke(app, _tune(bb, data, plain, "--no-local")).exit_code == 0
    _, rep = _predict(plain, data)
    assert rep["mode"] == "remote"  # no local model beside it
    _, rep = _predict(plain, data, "--local", str(out))
    assert rep["mode"] == "local-only"  # what that run's verdict chose
    _, rep = _predict(plain, data, "--local", str(out), "--fused")
    assert rep["mode"] == "fused" and rep["fusion"]["n_rows"] == 24


@pytest.mark.parametrize("extra, msg", [
    (["--no-local", "--local-only"], "--no-local leaves the local model out"),
    (["--fused", "--local-only"], "--fused pools the remote and local predictions"),
    (["--local", "nowhere"], "no local model beside nowhere"),
])
def test_predict_local_option_errors(tuned, extra, msg):
    _, _, data, out, _ = tuned
    r = runner.invoke(app, ["predict", str(out), str(data), *extra])
    assert r.exit_code == 2 and msg in r.stderr, r.output


def test_predict_refuses_a_damaged_or_foreign_local_model(tuned, tmp_path):
    import shutil

    _, _, data, out, _ = tuned
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    for f in ("local.NOT-PRIVATE.json", "local.NOT-PRIVATE.safetensors"):
        shutil.copy(beside(out, f), beside(copy, f))
    js = beside(copy, "local.NOT-PRIVATE.json")
    doc = json.loads(js.read_text())
    doc["baseline"]["num_labels"] = 3
    js.write_text(json.dumps(doc))
    r = runner.invoke(app, ["predict", str(copy), str(data)])
    assert r.exit_code == 2 and "has 3 labels" in r.stderr, r.output
    js.write_text("{")
    r = runner.invoke(app, ["predict", str(copy), str(data)])
    assert r.exit_code == 2 and str(js) in r.stderr and "--no-local" in r.stderr, r.output


def test_sap_tune_no_local_fits_none(tuned):
    tmp, bb, data, _, _ = tuned
    out = tmp / "sap"
    r = runner.invoke(app, ["sap", "tune", str(data), "--backbone", bb, "--eta", "20",
                            "--epochs", "1", "--batch-size", "16", "--noise-seed", "0",
                            "--out", str(out), "--no-local", "--limit", "32"])
    assert r.exit_code == 0, r.output
    assert "local model" not in r.stdout and not beside(out, "local.NOT-PRIVATE.json").exists()


def test_predict_without_fusion_weights_is_the_remote_prediction(tuned, small):
    """A local model fitted without a held-out slice has no fusion weights: the prediction is
    the remote one, the local probabilities beside it for comparison."""
    tmp, _, data, _, _ = tuned
    r, rep = _predict(small[0], data, "--out", str(tmp / "s.jsonl"))
    assert rep["mode"] == "remote" and rep["fusion"] is None
    assert rep["accuracy"] == rep["accuracy_remote"] and "accuracy_fused" not in rep
    assert "no fusion weights" in r.stderr
    row = json.loads((tmp / "s.jsonl").read_text().splitlines()[0])
    assert row["probabilities"] == row["probabilities_remote"] and "probabilities_local" in row
