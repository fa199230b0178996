"""What `rapt client` prints while it works: a bar while rows are privatized and while they are
sent, the privacy line of the queries before the predictions (it followed them), and a job bar
in the CLI's format (loss to 4 significant digits, the bar's own time left; it printed
"loss=1.402788758277893 eta_s=51.7", "eta" being η everywhere else).
Each test failed before."""

from __future__ import annotations

import json
import re

import pytest
from _service import folder_service
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from rapt.cli import app
from rapt.service import create_app

WORDS = "good great fun bad awful boring the movie film plot story was".split()


@pytest.fixture()
def cli(tmp_path, monkeypatch):
    """(invoke, the service options, backbone folder): the CLI against the in-process
    service."""
    import rapt.client.client as client_module
    from rapt.http import HttpSession

    bb, folder, cfg, key = folder_service(tmp_path, monkeypatch)
    with TestClient(create_app(cfg, backbones={str(folder): bb})) as tc:
        monkeypatch.setattr(client_module, "HttpSession",
                            lambda url, k, timeout=120.0, client=None:
                            HttpSession(url, k, client=tc))
        yield CliRunner().invoke, ["--url", "http://testserver", "--key", key], folder


def _rows(n: int) -> str:
    return "text,label\n" + "".join(
        f"{WORDS[i % 3 + 3 * (i % 2)]} {WORDS[6 + i % 6]} {WORDS[6 + (i // 6) % 6]},{i % 2}\n"
        for i in range(n))


def test_client_shows_bars_and_the_queries_privacy_before_the_predictions(cli, tmp_path):
    run, service, folder = cli
    data = tmp_path / "d.csv"
    data.write_text(_rows(40))
    bb = ["--backbone", str(folder)]
    up = run(app, ["client", "upload", str(data), *service, *bb, "--eta", "5", "--no-local"])
    assert up.exit_code == 0, up.output
    assert "privatize: 100% (40/40 rows)" in up.stderr
    t = run(app, ["client", "tune", up.stdout.strip().splitlines()[0], *service, "--epochs", "2",
                  "--batch-size", "8", "--wait", "--no-local"])
    assert t.exit_code == 0, t.output
    assert "eta_s" not in t.stderr  # the bar (the status JSON on stdout is the service's)
    job = [ln for ln in t.stderr.splitlines() if re.match(r"job \S+: 100% \(10/10 steps\)", ln)]
    assert job, t.stderr
    loss = re.search(r"loss=(\S+)", job[0]).group(1)
    assert len(loss.replace("0.", "").lstrip("0").replace(".", "")) <= 4, job[0]
    prompt = json.loads(t.stdout[t.stdout.index("{"):])["prompt_id"]
    queries = tmp_path / "q.csv"
    queries.write_text(_rows(300))
    p = run(app, ["client", "predict", prompt, str(queries), *service, *bb, "--no-local"])
    assert p.exit_code == 0, p.output
    out = p.output  # stdout and stderr in the order a terminal shows them
    assert "privatize: 100% (300/300 rows)" in out
    privacy = out.index("predict: 300 rows privatized; privacy: η = 5.00")
    sent = out.index(f"predict (prompt {prompt}): 100% (300/300 rows)")
    assert out.index("privatize: done in") < privacy < sent < out.index("300 predictions")
    assert re.search(r"accuracy \d+\.\d % on 300 examples", out), out


def test_the_job_bar_then_a_bar_per_stage_each_at_its_end(capsys):
    """A job polled mid-training, then in its output denoiser's stage, then done: one bar per
    part, each closed at its end (a last poll that misses steps still ends them at 100 %)."""
    from rapt.client.client import _JobBars

    bars = _JobBars("j1")
    for step in (3, 7):
        bars.show({"state": "running", "total_steps": 10, "step": step,
                   "loss": 0.6931471824645996, "stage": None})
    for done in (1, 4):
        bars.show({"state": "running", "total_steps": 10, "step": 10, "loss": 0.5,
                   "stage": {"name": "output_denoiser", "done": done, "total": 5}})
    bars.show({"state": "succeeded", "total_steps": 10, "step": 10, "loss": 0.5, "stage": None})
    bars.close()
    err = capsys.readouterr().err.splitlines()
    ends = [i for i, ln in enumerate(err) if "100%" in ln or " done in " in ln]
    assert [err[i].split(",")[0] for i in ends] == [
        "job j1: 100% (10/10 steps)", err[ends[1]], "job j1: output denoiser: 100% (5/5 steps)",
        err[ends[3]]], err
    assert err[ends[0]].endswith(" loss=0.6931") and err[ends[1]].startswith("job j1: done in")
    assert err[ends[3]].startswith("job j1: output denoiser: done in")
