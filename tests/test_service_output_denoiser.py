"""The output denoiser through the service: a job with ``output_denoiser`` fits it on public text
after tuning (its progress a stage of the job) and stores it with the prompt; its owner alone
downloads it with the prompt's head; `RaptClient.predict` sends the same privatized rows with
``return_pooled`` and nothing else more, and corrects the states on its own machine."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from _service import (
    LABELS,
    TEXTS,
    FakeRunner,
    add_key,
    hdr,
    make_app,
    service_bert,
    upload_body,
    wait_job,
    write_csv,
)
from fastapi.testclient import TestClient

from rapt.client.client import RaptClient
from rapt.service import Limits, ServiceConfig, create_app

PUBLIC = [f"{a} {b} was {c}" for a in ("the movie", "a film", "this story", "the plot")
          for b in ("music", "scene", "actor") for c in ("good", "bad", "long", "fine", "dull")]


@pytest.fixture()
def service(tmp_path, monkeypatch):
    """The service with the real trainer on the tiny BERT; the denoiser's public corpus is 60
    sentences in code (the default is 3,000 of the built-in datasets)."""
    import rapt.pipeline.user_side as pl

    monkeypatch.setattr(pl, "OUTPUT_DENOISER_ROWS", 60)
    monkeypatch.setattr(pl, "output_denoiser_corpus", lambda dataset: PUBLIC)
    bb = service_bert()
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"],
                        limits=Limits(max_seq_len=64), progress_interval_s=0.0)
    alice, bob = add_key(tmp_path, "alice"), add_key(tmp_path, "bob")
    with TestClient(create_app(cfg, backbones={"tiny": bb})) as tc:
        yield tc, alice, bob, bb, tmp_path


def _client(tc, key, bb, **kw) -> RaptClient:
    return RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc, **kw)


def _tuned(tc, key, bb, tmp_path, *, denoiser: bool, **kw) -> tuple[RaptClient, dict]:
    c = _client(tc, key, bb, eta=8.0, seed=0)
    ds = c.upload(write_csv(tmp_path / "d.csv", TEXTS * 3, LABELS * 3), max_length=32,
                  holdout=False)
    job = c.tune(ds, epochs=1, batch_size=8, method="lora", output_denoiser=denoiser, **kw)
    st = c.wait(job, progress=False, poll_s=0.05, timeout=120)
    assert st["state"] == "succeeded", st
    return c, st


HEADS = {"linear": {}, "label-description": {
    "head": "label-description", "label_descriptions": ["a bad movie", "a good movie"],
    "head_temperature": 0.1}}


@pytest.mark.parametrize("head", list(HEADS))
def test_the_job_fits_and_stores_it_and_the_client_applies_it(service, head):
    from rapt.artifacts import read_output_denoiser
    from rapt.pipeline import Customization
    from rapt.pipeline.user_side import denoised_proba
    from rapt.tuning.tune import TunedPrompt

    tc, alice, bob, bb, tmp_path = service
    c, st = _tuned(tc, alice, bb, tmp_path, denoiser=True, **HEADS[head])
    pid = st["prompt_id"]
    stage = st["stage"]
    assert stage["name"] == "output_denoiser" and stage["done"] == stage["total"] > 60
    info = c.prompt(pid)
    assert info["output_denoiser"] is True
    # stored with the prompt, as `rapt tune --output-denoiser` stores it inside OUT
    folder = next((tmp_path / "svc.db.files" / "prompts").iterdir())
    den, doc = read_output_denoiser(folder)
    rec = doc["record"]
    assert rec["public_rows"] == 60 and rec["eta"] == 8.0 and rec["after"] <= rec["before"]
    # the owner downloads it with the head; another key and a prompt without one: 404
    got = tc.get(f"/v1/prompts/{pid}/output-denoiser", headers=hdr(alice))
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["head"] == {"kind": head, "num_labels": 2,
                            "temperature": 0.1 if head != "linear" else None}
    assert body["denoiser"]["prompt_sha256"] == doc["prompt_sha256"]
    other = tc.get(f"/v1/prompts/{pid}/output-denoiser", headers=hdr(bob))
    assert other.status_code == 404 and other.json()["error"] == "not_found"
    # predict: the service's pooled states, corrected here, then the head
    sent: list[dict] = []
    tc.event_hooks["request"] = [lambda r: sent.append(json.loads(r.read() or b"null"))]
    pred = c.predict(pid, TEXTS[:5])
    assert pred.denoised and pred.remote_probabilities is not None
    (q,) = [b for b in sent if b and "input_ids" in b]
    assert q["return_pooled"] is True
    clean = c._rows(TEXTS[:5], None, None, 128, queries=True)
    tuned = TunedPrompt.load(folder)
    want = denoised_proba(Customization(bb), tuned, den, clean, q["input_ids"])
    torch.testing.assert_close(torch.tensor(pred.probabilities), want, atol=1e-5, rtol=1e-4)
    assert pred.labels == want.argmax(-1).tolist()
    # it corrects something: the service's own probabilities of the same rows differ
    raw = tc.post("/v1/predict", json={"prompt_id": pid, "input_ids": q["input_ids"]},
                  headers=hdr(alice)).json()["probabilities"]
    assert not torch.allclose(torch.tensor(raw), want, atol=1e-4)
    torch.testing.assert_close(torch.tensor(pred.remote_probabilities), torch.tensor(raw))
    plain = c.predict(pid, TEXTS[:5], denoise=False)
    assert not plain.denoised and "return_pooled" not in sent[-1]
    # a denoiser for another width than the local backbone's: refused before any query
    from rapt.client.client import ClientError
    from rapt.local.denoise import OutputDenoiser

    c._denoisers[pid] = (OutputDenoiser(bb.hidden_size * 2), None, {})
    n = len(sent)
    with pytest.raises(ClientError, match="states of width 64, the local backbone's are 32"):
        c.predict(pid, TEXTS[:2])
    assert not [b for b in sent[n:] if b and "input_ids" in b]


def test_the_wire_carries_only_the_return_pooled_flag_more(service):
    """The same client, noise seeded alike, with and without the denoiser: every request body
    is the same but for ``return_pooled``; the download is a GET with no body."""
    tc, alice, _, bb, tmp_path = service
    _, st = _tuned(tc, alice, bb, tmp_path, denoiser=True)
    pid = st["prompt_id"]
    runs = {}
    for denoise in (True, False):
        sent: list[tuple[str, str, bytes]] = []
        tc.event_hooks["request"] = [lambda r, s=sent: s.append((r.method, r.url.path,
                                                                  r.read()))]
        pred = _client(tc, alice, bb, seed=5).predict(pid, TEXTS, denoise=denoise)
        runs[denoise] = (sent, pred)
    (on, p_on), (off, p_off) = runs[True], runs[False]
    bodies_on = [json.loads(b) for _, _, b in on if b]
    bodies_off = [json.loads(b) for _, _, b in off if b]
    assert [b.pop("return_pooled") for b in bodies_on] == [True]
    assert bodies_on == bodies_off
    assert [(m, u) for m, u, b in on if not b and "output-denoiser" in u] == [
        ("GET", f"/v1/prompts/{pid}/output-denoiser")]
    assert p_on.denoised and not p_off.denoised


def test_no_denoiser_no_pooled_request_and_a_404(service):
    tc, alice, _, bb, tmp_path = service
    c, st = _tuned(tc, alice, bb, tmp_path, denoiser=False)
    pid = st["prompt_id"]
    assert st["stage"] is None and c.prompt(pid)["output_denoiser"] is False
    r = tc.get(f"/v1/prompts/{pid}/output-denoiser", headers=hdr(alice))
    assert r.status_code == 404 and "no output denoiser" in r.json()["detail"]
    sent: list[bytes] = []
    tc.event_hooks["request"] = [lambda r: sent.append(r.read())]
    pred = c.predict(pid, TEXTS[:2])
    assert not pred.denoised
    assert [set(json.loads(b)) for b in sent if b] == [{"prompt_id", "input_ids"}]


def test_refused_without_privatization(service):
    tc, alice, _, bb, tmp_path = service
    body = {**upload_body(), "privacy": {"mechanism": "none"}}
    ds = tc.post("/v1/datasets", json=body, headers=hdr(alice)).json()["id"]
    r = tc.post("/v1/jobs", json={"dataset_id": ds, "output_denoiser": True},
                headers=hdr(alice))
    assert r.status_code == 422 and "output_denoiser" in r.json()["detail"], r.text
    assert "unprivatized" in r.json()["detail"]
    assert tc.get("/v1/jobs", headers=hdr(alice)).json() == []  # nothing stored


def _stage_app(tmp_path, monkeypatch, fit):
    import rapt.service.worker as worker

    monkeypatch.setattr(worker, "fit_output_denoiser_for_job", fit)
    key = add_key(tmp_path)
    return make_app(tmp_path, service_bert(), FakeRunner(steps=2)), key


def _job(c, key) -> str:
    ds = c.post("/v1/datasets", json=upload_body(), headers=hdr(key)).json()["id"]
    r = c.post("/v1/jobs", json={"dataset_id": ds, "output_denoiser": True}, headers=hdr(key))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def test_the_stage_shows_in_the_job_and_a_cancel_stops_it(tmp_path, monkeypatch):
    """While the denoiser is fitted the job is running, its stage and progress on show; a
    cancel then ends it cancelled, with no prompt and no checkpoint left."""
    inside, release = threading.Event(), threading.Event()

    def fit(backbone, data, tuned, params, progress):
        progress(3, 10)
        inside.set()
        while True:  # the worker raises from progress() once the job must stop
            release.wait(0.02)
            progress(3, 10)

    app, key = _stage_app(tmp_path, monkeypatch, fit)
    with TestClient(app) as c:
        jid = _job(c, key)
        assert inside.wait(20)
        st = c.get(f"/v1/jobs/{jid}", headers=hdr(key)).json()
        assert st["state"] == "running" and st["step"] == st["total_steps"] == 2
        assert st["stage"]["name"] == "output_denoiser" and st["stage"]["done"] == 3
        assert st["stage"]["total"] == 10 and st["eta_s"] is not None
        c.post(f"/v1/jobs/{jid}/cancel", headers=hdr(key))
        st = wait_job(c, key, jid)
        assert st["state"] == "cancelled" and st["prompt_id"] is None
        assert c.get("/v1/prompts", headers=hdr(key)).json() == []
        assert not list((tmp_path / "svc.db.files" / "checkpoints").glob("*"))


def test_a_shutdown_during_the_fit_requeues_the_job_with_its_checkpoint(tmp_path,
                                                                        monkeypatch):
    from _service import open_store

    inside = threading.Event()

    def fit(backbone, data, tuned, params, progress):
        inside.set()
        while True:
            progress(1, 10)
            threading.Event().wait(0.02)

    app, key = _stage_app(tmp_path, monkeypatch, fit)
    with TestClient(app) as c:
        jid = _job(c, key)
        assert inside.wait(20)
    store = open_store(tmp_path)  # the server stopped: the job waits to be resumed
    try:
        job = store.get_job(jid, None)
    finally:
        store.close()
    assert job["state"] == "queued" and job["stage"] is None
    assert job["checkpoint"] and job["step"] == 2
    # the next server resumes it from that checkpoint and fits the denoiser again
    seen = []

    def fit_again(backbone, data, tuned, params, progress):
        progress(1, 10)
        s = open_store(tmp_path)
        seen.append(s.get_job(jid, None)["stage"])
        s.close()
        raise RuntimeError("stop here")

    runner = FakeRunner(steps=2)
    import rapt.service.worker as worker

    monkeypatch.setattr(worker, "fit_output_denoiser_for_job", fit_again)
    with TestClient(make_app(tmp_path, service_bert(), runner)) as c:
        st = wait_job(c, key, jid)
    assert runner.resumes[0]["step"] == 2 and st["state"] == "failed"
    assert seen[0]["done"] == 1 and seen[0]["total"] == 10


def test_a_failed_fit_fails_the_job_saying_so(tmp_path, monkeypatch):
    def fit(backbone, data, tuned, params, progress):
        raise RuntimeError("public corpus missing")

    app, key = _stage_app(tmp_path, monkeypatch, fit)
    with TestClient(app) as c:
        st = wait_job(c, key, _job(c, key))
        assert st["state"] == "failed" and st["prompt_id"] is None
        assert "output denoiser could not be fitted" in st["error"]
        assert "public corpus missing" in st["error"]
        assert c.get("/v1/prompts", headers=hdr(key)).json() == []


def test_openapi_documents_the_option_and_the_route(tmp_path):
    with TestClient(make_app(tmp_path, service_bert())) as c:
        spec = c.get("/openapi.json").json()
    assert spec["components"]["schemas"]["JobCreate"]["properties"]["output_denoiser"][
        "default"] is False
    route = spec["paths"]["/v1/prompts/{prompt_id}/output-denoiser"]["get"]
    assert {"200", "401", "404"} <= set(route["responses"])


def test_client_commands_ask_for_it_apply_it_and_fuse_the_denoised_slice(tmp_path,
                                                                          monkeypatch):
    """`client tune --output-denoiser --wait`: the job fits it, the held-out slice is scored
    denoised (its one predict call carries return_pooled, nothing else more) and the fusion
    fitted on that; `client predict` applies it, --no-denoise not, and both send the same
    privatized rows (noise seeded alike)."""
    from _wire import recorded_wire, rows, write
    from typer.testing import CliRunner

    import rapt.pipeline.user_side as pl
    from rapt.cli import app

    monkeypatch.setattr(pl, "OUTPUT_DENOISER_ROWS", 60)
    monkeypatch.setattr(pl, "output_denoiser_corpus", lambda dataset: PUBLIC)
    with recorded_wire(tmp_path, monkeypatch) as (sent, key, folder, bb, _):
        run = CliRunner().invoke
        base = ["--url", "http://testserver", "--key", key]
        up = run(app, ["client", "upload", write(tmp_path / "d.csv", rows(120, 0)), *base,
                       "--backbone", str(folder), "--eta", "5", "--max-length", "32"])
        assert up.exit_code == 0, up.output
        dataset = up.stdout.strip().splitlines()[-1]
        n0 = len(sent)
        t = run(app, ["client", "tune", dataset, *base, "--epochs", "1", "--batch-size", "8",
                      "--output-denoiser", "--wait", "--local-out", str(tmp_path / "mine")])
        assert t.exit_code == 0, t.output
        (job,) = [json.loads(b) for m, u, b in sent[n0:] if (m, u) == ("POST", "/v1/jobs")]
        assert job["output_denoiser"] is True
        assert "output denoiser (fitted by the service on 60 public sentences at η = 5" in \
            t.stderr
        held = [json.loads(b) for m, u, b in sent[n0:] if u == "/v1/predict"]
        assert len(held) == 1 and set(held[0]) == {"prompt_id", "input_ids", "return_pooled"}
        assert "privatized model (denoised on this machine) " in t.stderr
        prompt = json.loads(t.stdout[t.stdout.index("{"):])["prompt_id"]
        queries = write(tmp_path / "q.csv", rows(10, 1))
        bodies = {}
        for flag in ([], ["--no-denoise"]):
            n1 = len(sent)
            p = run(app, ["client", "predict", prompt, queries, *base, "--backbone",
                          str(folder), "--local", str(tmp_path / "mine"), "--fused", "--out",
                          str(tmp_path / "p.jsonl"), *flag])
            assert p.exit_code == 0, p.output
            got = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
            # the service's own probabilities under _remote, the denoised ones (those fused)
            # under _denoised
            assert ("probabilities_denoised" in got[0]) is not bool(flag)
            bodies[bool(flag)] = [json.loads(b) for _, u, b in sent[n1:] if u == "/v1/predict"]
            if flag:
                assert "output denoiser of prompt" in p.stderr and "(--no-denoise)" in p.stderr
            else:
                assert "corrected on this machine by its output denoiser" in p.stderr
            assert "fused: the privatized model and your local model" in p.stderr
        assert bodies[False][0].pop("return_pooled") is True
        assert bodies[False] == bodies[True]
