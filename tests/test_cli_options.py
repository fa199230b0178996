"""Issue 32 item 7: files and options. The shared data and privacy options (one definition in
rapt.cli.options), `attack invert --target-p`, `sap tune --label-names/--format`, and the DP
training log inside the output folder."""

from __future__ import annotations

import json

import pytest
import typer.main
from typer.testing import CliRunner

from rapt.cli import app

runner = CliRunner()


def _params(*path: str) -> dict:
    cmd = typer.main.get_command(app)
    for p in path:
        cmd = cmd.commands[p]
    return {p.name: p for p in cmd.params}


PRIVATIZING = [("privatize",), ("tune",), ("predict",), ("demo",), ("sap", "tune"),
               ("sap", "predict"), ("client", "upload"), ("client", "predict")]
DATA = [("tune",), ("predict",), ("sap", "tune"), ("sap", "predict"), ("data", "check"),
        ("client", "upload")]


def test_one_definition_per_shared_option():
    """--min-p on every privatizing command, with one default and one help; the data options
    read the same wherever a command does not need its own wording."""
    mins = [_params(*c)["min_p"] for c in PRIVATIZING]
    assert {(p.default, p.help, tuple(p.opts)) for p in mins} == {
        (0.5, mins[0].help, ("--min-p",))}
    for name in ("format", "label_column", "text_column"):
        helps = {_params(*c)[name if name != "format" else "fmt"].help for c in DATA
                 if (name if name != "format" else "fmt") in _params(*c)}
        assert len(helps) <= 2, (name, helps)  # the shared text, and predict's own for columns
    for c in [("tune",), ("sap", "tune"), ("client", "upload"), ("sap", "attack")]:
        assert _params(*c)["target_p"].help == _params("tune")["target_p"].help, c
    for c in [("sap", "tune")]:
        assert {"label_names", "fmt", "label_base"} <= set(_params(*c)), c


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, toy_backbone):
    tmp = tmp_path_factory.mktemp("options")
    bb = toy_backbone
    return tmp, str(bb)


def test_sap_tune_takes_label_names_and_format(tiny):
    """Before: `sap tune` lacked --label-names and --format, which `tune` has."""
    tmp, bb = tiny
    data = tmp / "reviews.data"  # an extension that says nothing: --format tells
    data.write_text("2 good film\n1 bad film\n2 fun plot\n1 boring plot\n")
    out = tmp / "sap"
    r = runner.invoke(app, ["sap", "tune", str(data), "--format", "label-text", "--label-names",
                            "neg,pos", "--backbone", bb, "--eta", "20", "--epochs", "1",
                            "--batch-size", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "1-based" in r.output  # labels 1..K for K names, as `rapt tune` reads them
    doc = json.loads((out / "sap.json").read_text())
    assert doc["label_names"] == ["neg", "pos"]
    assert not {"history", "loss", "final_loss"} & set(doc)  # the losses stay beside the folder


@pytest.mark.parametrize("dp", [True, False], ids=["dp", "no-dp"])
def test_the_train_log_goes_beside_the_output_folder_only_when_asked(tiny, dp):
    """The per-step log is not covered by ε (DP) nor by the release's privatization (no DP):
    with or without DP it is written only with --train-log, beside the folder (which may then
    be shared as it is; mode 0600), never in it or its config (``meta.history``). Without DP
    the folder's config.json once held it, while the README said otherwise."""
    import stat

    tmp, bb = tiny
    name = "dp" if dp else "nodp"
    data = tmp / f"{name}.csv"
    data.write_text("text,label\n" + "good film,pos\nbad film,neg\n" * 4)
    out = tmp / name
    privacy = ["--dp-noise", "1.0"] if dp else ["--eta", "20", "--no-local"]
    argv = ["tune", str(data), "--out", str(out), "--backbone", bb, *privacy, "--epochs", "1",
            "--batch-size", "4", "--num-virtual-tokens", "2", "--noise-seed", "0"]
    log = tmp / f"{name}.train-log.NOT-PRIVATE.json"
    r = runner.invoke(app, argv)
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "config.json").read_text())["meta"]
    assert "history" not in meta and bool(meta.get("dp")) is dp and meta["steps"] >= 1, meta
    assert not log.exists() and not list(out.glob("*NOT-PRIVATE*"))
    r = runner.invoke(app, [*argv, "--train-log"])
    assert r.exit_code == 0, r.output
    assert log.is_file() and not list(out.glob("*NOT-PRIVATE*"))
    assert "not to be shared" in r.output
    assert "history" not in json.loads((out / "config.json").read_text())["meta"]
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    history = json.loads(log.read_text())["history"]
    assert len(history) == meta["steps"] and "loss" in history[0], history
    r = runner.invoke(app, ["predict", str(out), str(data), "--no-privacy"])
    assert r.exit_code == 0 and "accuracy" in r.output, r.output
