"""What a probe of the running service found (keys in query strings and the access log, the last
admin key, replayed SAP steps with another body, blank rows, η out of range, pads past the
length limit, the OpenAPI document's error codes and 405's Allow), and the race that let a
job show its end while its checkpoint was still on disk. Each test failed on the code before
its fix (the docstrings say how)."""

from __future__ import annotations

import logging
import re
import threading
import time

import httpx
import pytest
import torch
from _service import (
    SQLITE_ONLY,
    FakeRunner,
    add_key,
    free_port,
    hdr,
    make_app,
    ones,
    sap_post,
    sap_session,
    upload_body,
    wait_job,
)
from fastapi.testclient import TestClient

from rapt.service import auth
from rapt.service.store import LastAdminKeyError
from rapt.split import Activations, OutputGrad, wire


@pytest.fixture()
def svc(tmp_path, tiny_bert, backend):
    alice, ops = add_key(tmp_path, "alice"), add_key(tmp_path, "ops", admin=True)
    runner = FakeRunner()
    app = make_app(tmp_path, tiny_bert, runner, max_upload_bytes=2_000_000, max_seq_len=32,
                   max_queued_jobs=8, max_predict_rows=16)
    with TestClient(app) as c:
        c.alice, c.admin, c.runner, c.tmp = alice, ops, runner, tmp_path
        c.store = app.state.svc.store
        yield c


# -- keys never in a URL -------------------------------------------------------------------------
@SQLITE_ONLY
def test_api_key_in_the_query_is_refused(svc):
    """The key is read from headers only: a valid key in any query parameter is 401."""
    for name in ("api_key", "apikey", "key", "token", "access_token", "authorization"):
        r = svc.get(f"/v1/datasets?{name}={svc.alice}")
        assert r.status_code == 401, (name, r.text)
    assert svc.get("/v1/datasets", headers=hdr(svc.alice)).status_code == 200


def test_access_log_of_a_real_server_holds_no_query_string(tmp_path, tiny_bert):
    """Old behaviour: `GET /v1/datasets?api_key=KEY` (401) left KEY in uvicorn's access log."""
    import uvicorn

    key = add_key(tmp_path, "alice")
    app = make_app(tmp_path, tiny_bert)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="info"))
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    handler = Keep()
    try:
        t0 = time.time()
        while not server.started and time.time() - t0 < 30:
            time.sleep(0.05)
        assert server.started
        # Added once the server configured its logging (which replaces the handlers).
        logging.getLogger("uvicorn.access").addHandler(handler)
        url = f"http://127.0.0.1:{port}/v1/datasets"
        assert httpx.get(f"{url}?api_key={key}&x=1").status_code == 401
        assert httpx.get(url, headers=hdr(key)).status_code == 200
    finally:
        server.should_exit = True
        thread.join(30)
        logging.getLogger("uvicorn.access").removeHandler(handler)
    assert len(lines) == 2, lines
    assert not any(key in line or key[5:15] in line for line in lines), lines
    assert "/v1/datasets?[redacted]" in lines[0] and "401" in lines[0], lines
    assert "GET /v1/datasets HTTP/1.1" in lines[1] and "200" in lines[1], lines


# -- the last admin key -------------------------------------------------------------------------
def test_the_last_live_admin_key_cannot_be_revoked(svc):
    """Old behaviour: an admin could revoke (or purge) the last live admin key, itself
    included, over HTTP and with `rapt serve keys revoke`, locking every operator out."""
    store, ops = svc.store, svc.admin
    ops_id = store.owner_of_hash(auth.hash_key(ops))
    sid = sap_session(svc, ops)  # an object of the admin key: a refusal must not touch it
    for action in (store.revoke_key, store.purge_key):
        with pytest.raises(LastAdminKeyError, match="last live admin key"):
            action("ops")
    for call in (svc.post, svc.delete):
        path = "/v1/admin/keys/ops" + ("/revoke" if call == svc.post else "")
        r = call(path, headers=hdr(ops))
        assert r.status_code == 409 and "last live admin key" in r.json()["detail"], r.text
    assert store.owner_of_hash(auth.hash_key(ops)) == ops_id
    assert svc.get(f"/v1/sap/sessions/{sid}", headers=hdr(ops)).status_code == 200
    assert svc.get("/v1/stats", headers=hdr(ops)).status_code == 200
    if store.dialect == "sqlite":  # the CLI on the test's database
        from typer.testing import CliRunner

        from rapt.cli import app as cli

        out = CliRunner().invoke(cli, ["serve", "--db", str(svc.tmp / "svc.db"), "keys",
                                       "revoke", "ops"])
        assert out.exit_code == 2 and "last live admin key" in out.output, out.output
    # With a second admin key, the first can go; then the second is the last one.
    ops2 = add_key(svc.tmp, "ops2", admin=True)
    r = svc.post("/v1/admin/keys/ops/revoke", headers=hdr(ops2))
    assert r.status_code == 200, r.text
    assert svc.get("/v1/stats", headers=hdr(ops)).status_code == 401
    assert svc.post("/v1/admin/keys/ops2/revoke", headers=hdr(ops2)).status_code == 409
    # Revoking other keys is unaffected, and a revoked admin key can still be purged.
    assert svc.post("/v1/admin/keys/alice/revoke", headers=hdr(ops2)).status_code == 200
    assert svc.delete("/v1/admin/keys/ops", headers=hdr(ops2)).status_code == 200


# -- a replayed SAP step must be the applied one -------------------------------------------------
def test_a_replayed_backward_with_another_body_is_409(sap_service, tmp_path):
    """Old behaviour: a repeat of the applied backward step was answered 200 (replayed) even
    when its gradient differed from the one applied. Also after a restart (the digest is
    saved with the step)."""
    from rapt.service import Limits, ServiceConfig, create_app

    tc, (key, _), bb = sap_service
    me = hdr(key)
    sid = sap_session(tc, key, unfreeze_bottom=True)
    assert sap_post(tc, sid, "forward", Activations(0, torch.randn(4, 6, 32), ones(4, 6)),
                 me).status_code == 200
    applied = wire.encode(OutputGrad(0, torch.randn(4, 32)))
    r = sap_post(tc, sid, "backward", applied, me)
    assert r.status_code == 200 and r.headers["x-rapt-replayed"] == "0", r.text
    other = wire.encode(OutputGrad(0, torch.randn(4, 32)))
    r = sap_post(tc, sid, "backward", other, me)
    assert r.status_code == 409 and r.json()["error"] == "replay_mismatch", r.text
    assert r.headers["x-rapt-last-step"] == "0"
    r = sap_post(tc, sid, "backward", applied, me)
    assert r.status_code == 200 and r.headers["x-rapt-replayed"] == "1", r.text
    config = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"],
                           limits=Limits(max_seq_len=64), progress_interval_s=0.0)
    with TestClient(create_app(config, backbones={"tiny": bb})) as again:  # a restart
        assert sap_post(again, sid, "backward", other, me).status_code == 409
        r = sap_post(again, sid, "backward", applied, me)
        assert r.status_code == 200 and r.headers["x-rapt-replayed"] == "1", r.text


# -- validation ---------------------------------------------------------------------------------
@SQLITE_ONLY
@pytest.mark.parametrize("texts,pairs", [
    (["\u0000\u0000"], None), (["fine", "\u0000 \u200b\t"], None), (["fine"], ["\u0000"])])
def test_blank_rows_are_refused(svc, texts, pairs):
    """Old behaviour: `["\\u0000\\u0000"]` passed `.strip()` and was stored as an empty row."""
    a = svc.alice
    before = svc.store.counts()
    body = {**upload_body(n=len(texts)), "input_ids": None, "texts": texts, "text_pairs": pairs}
    r = svc.post("/v1/datasets", json=body, headers=hdr(a))
    assert r.status_code == 422 and "empty" in r.json()["detail"], r.text
    assert svc.store.counts() == before


@SQLITE_ONLY
def test_rows_the_tokenizer_empties_are_refused(svc):
    """A text of characters the tokenizer drops (here a lone combining accent, which BERT's
    accent stripping removes) is refused once tokenized, not trained on as an empty row."""
    body = {**upload_body(n=1), "input_ids": None, "texts": ["\u0301"]}
    r = svc.post("/v1/datasets", json=body, headers=hdr(svc.alice))
    assert r.status_code == 422 and "no token is left" in r.json()["detail"], r.text


@SQLITE_ONLY
@pytest.mark.parametrize("eta,ok", [(1e-320, False), (5e-4, False), (2e6, False),
                                    (1e-3, True), (1e6, True)])
def test_eta_outside_the_supported_range_is_refused(svc, tmp_path, eta, ok):
    """Old behaviour: η 1e-320 (1/η overflows) was accepted by the service, the client, the
    CLI and the mechanism."""
    from typer.testing import CliRunner

    from rapt.cli import app as cli
    from rapt.client.client import ClientError, RaptClient
    from rapt.config import ETA_MAX, ETA_MIN
    from rapt.privacy.mechanism import Privatizer
    from rapt.split import SplitConfig

    body = upload_body()
    body["privacy"]["eta"] = eta
    r = svc.post("/v1/datasets", json=body, headers=hdr(svc.alice))
    assert r.status_code == (201 if ok else 422), r.text
    emb = torch.randn(20, 8)
    if ok:
        assert Privatizer(emb, eta).eta == eta
        return
    assert "privacy.eta" in r.json()["detail"]
    with pytest.raises(ValueError, match=re.escape(f"[{ETA_MIN:g}, {ETA_MAX:g}]")):
        Privatizer(emb, eta)
    with pytest.raises(ClientError, match="eta must be a finite number in"):
        RaptClient("https://x", "k", backbone=object(), eta=eta)
    with pytest.raises(ValueError, match="SplitConfig.eta must be a finite number in"):
        SplitConfig(eta=eta)
    src = tmp_path / "in.txt"
    src.write_text("a movie\n")
    out = CliRunner().invoke(cli, ["privatize", str(src), str(tmp_path / "out.txt"),
                                   "--eta", repr(eta)])
    assert out.exit_code == 2 and "--eta must be a finite number in" in out.output, out.output


@SQLITE_ONLY
def test_pad_tokens_count_toward_the_length_limit(svc):
    """Old behaviour: trailing pad tokens were stripped before the length check, so one row
    with 100,000 pads (max_seq_len 32) was stored (201)."""
    a = svc.alice
    body = upload_body(n=2)
    body["input_ids"][0] = body["input_ids"][0] + [0] * 100_000  # [PAD] is id 0
    r = svc.post("/v1/datasets", json=body, headers=hdr(a))
    assert r.status_code == 422 and "input_ids[0] has 100010 tokens" in r.json()["detail"], \
        r.text
    # Padding within the limit is still stripped: the stored rows are the real ones.
    body = upload_body(n=2)
    real = body["input_ids"][0]
    body["input_ids"][0] = real + [0] * (32 - len(real))
    r = svc.post("/v1/datasets", json=body, headers=hdr(a))
    assert r.status_code == 201 and r.json()["max_row_len"] == len(real), r.text


@SQLITE_ONLY
def test_a_body_that_is_not_text_is_422_like_any_body_that_is_not_json(svc):
    """Found by schemathesis: bytes that are not UTF-8 under `Content-Type: application/json`
    got FastAPI's 400 "There was an error parsing the body", which no route documented; a body
    that is not JSON is 422 everywhere else."""
    for path in ("/v1/datasets", "/v1/jobs", "/v1/predict", "/v1/sap/sessions"):
        r = svc.post(path, content=b'{\x0bD1\xff\xfeZ', headers={
            **hdr(svc.alice), "Content-Type": "application/json"})
        assert r.status_code == 422 and "not valid JSON" in r.json()["detail"], (path, r.text)


# -- the OpenAPI document -----------------------------------------------------------------------
@SQLITE_ONLY
def test_openapi_lists_the_error_codes_each_route_answers_with(svc):
    """Old behaviour: list routes documented no 401, the meta routes no 413, and routes with
    parameters documented FastAPI's own 422 body, not the service's."""
    doc = svc.get("/openapi.json").json()
    keyless = {("get", "/v1/health"), ("get", "/v1/backbones")}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert {"413", "500"} <= codes, (method, path, codes)
            assert ("401" in codes) == ((method, path) not in keyless), (method, path, codes)
            if "/v1/stats" in path or "/admin/" in path:
                assert "403" in codes, (method, path, codes)
            if "{" in path:
                assert {"404", "422"} <= codes, (method, path, codes)
            if method == "post" and "{" not in path:
                assert "422" in codes, (method, path, codes)
            for code in codes - {"200", "201", "202", "204", "304"}:
                schema = op["responses"][code]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, code)
    for method, path in (("delete", "/v1/datasets/{dataset_id}"),
                         ("post", "/v1/jobs/{job_id}/cancel"),
                         ("post", "/v1/admin/keys/{key}/revoke"),
                         ("post", "/v1/sap/sessions/{session_id}/backward")):
        assert "409" in doc["paths"][path][method]["responses"], (method, path)
    assert "HTTPValidationError" not in doc["components"]["schemas"]


@SQLITE_ONLY
def test_405_names_every_method_of_the_path_in_allow(svc):
    """Old behaviour: 405 carried no `Allow` header (the error handler dropped it); the router's
    own would name only the first route of a path that has several."""
    for method, path, allow in (("PUT", "/v1/health", "GET"),
                                ("DELETE", "/v1/datasets", "GET, POST"),
                                ("PATCH", "/v1/datasets/ds_x", "DELETE, GET"),
                                ("GET", "/v1/predict", "POST")):
        r = svc.request(method, path, headers=hdr(svc.alice))
        assert r.status_code == 405 and r.headers.get("allow") == allow, (method, path,
                                                                          r.headers)
        assert r.json()["error"] == "method_not_allowed"


# -- a job ends only once its checkpoint is gone ------------------------------------------------
def test_a_job_shows_its_end_only_once_its_checkpoint_is_gone(svc, monkeypatch):
    """The race behind a flaky test_failed_and_cancelled_jobs_leave_no_checkpoint: the worker
    wrote the final state (failed, cancelled, succeeded), then deleted the checkpoint; a client
    polling the job could see it ended and still find `job_*.pt` on disk. Recorded here at the
    moment each final state is written: the file must be gone already."""
    a, store = svc.alice, svc.store
    ck = store.files / "checkpoints"
    seen: list[tuple[str, bool]] = []
    update, finish = store.update_claimed, store.finish_job_with_prompt

    def update_claimed(jid, worker, /, **fields):
        if fields.get("state") in ("failed", "cancelled"):
            seen.append((fields["state"], (ck / f"{jid}.pt").exists()))
        return update(jid, worker, **fields)

    def finish_job_with_prompt(jid, *args, **kw):
        seen.append(("succeeded", (ck / f"{jid}.pt").exists()))
        return finish(jid, *args, **kw)

    monkeypatch.setattr(store, "update_claimed", update_claimed)
    monkeypatch.setattr(store, "finish_job_with_prompt", finish_job_with_prompt)
    ds = svc.post("/v1/datasets", json=upload_body(), headers=hdr(a)).json()["id"]
    j = svc.post("/v1/jobs", json={"dataset_id": ds}, headers=hdr(a)).json()["id"]
    assert wait_job(svc, a, j)["state"] == "succeeded"
    svc.runner.gate.clear()
    j = svc.post("/v1/jobs", json={"dataset_id": ds}, headers=hdr(a)).json()["id"]
    assert svc.runner.at_gate.wait(10) and (ck / f"{j}.pt").exists()
    svc.post(f"/v1/jobs/{j}/cancel", headers=hdr(a))
    assert wait_job(svc, a, j)["state"] == "cancelled"
    svc.runner.gate.set()
    svc.runner.fail_at = 3
    j = svc.post("/v1/jobs", json={"dataset_id": ds}, headers=hdr(a)).json()["id"]
    assert wait_job(svc, a, j)["state"] == "failed"
    assert seen == [("succeeded", False), ("cancelled", False), ("failed", False)], seen
    assert list(ck.iterdir()) == []



@SQLITE_ONLY
@pytest.mark.parametrize("row", [[2, 3], [0], [2, 0, 0, 3], [4]])
def test_rows_of_only_special_or_pad_ids_are_refused(svc, row):
    """Old behaviour: `input_ids` rows holding no token of text ([CLS] [SEP], a pad, [MASK])
    were stored and predicted on, while a blank text is refused; now both routes answer 422
    naming the row (negative control: the same bodies with a text token pass)."""
    a = svc.alice
    body = upload_body(n=3)
    ok = svc.post("/v1/datasets", json=body, headers=hdr(a))
    assert ok.status_code == 201, ok.text
    job = svc.post("/v1/jobs", json={"dataset_id": ok.json()["id"]}, headers=hdr(a)).json()
    pid = wait_job(svc, a, job["id"])["prompt_id"]
    before = svc.store.counts()
    body["input_ids"][1] = row
    r = svc.post("/v1/datasets", json=body, headers=hdr(a))
    assert r.status_code == 422 and "input_ids[1] holds only special or pad tokens" in \
        r.json()["detail"], r.text
    r = svc.post("/v1/predict", json={"prompt_id": pid, "input_ids": [[2, 7, 3], row]},
                 headers=hdr(a))
    assert r.status_code == 422 and "input_ids[1] holds only special" in r.json()["detail"], \
        r.text
    assert svc.store.counts() == before
    r = svc.post("/v1/predict", json={"prompt_id": pid, "input_ids": [[2, 7, 3], row + [7]]},
                 headers=hdr(a))
    assert r.status_code == 200, r.text
