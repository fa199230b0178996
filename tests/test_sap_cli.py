"""`rapt sap tune|predict|attack` on a user CSV with a tiny backbone saved to disk."""

from __future__ import annotations

import json

import pytest
from _tiny import make_bert, save_backbone
from typer.testing import CliRunner

from rapt.cli import app

runner = CliRunner()
ROWS = [("the movie was good and fun", "pos"), ("bad plot and awful actors", "neg"),
        ("great story", "pos"), ("boring and dull film", "neg"),
        ("a brilliant and funny scene", "pos"), ("the worst movie ever", "neg")]


@pytest.fixture()
def setup(tmp_path, tiny_tokenizer):
    model = save_backbone(make_bert(tiny_tokenizer, max_positions=64), tmp_path / "bb")
    csv = tmp_path / "reviews.csv"
    csv.write_text("review,sentiment\n" + "".join(f'"{t}",{y}\n' for t, y in ROWS))
    return tmp_path, str(model), csv


def test_sap_tune_predict_attack(setup):
    tmp, model, csv = setup
    out = tmp / "sap"
    r = runner.invoke(app, ["sap", "tune", str(csv), "--backbone", model, "--text-column",
                            "review", "--label-column", "sentiment", "--split-layer", "1",
                            "--eta", "20", "--cti", "--cti-coverage", "0.3", "--cti-multiplier",
                            "inf", "--unfreeze-bottom", "--epochs", "2", "--batch-size", "3",
                            "--noise-seed", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "noise-seed 1" in r.output and "CTI:" in r.output and "uniform rule" in r.output
    doc = json.loads((out / "sap.json").read_text())
    assert doc["config"]["cti_rule"] == "uniform"
    assert doc["config"]["cti_multiplier"] == "inf" and doc["seeded"] is True
    assert doc["label_names"] == ["neg", "pos"] and doc["steps"] == 4
    assert (out / "provider.safetensors").is_file() and (out / "customer.safetensors").is_file()
    preds = tmp / "preds.jsonl"
    r = runner.invoke(app, ["sap", "predict", str(out), str(csv), "--text-column", "review",
                            "--label-column", "sentiment", "--out", str(preds)])
    assert r.exit_code == 0, r.output
    assert "wrote 6 predictions" in r.output and "accuracy" in r.output
    assert "confusion (rows: gold, columns: predicted)" in r.output
    lines = [json.loads(x) for x in preds.read_text().splitlines()]
    assert len(lines) == 6 and all(x["label"] in ("neg", "pos") for x in lines)
    assert all(set(x["probabilities"]) == {"neg", "pos"} for x in lines)
    assert [x["text"] for x in lines] == [t for t, _ in ROWS]
    header = tmp / "header.csv"  # no rows: one error line, exit 2 (was an IndexError)
    header.write_text("review,sentiment\n")
    r = runner.invoke(app, ["sap", "predict", str(out), str(header), "--text-column", "review"])
    assert r.exit_code == 2 and "header.csv: no rows" in r.output, (r.output, r.exception)
    r = runner.invoke(app, ["sap", "attack", str(csv), "--backbone", model, "--text-column",
                            "review", "--split-layer", "1", "--steps", "5", "--candidates",
                            "8"])
    assert r.exit_code == 0, r.output
    # progress bars share the captured output; the report is the JSON object on stdout
    res = json.loads(r.stdout[r.stdout.rindex('{"split_layer"'):].splitlines()[0])
    assert 0.0 <= res["empirical_privacy"] <= 1.0 and res["n_tokens"] > 0


@pytest.mark.parametrize("args,msg", [
    (["--text-column", "body", "--label-column", "sentiment"], "body"),
    (["--text-column", "review", "--label-column", "stars"], "stars"),
    (["--text-column", "review", "--label-column", "sentiment", "--split-layer", "2"],
     "--split-layer 2"),  # issue 13: flag names, not split_layer=2
    (["--text-column", "review", "--label-column", "sentiment", "--cti", "--no-privacy"],
     "--cti needs eta"),
    (["--text-column", "review", "--label-column", "sentiment", "--eta", "5",
      "--cti-multiplier", "0.5"], "cti-multiplier"),
    (["--text-column", "review", "--label-column", "sentiment", "--eta", "5", "--cti",
      "--cti-rule", "greedy"], "cti-rule"),
])
def test_sap_tune_user_errors(setup, args, msg):
    tmp, model, csv = setup
    r = runner.invoke(app, ["sap", "tune", str(csv), "--backbone", model, "--out",
                            str(tmp / "x"), *args])
    assert r.exit_code == 2, r.output
    err = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and msg in err[0], r.output
    assert not (tmp / "x").exists()


def test_sap_tune_per_class_cti_rule(setup):
    tmp, model, csv = setup
    out = tmp / "pc"
    r = runner.invoke(app, ["sap", "tune", str(csv), "--backbone", model, "--text-column",
                            "review", "--label-column", "sentiment", "--eta", "20", "--cti",
                            "--cti-rule", "per-class", "--cti-coverage", "0.3", "--epochs", "1",
                            "--batch-size", "3", "--noise-seed", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "per-class rule" in r.output
    assert json.loads((out / "sap.json").read_text())["config"]["cti_rule"] == "per-class"
