"""One way to print each kind of number (rapt.numfmt), in every command: η with 2 decimals, P
with 3, accuracies in percent with one decimal, losses to 4 significant digits; and each
number says what it was measured on. Each test failed before."""

from __future__ import annotations

import re

import pytest
import typer.main
from _tiny import toy_cli_inputs
from typer.testing import CliRunner

from rapt import numfmt
from rapt.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("numfmt")
    bb, data = toy_cli_inputs(tmp)
    return tmp, bb, data


def test_the_formatters():
    assert numfmt.pct(0.8537) == "85.4 %" and numfmt.points(0.0125) == "1.2"
    assert numfmt.eta(67.7128) == "67.71" and numfmt.p(0.58104) == "0.581"
    assert numfmt.loss(1.402788758277893) == "1.403" and numfmt.loss(0.01234567) == "0.01235"
    assert numfmt.seconds(9.84) == "9.8 s" and numfmt.seconds(183) == "3.0 min"
    assert numfmt.count(1600, "row") == "1,600 rows" and numfmt.count(1, "step") == "1 step"


def test_privatize_prints_eta_one_way(tiny):
    """Before: "calibrated eta = 112.652", "eta = 112.652", "privacy: η = 112.7" (67.713 /
    67.7128 / 67.71 on MiniLM at the default level)."""
    tmp, bb, data = tiny
    r = runner.invoke(app, ["privatize", str(data), str(tmp / "p.csv"), "--backbone", bb,
                            "--target-p", "0.5", "--protect", "all"])
    assert r.exit_code == 0, r.output
    etas = re.findall(r"(?:η|eta) = ([0-9][0-9.e+]*)", r.output)
    assert len(etas) >= 3 and len(set(etas)) == 1, etas
    assert re.fullmatch(r"\d+\.\d\d", etas[0]), etas
    ps = set(re.findall(r"(?:measured P|P \(replaced tokens\)) = ([0-9.]+)", r.output))
    assert len(ps) == 1 and re.fullmatch(r"0\.\d{3}", ps.pop()), r.output


def test_sap_tune_prints_one_p_and_names_sap_predict(tiny):
    """Before: "measured P = 0.903" in the privacy line and "measured P = 0.900" in the saved
    line (the second also counted the queries of the collapse check), and a verdict pointing
    at `rapt predict`, which cannot read a SAP folder."""
    tmp, bb, data = tiny
    r = runner.invoke(app, ["sap", "tune", str(data), "--out", str(tmp / "sap"), "--backbone", bb,
                            "--eta", "20", "--epochs", "1", "--batch-size", "8",
                            "--noise-seed", "0"])
    assert r.exit_code == 0, r.output
    assert r.output.count("P = ") == 1, r.output
    assert "release: 120 training rows privatized; privacy: η = 20.00; measured P = " in r.stdout
    assert "`rapt sap predict`" in r.stdout and "`rapt predict" not in r.stdout
    assert re.search(r"\d+\.\d % by 3-fold cross-validation", r.stdout), r.stdout


def test_client_predict_help_does_not_speak_of_predict_from_outside():
    """Before: `client predict --help` said "... or for predict the η recorded ..."."""
    cmd = typer.main.get_command(app).commands["client"].commands["predict"]
    helps = " ".join(p.help or "" for p in cmd.params)
    assert "for predict" not in helps
    assert "the η recorded on the service with the prompt's training data" in helps


def test_help_times_come_from_a_measurement():
    """Old behaviour: --help said "about a second" for a local fit that took 10 s on AG
    News, and "minutes" for an output denoiser; each time now says what was measured where."""
    cmds = typer.main.get_command(app).commands
    helps = {(c, p.name): p.help or "" for c in ("tune", "sap") for p in (
        cmds[c].params if c == "tune" else cmds["sap"].commands["tune"].params)}
    for key in (("tune", "local"), ("sap", "local"), ("tune", "output_denoiser")):
        assert "measured" in helps[key] and "on 2 " in helps[key], (key, helps[key])
        assert "about a second" not in helps[key]
