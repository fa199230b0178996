"""Issue 32 item 1 (its resume part): a `rapt tune` stopped by SIGTERM or Ctrl-C saves a
checkpoint in --out, and `rapt tune --resume` continues it on the saved privatized rows (no
second privatization), ending with exactly the tensors of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import stat

import pytest
from _tiny import TOY_WORDS, make_bert, make_tokenizer, save_backbone
from typer.testing import CliRunner

from rapt.cli import app
from rapt.cli.tune_resume import path_in

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    bb = save_backbone(make_bert(make_tokenizer(tmp, TOY_WORDS)), tmp / "bb")
    data = tmp / "d.csv"
    data.write_text("text,label\n" + "good fun film,pos\nbad boring plot,neg\n" * 8)
    return tmp, str(bb), data


def _argv(tiny, out, *extra, epochs: str = "2"):
    tmp, bb, data = tiny
    return ["tune", str(data), "--out", str(out), "--backbone", bb, "--eta", "5",
            "--noise-seed", "0", "--epochs", epochs, "--batch-size", "4", "--num-virtual-tokens",
            "2", *extra]


def _signal_at_step(monkeypatch, step: int, signum: int) -> None:
    """Send ``signum`` to this process after optimizer step ``step`` (what Ctrl-C does)."""
    from rapt.pipeline import Customization

    tune = Customization.tune

    def tune_with_signal(self, rows, labels, n, *, progress=None, **kw):
        def progress_and_signal(r):
            progress(r)
            if r["step"] == step:
                os.kill(os.getpid(), signum)
        return tune(self, rows, labels, n, progress=progress_and_signal, **kw)

    monkeypatch.setattr(Customization, "tune", tune_with_signal)


def test_stop_then_resume_matches_an_uninterrupted_run(tiny, monkeypatch):
    from safetensors.torch import load_file

    tmp = tiny[0]
    r = runner.invoke(app, _argv(tiny, tmp / "full"))
    assert r.exit_code == 0, r.output
    out = tmp / "stopped"
    r = runner.invoke(app, _argv(tiny, out, "--resume"))
    assert r.exit_code == 2 and f"no checkpoint for {out}" in r.output
    with monkeypatch.context() as m:
        _signal_at_step(m, 3, signal.SIGTERM)
        r = runner.invoke(app, _argv(tiny, out))
    assert r.exit_code == 128 + signal.SIGTERM, (r.exit_code, r.output)
    assert "SIGTERM: stopping after this step" in r.stderr
    assert "stopped at step 3 of 8" in r.stderr and "--resume" in r.stderr
    ck = path_in(out)
    assert ck.is_file() and stat.S_IMODE(ck.stat().st_mode) == 0o600
    assert not (out / "config.json").exists()  # a stopped run saves no artifact
    # other options than the stopped run's: refused, naming the field
    r = runner.invoke(app, _argv(tiny, out, "--resume", epochs="3"))
    assert r.exit_code == 2 and "epochs: 2 in the checkpoint, 3 now" in r.output, r.output

    def no_second_privatization(*a, **k):
        raise AssertionError("a resumed run privatized its data again")

    with monkeypatch.context() as m:
        m.setattr("rapt.privacy.mechanism.Privatizer.privatize_ids", no_second_privatization)
        r = runner.invoke(app, [*_argv(tiny, out), "--resume"])
    assert r.exit_code == 0, r.output
    assert "resuming the run stopped at step 3" in r.stderr and not ck.exists()
    full, resumed = (load_file(str(p / "prompt.safetensors")) for p in (tmp / "full", out))
    assert full.keys() == resumed.keys()
    assert all((full[k] == resumed[k]).all() for k in full)


def test_ctrl_c_stops_and_a_second_one_aborts(tiny, monkeypatch):
    from rapt.cli.tune_resume import StopSignals

    stop = StopSignals()
    with stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.should_stop() and stop.exit_code == 130
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is not stop._handle  # handlers restored
