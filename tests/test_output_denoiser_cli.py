"""The output denoiser on the command line: `rapt tune --output-denoiser` fits it on public text
and saves it inside OUT (the local model's fusion is fitted on the denoised slice); `rapt
predict` runs the privatized queries' pooled states through it (--no-denoise skips it)."""

from __future__ import annotations

import json

import pytest
from _tiny import toy_cli_inputs
from typer.testing import CliRunner

from rapt.artifacts import beside
from rapt.cli import app

runner = CliRunner()


def _tune(bb, data, out, *extra) -> list[str]:
    return ["tune", str(data), "--out", str(out), "--backbone", bb, "--eta", "20",
            "--epochs", "1", "--batch-size", "8", "--noise-seed", "0", "--method", "lora",
            "--max-length", "32", *extra]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, shared_data):
    """(tmp, backbone path, data, OUT of a `rapt tune --output-denoiser`, its output); the
    denoiser is fitted on 200 public sentences (the command's default is 3,000)."""
    import rapt.pipeline.user_side as pl

    tmp = tmp_path_factory.mktemp("dencli")
    bb, data = toy_cli_inputs(tmp)
    out = tmp / "run"
    mp = pytest.MonkeyPatch()
    mp.setattr(pl, "OUTPUT_DENOISER_ROWS", 200)
    try:
        r = runner.invoke(app, _tune(bb, data, out, "--output-denoiser"))
    finally:
        mp.undo()
    assert r.exit_code == 0, r.output
    return tmp, bb, data, out, r


def test_tune_saves_the_denoiser_inside_out_and_says_what_it_learned(tuned):
    _, _, _, out, r = tuned
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "output_denoiser.json", "output_denoiser.safetensors",
        "prompt.safetensors"]
    line = next(x for x in r.stdout.splitlines() if x.startswith("output denoiser"))
    assert "fitted on 200 public sentences" in line and "η = 20" in line
    assert "held-out public error" in line and "s on this machine's CPU" in line
    # old behaviour: one bar over slow passes and fast epochs started at the slow rate and
    # promised several times the real time; each stage has its own bar now
    assert "output denoiser: public states: 100% (" in r.stderr
    assert "output denoiser: fit: 100% (60/60 epochs)" in r.stderr
    doc = json.loads((out / "output_denoiser.json").read_text())
    rec = doc["record"]
    assert rec["public_rows"] == 200 and rec["eta"] == 20.0 and len(rec["curve"]) == 60
    assert rec["trained_on"]["disjoint_from"] == "user"  # a user's file: every built-in family
    assert f"{rec['before']:.4g} -> {rec['after']:.4g}" in line
    # the local model beside OUT, its fusion fitted on the denoised slice
    assert "held out (24 rows the prompt never trained on, privatized as queries): accuracy " \
        "remote (denoised) " in r.stdout
    assert json.loads(beside(out, "local.NOT-PRIVATE.json").read_text())["fusion"]["n_rows"] == 24


def test_tune_output_denoiser_needs_privatization(tuned):
    tmp, bb, data, _, _ = tuned
    r = runner.invoke(app, ["tune", str(data), "--out", str(tmp / "x"), "--backbone", bb,
                            "--no-privacy", "--output-denoiser"])
    assert r.exit_code == 2 and "--output-denoiser corrects privatized queries" in r.stderr


def _predict(out, data, *extra):
    r = runner.invoke(app, ["predict", str(out), str(data), "--noise-seed", "1", "--limit",
                            "16", "--json-report", "--no-local", *extra])
    assert r.exit_code == 0, r.output
    return r, json.loads(r.stdout.strip().splitlines()[-1])


def test_predict_runs_the_denoiser_on_privatized_queries(tuned, monkeypatch):
    import rapt.pipeline.user_side as pl

    _, _, data, out, _ = tuned
    calls = []
    real = pl.denoised_proba

    def spy(*a, **kw):
        calls.append(len(a[3]))
        return real(*a, **kw)

    monkeypatch.setattr(pl, "denoised_proba", spy)
    r, rep = _predict(out, data)
    assert rep["output_denoiser"] is True and calls == [16]
    assert "corrected on this machine by the output denoiser" in r.stderr
    r, rep = _predict(out, data, "--no-denoise")
    assert rep["output_denoiser"] is False and calls == [16]
    assert "not used (--no-denoise)" in r.stderr
    r, rep = _predict(out, data, "--no-privacy")
    assert rep["output_denoiser"] is False and "the queries are not privatized" in r.stderr


def test_predict_fuses_the_denoised_remote_probabilities(tuned, monkeypatch):
    """The prediction file keeps the prompt's own probabilities as `probabilities_remote` and
    the denoised ones, which are what was fused, as `probabilities_denoised`; the same without
    a local model (--no-local)."""
    import torch

    import rapt.pipeline.user_side as pl
    from rapt.artifacts import read_local_model

    tmp, _, data, out, _ = tuned
    monkeypatch.setattr(pl, "denoised_proba", lambda c, t, d, clean, priv, with_raw=False: (
        torch.tensor([[0.9, 0.1]] * len(priv)), torch.tensor([[0.2, 0.8]] * len(priv))))
    _, fusion = read_local_model(out)
    for extra in (["--fused"], ["--no-local"]):
        r = runner.invoke(app, ["predict", str(out), str(data), "--noise-seed", "1", "--limit",
                                "4", "--out", str(tmp / "p.jsonl"), *extra])
        assert r.exit_code == 0, r.output
        for row in map(json.loads, (tmp / "p.jsonl").read_text().splitlines()):
            assert row["probabilities_remote"] == pytest.approx({"neg": 0.2, "pos": 0.8})
            assert row["probabilities_denoised"] == pytest.approx({"neg": 0.9, "pos": 0.1})
            if extra == ["--fused"]:
                local = [row["probabilities_local"][k] for k in ("neg", "pos")]
                want = fusion([[0.9, 0.1]], [local])[0]
                assert row["probabilities"] == pytest.approx(
                    dict(zip(("neg", "pos"), want, strict=True)), abs=1e-5)
            else:
                assert row["probabilities"] == row["probabilities_denoised"]


def test_the_raw_remote_probabilities_are_the_prompts_own(tuned):
    """`denoised_proba(..., with_raw=True)`'s second value is what the prompt gives the same
    privatized rows without the denoiser."""
    import torch

    from rapt.artifacts import read_output_denoiser
    from rapt.models import load_backbone
    from rapt.pipeline import Customization
    from rapt.pipeline.user_side import denoised_proba
    from rapt.tuning.tune import TunedPrompt

    _, bb, _, out, _ = tuned
    tuned_prompt = TunedPrompt.load(out)
    custom = Customization.from_artifact(load_backbone(bb), tuned_prompt, eta=20.0,
                                         noise_seed=0)
    texts = ["good fun film", "awful story"]
    clean = custom.rows(texts, None, queries=True)
    rows = custom.privatize(clean, measure=False, texts=texts)  # the tuned policy: by kind
    den, raw = denoised_proba(custom, tuned_prompt, read_output_denoiser(out)[0], clean, rows,
                              with_raw=True)
    torch.testing.assert_close(raw, custom.predict_proba(rows), atol=1e-5, rtol=1e-4)


def test_a_retune_without_it_removes_the_old_prompts_denoiser(tuned):
    import shutil

    tmp, bb, data, out, _ = tuned
    copy = tmp / "again"
    shutil.copytree(out, copy)
    r = runner.invoke(app, _tune(bb, data, copy, "--no-local"))
    assert r.exit_code == 0, r.output
    assert "removed the output denoiser" in r.stderr
    assert not (copy / "output_denoiser.json").exists()
