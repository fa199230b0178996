"""Private by default: every command that sends or trains privatizes at a default level (the
protected tokens' rapt.privacy.rule.DEFAULT_PROTECTED_P under rapt's default policy, noise by
kind of token; DEFAULT_TARGET_P where every token is noised alike) unless --no-privacy is
typed, which is printed and recorded in the artifact; `rapt predict` follows what the artifact
recorded, label column included; the collapse advice fits the run it is about."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rapt.cli import app
from rapt.cli._app import collapse_fixes
from rapt.privacy.rule import DEFAULT_PROTECTED_P, DEFAULT_TARGET_P

runner = CliRunner()
FAST = ["--epochs", "1", "--batch-size", "4", "--num-virtual-tokens", "2", "--method", "prompt"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, toy_backbone):
    tmp = tmp_path_factory.mktemp("private_default")
    bb = toy_backbone
    data = tmp / "d.csv"
    data.write_text("text,label\n" + "good film,pos\nbad film,neg\n" * 4)
    return tmp, str(bb), data


def _meta(folder) -> dict:
    return json.loads((folder / "config.json").read_text())["meta"]


def test_tune_privatizes_at_the_default_level_and_predict_follows(tiny):
    """No level and no policy given: rapt's default policy (noise by kind of token, personal
    data at η 0), said so, recorded with the protected tokens' default level (η calibrated for
    P 0.7), and `rapt predict` privatizes the queries at that η under that policy. Before:
    clear text with a warning; then uniform noise at P 0.6."""
    from rapt.models import load_backbone
    from rapt.privacy.mechanism import calibrate_eta_public

    tmp, bb, data = tiny
    out = tmp / "default"
    r = runner.invoke(app, ["tune", str(data), "--out", str(out), "--backbone", bb, *FAST])
    assert r.exit_code == 0, r.output
    assert f"privacy: the protected tokens' default level, P ≈ {DEFAULT_PROTECTED_P:g}" in (
        r.stderr)
    assert "noise by kind of token (--protect rare)" in r.stderr
    assert "clean (unprivatized)" not in r.output
    meta = _meta(out)
    want = calibrate_eta_public(load_backbone(bb), DEFAULT_PROTECTED_P)
    assert meta["eta"] == pytest.approx(want) and meta["no_privacy"] is False
    assert meta["privacy"]["target_p"] == DEFAULT_PROTECTED_P
    assert meta["by_kind"]["protect"] == "rare" and meta["by_kind"]["eta_personal"] == 0.0
    r = runner.invoke(app, ["tune", str(data), "--out", str(tmp / "uniform"), "--backbone", bb,
                            "--protect", "all", *FAST])
    assert r.exit_code == 0, r.output
    assert f"privacy: the default level, P ≈ {DEFAULT_TARGET_P:g}" in r.stderr
    assert _meta(tmp / "uniform")["eta"] == pytest.approx(
        calibrate_eta_public(load_backbone(bb), DEFAULT_TARGET_P))
    r = runner.invoke(app, ["predict", str(out), str(data), "--json-report"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["eta"] == pytest.approx(want) and report["privacy"]["n_tokens"] > 0
    assert "clear text" not in r.stderr


def test_no_privacy_is_typed_printed_and_recorded(tiny):
    """--no-privacy: a warning says the run is on clear text, the artifact records it, and
    `rapt predict` sends clear queries because of it, saying so. With a level: refused. Under
    DP the warning says that DP does not cover the queries."""
    tmp, bb, data = tiny
    out = tmp / "clear"
    r = runner.invoke(app, ["tune", str(data), "--out", str(out), "--backbone", bb, *FAST,
                            "--no-privacy"])
    assert r.exit_code == 0, r.output
    assert "warning: --no-privacy: training on clear (unprivatized) text" in r.stderr
    meta = _meta(out)
    assert meta["no_privacy"] is True and meta["eta"] is None
    r = runner.invoke(app, ["predict", str(out), str(data), "--json-report"])
    assert r.exit_code == 0, r.output
    assert "was tuned with --no-privacy: queries are used in clear text" in r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["eta"] is None
    r = runner.invoke(app, ["tune", str(data), "--out", str(tmp / "x"), "--backbone", bb,
                            "--no-privacy", "--eta", "5"])
    assert r.exit_code == 2 and "not both" in r.output
    r = runner.invoke(app, ["tune", str(data), "--out", str(tmp / "dp"), "--backbone", bb,
                            *FAST, "--dp-noise", "1.0", "--no-privacy", "--noise-seed", "0"])
    assert r.exit_code == 0, r.output
    assert "DP-SGD covers the trained prompt, not the queries" in r.stderr


def test_dp_alone_is_not_a_default(tiny):
    """Under --dp-epsilon / --dp-noise without a level the rows are privatized too."""
    tmp, bb, data = tiny
    out = tmp / "dp_default"
    r = runner.invoke(app, ["tune", str(data), "--out", str(out), "--backbone", bb, *FAST,
                            "--dp-noise", "1.0", "--noise-seed", "0"])
    assert r.exit_code == 0, r.output
    assert _meta(out)["eta"] is not None and _meta(out)["dp"]


def test_an_artifact_without_a_recorded_level_gets_the_default_queries(tiny):
    """An artifact that records neither η nor --no-privacy (older ones): predict privatizes
    its queries at the default level instead of sending them in clear."""
    tmp, bb, data = tiny
    out = tmp / "old"
    r = runner.invoke(app, ["tune", str(data), "--out", str(out), "--backbone", bb, *FAST,
                            "--no-privacy"])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "config.json").read_text())
    del doc["meta"]["no_privacy"]
    (out / "config.json").write_text(json.dumps(doc))
    r = runner.invoke(app, ["predict", str(out), str(data), "--json-report"])
    assert r.exit_code == 0, r.output
    assert "records no privacy level: queries are privatized at the default level" in r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["eta"] is not None


def test_predict_remembers_the_label_column(tiny):
    """Tuned with --label-column Quality: predict on a file with that column reads its gold
    labels without the flag (accuracy printed, gold written). Before: no accuracy, no hint."""
    tmp, bb, _ = tiny
    data = tmp / "mrpc.tsv"
    data.write_text("Quality\tsentence\n" + "1\tgood film\n0\tbad film\n" * 4)
    out = tmp / "label_col"
    r = runner.invoke(app, ["tune", str(data), "--out", str(out), "--backbone", bb, *FAST,
                            "--label-column", "Quality", "--no-privacy"])
    assert r.exit_code == 0, r.output
    assert _meta(out)["label_column"] == "Quality"
    preds = tmp / "p.jsonl"
    r = runner.invoke(app, ["predict", str(out), str(data), "--out", str(preds)])
    assert r.exit_code == 0, r.output
    assert "accuracy" in r.stdout and "column 'Quality'" in r.stderr
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    assert all(row.get("gold") in ("0", "1") for row in rows), rows[0]


def test_collapse_advice_fits_the_run():
    """No advice to use the method already used, no lower privacy on clear text, no larger ε
    without DP, and no issue numbers."""
    lora_clear = collapse_fixes(method="lora", private=False)
    assert "--method lora" not in lora_clear and "privacy level" not in lora_clear
    assert "--method prefix" in lora_clear
    prompt_private = collapse_fixes(method="prompt", private=True)
    assert "--method lora" in prompt_private and "a smaller --target-p" in prompt_private
    assert "--dp-epsilon" not in prompt_private
    dp_clear = collapse_fixes(method="prefix", private=False, dp=True)
    assert "a larger --dp-epsilon" in dp_clear and "--target-p" not in dp_clear
    for text in (lora_clear, prompt_private, dp_clear,
                 collapse_fixes(method=None, private=True, retune=True)):
        assert "issue" not in text


def test_serve_loads_its_backbones_without_a_loading_bar(tmp_path, monkeypatch):
    """`rapt serve` turns transformers' "Loading weights" bar off before the app (which loads
    the backbones) starts; before, it sat among the service's log lines."""
    import uvicorn
    from transformers.utils import logging as hf_logging

    seen: list[bool] = []
    monkeypatch.setattr(uvicorn, "run",
                        lambda *a, **k: seen.append(hf_logging.is_progress_bar_enabled()))
    hf_logging.enable_progress_bar()
    try:
        r = runner.invoke(app, ["serve", "--db", str(tmp_path / "svc.db")])
    finally:
        hf_logging.enable_progress_bar()
    assert r.exit_code == 0, r.output
    assert seen == [False]


def test_sap_tune_privatizes_by_default_and_records_no_privacy(tiny):
    """`sap tune` without a level releases at the default level; --no-privacy is recorded in
    sap.json and `sap predict` says its queries go in clear."""
    tmp, bb, data = tiny
    small = ["--backbone", bb, "--epochs", "1", "--batch-size", "4"]
    r = runner.invoke(app, ["sap", "tune", str(data), "--out", str(tmp / "sap"), *small])
    assert r.exit_code == 0, r.output
    assert "privacy: the default level, P ≈ 0.6" in r.stderr
    doc = json.loads((tmp / "sap" / "sap.json").read_text())
    assert doc["config"]["eta"] is not None and doc["no_privacy"] is False
    r = runner.invoke(app, ["sap", "tune", str(data), "--out", str(tmp / "sap0"), *small,
                            "--no-privacy"])
    assert r.exit_code == 0, r.output
    assert "warning: --no-privacy: the bottom's release is not privatized" in r.stderr
    doc = json.loads((tmp / "sap0" / "sap.json").read_text())
    assert doc["config"]["eta"] is None and doc["no_privacy"] is True
    r = runner.invoke(app, ["sap", "predict", str(tmp / "sap0"), str(data)])
    assert r.exit_code == 0, r.output
    assert "trained with --no-privacy: queries are used in clear text" in r.stderr
