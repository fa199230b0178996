"""The output folder of `rapt tune` / `rapt sap tune` is the part one hands on: it holds the
weights and a config that states the privacy *level* of the release (η, the P it was calibrated
for, the shipped table's figures at η, ε and δ under DP). What is computed on the private rows
outside any guarantee -- the privacy measured on them, the per-step log, the resume checkpoint
with the rows, the local model fitted on them -- lies beside it, mode 0600, and the checkpoint is
gone once the run finishes.
A resumed run's bar and train_seconds count the whole run, not only the part after the stop."""

from __future__ import annotations

import json
import os
import re
import signal
import stat

import pytest
import torch
from _tiny import TOY_WORDS, make_bert, make_tokenizer, save_backbone
from typer.testing import CliRunner

from rapt.artifacts import SHAREABLE_PRIVACY, beside
from rapt.cli import app
from rapt.cli.tune_resume import path_in

runner = CliRunner()
MEASURED_FIELDS = {"replacement_probability", "inversion_success", "n_tokens", "channel"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("share")
    bb = save_backbone(make_bert(make_tokenizer(tmp, TOY_WORDS)), tmp / "bb")
    data = tmp / "d.csv"
    data.write_text("text,label\n" + "good fun film,pos\nbad boring plot,neg\n" * 8)
    return tmp, str(bb), data


def _dp_tune(tiny, out, *extra):
    _, bb, data = tiny
    return ["tune", str(data), "--out", str(out), "--backbone", bb, "--eta", "5",
            "--dp-noise", "1.0", "--noise-seed", "0", "--epochs", "2", "--batch-size", "4",
            "--num-virtual-tokens", "2", *extra]


def _mode(p) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _listing(out) -> set[str]:
    return {p.name for p in out.iterdir()} if out.exists() else set()


def _beside(out) -> set[str]:
    return {p.name for p in out.parent.iterdir() if p.name.startswith(out.name + ".")}


LOCAL_FILES = ("local.NOT-PRIVATE.json", "local.NOT-PRIVATE.safetensors")


def _local_files(out) -> set[str]:
    """The local model's two files, checked to lie beside ``out`` (never inside) at 0600."""
    files = [beside(out, f) for f in LOCAL_FILES]
    assert all(f.parent == out.parent and _mode(f) == 0o600 for f in files)
    assert not any("local" in name for name in _listing(out))
    return {f.name for f in files}


def _interrupt_at_step(monkeypatch, step: int) -> None:
    """Ctrl-C (SIGINT to this process) after optimizer step ``step``."""
    from rapt.pipeline import Customization

    tune = Customization.tune

    def tune_with_ctrl_c(self, rows, labels, n, *, progress=None, **kw):
        def progress_and_signal(r):
            progress(r)
            if r["step"] == step:
                os.kill(os.getpid(), signal.SIGINT)
        return tune(self, rows, labels, n, progress=progress_and_signal, **kw)

    monkeypatch.setattr(Customization, "tune", tune_with_ctrl_c)


def _check_shared_config(out) -> dict:
    meta = json.loads((out / "config.json").read_text())["meta"]
    assert set(meta["privacy"]) <= set(SHAREABLE_PRIVACY) | {"table"}, meta["privacy"]
    assert meta["privacy"]["eta"] == 5.0 and "p" in meta["privacy"]["table"]
    assert "history" not in meta  # DP: the per-step log is not covered by ε
    assert meta["dp"]["epsilon"] > 0 and meta["dp"]["delta"] > 0
    return meta


def test_dp_tune_ctrl_c_and_resume_leave_only_shareable_files_in_out(tiny, monkeypatch):
    tmp = tiny[0]
    out = tmp / "dp"
    with monkeypatch.context() as m:
        _interrupt_at_step(m, 3)
        r = runner.invoke(app, _dp_tune(tiny, out))
    assert r.exit_code == 130, r.output
    assert _listing(out) == set()  # nothing of the stopped run inside the folder
    ck = path_in(out)
    assert ck == beside(out, "resume.NOT-PRIVATE.pt") and ck.parent == out.parent
    assert _beside(out) == {ck.name} and _mode(ck) == 0o600

    # a longer first part than this test ran: the finished run's time must include it
    doc = torch.load(ck, weights_only=True)
    assert doc["seconds"] > 0
    doc["seconds"] = 1000.0
    torch.save(doc, ck)
    r = runner.invoke(app, [*_dp_tune(tiny, out), "--resume"])
    assert r.exit_code == 0, r.output
    assert _listing(out) == {"config.json", "prompt.safetensors"}
    measured = beside(out, "measured.NOT-PRIVATE.json")
    # the checkpoint is gone, no log unasked; the local model beside the folder
    assert _beside(out) == {measured.name} | _local_files(out)
    assert _mode(measured) == 0o600
    report = json.loads(measured.read_text())["privacy"]
    assert {"replacement_probability", "inversion_success", "n_tokens"} <= set(report)
    meta = _check_shared_config(out)
    assert meta["train_seconds"] >= 1000.0
    # the bar goes on from step 3 of 8 (not "1/5"), and its time is the whole run's
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tune:")]
    assert lines[0].startswith("tune: 50% (4/8 steps)"), lines
    assert re.match(r"tune: done in 1[67]\.\d min", lines[-1]), lines  # 1,000 s and this run

    r = runner.invoke(app, ["predict", str(out), str(tiny[2]), "--noise-seed", "1"])
    assert r.exit_code == 0 and "accuracy" in r.output, r.output


def test_a_resumed_run_holds_out_the_same_rows_and_dp_counts_the_rows_trained_on(
        tiny, monkeypatch):
    """With --local (the default) and enough rows, a slice is held out of training: the
    checkpoint holds only the other rows' labels, --resume takes the same split again (it is a
    function of the labels and --seed), DP's sampling rate counts the rows trained on, and the
    local model lands beside the folder, not in it."""
    tmp, bb, _ = tiny
    data = tmp / "many.csv"
    data.write_text("text,label\n" + "good fun film,pos\nbad boring plot,neg\n" * 60)
    out = tmp / "held"
    args = ["tune", str(data), "--out", str(out), "--backbone", bb, "--eta", "5",
            "--dp-noise", "1.0", "--noise-seed", "0", "--epochs", "1", "--batch-size", "8",
            "--num-virtual-tokens", "2", "--method", "prompt"]
    with monkeypatch.context() as m:
        _interrupt_at_step(m, 2)
        r = runner.invoke(app, args)
    assert r.exit_code == 130, r.output
    assert "holding out 24 of 120 rows" in r.stderr
    assert len(torch.load(path_in(out), weights_only=True)["labels"]) == 96
    assert _beside(out) == {path_in(out).name}  # no local model before the run is finished
    r = runner.invoke(app, [*args, "--resume"])
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "config.json").read_text())["meta"]
    assert meta["n_examples"] == 96 and meta["dp"]["sample_rate"] == pytest.approx(8 / 96)
    assert _listing(out) == {"config.json", "prompt.safetensors"}
    assert _beside(out) == {beside(out, "measured.NOT-PRIVATE.json").name, *_local_files(out)}
    assert "held out (24 rows the prompt never trained on" in r.stdout
    # a resume that would train on other rows is refused, naming --local
    with monkeypatch.context() as m:
        _interrupt_at_step(m, 2)
        assert runner.invoke(app, args).exit_code == 130
    r = runner.invoke(app, [*args, "--resume", "--no-local"])
    assert r.exit_code == 2 and "--local / --no-local" in r.stderr


def test_the_train_log_is_written_beside_out_only_when_asked(tiny):
    tmp = tiny[0]
    out = tmp / "logged"
    out.mkdir()
    (out / "train-log.NOT-PRIVATE.json").write_text("{}")  # left inside by an older rapt
    r = runner.invoke(app, [*_dp_tune(tiny, out), "--train-log"])
    assert r.exit_code == 0, r.output
    log = beside(out, "train-log.NOT-PRIVATE.json")
    assert _listing(out) == {"config.json", "prompt.safetensors"}
    assert _beside(out) == {log.name, beside(out, "measured.NOT-PRIVATE.json").name,
                            *_local_files(out)}
    assert _mode(log) == 0o600 and json.loads(log.read_text())["history"]
    assert str(log) in r.stdout and "not to be shared" in r.stdout
    _check_shared_config(out)


def test_sap_tune_folder_holds_the_level_and_the_measures_lie_beside(tiny):
    tmp, bb, data = tiny
    out = tmp / "sap"
    r = runner.invoke(app, ["sap", "tune", str(data), "--backbone", bb, "--eta", "20",
                            "--epochs", "1", "--batch-size", "4", "--noise-seed", "0",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert _listing(out) == {"sap.json", "customer.safetensors", "provider.safetensors"}
    doc = json.loads((out / "sap.json").read_text())
    assert not {"measured_p", "final_loss"} & set(doc)
    assert set(doc["privacy"]) <= set(SHAREABLE_PRIVACY) | {"table"}
    assert not MEASURED_FIELDS & set(doc["privacy"])
    measured = beside(out, "measured.NOT-PRIVATE.json")
    assert _beside(out) == {measured.name, *_local_files(out)} and _mode(measured) == 0o600
    assert "by 3-fold cross-validation" in r.stdout
    assert "was not scored on held-out rows" in r.stdout
    got = json.loads(measured.read_text())
    assert 0 < got["privacy"]["replacement_probability"] < 1 and 0 < got["measured_p"] < 1
    r = runner.invoke(app, ["sap", "predict", str(out), str(data), "--noise-seed", "1"])
    assert r.exit_code == 0, r.output


def test_demo_results_on_your_own_rows_are_owner_only(tmp_path):
    from rapt.cli.demo_cmd import _keep_local_unless_public

    for name in ("results.json", "results.md", "demo.png"):
        (tmp_path / name).write_text("x")
        (tmp_path / name).chmod(0o644)
    _keep_local_unless_public("sst2-sentences", tmp_path)  # public data: shareable
    assert {_mode(p) for p in tmp_path.iterdir()} == {0o644}
    _keep_local_unless_public(str(tmp_path / "mine.csv"), tmp_path)
    assert {_mode(p) for p in tmp_path.iterdir()} == {0o600}
