"""Service API in-process (FastAPI TestClient) with a fake trainer injected: routes, errors,
limits, tenancy, job lifecycle, restart recovery, micro-batching. The end-to-end test with the
real trainer and a uvicorn subprocess is in test_service_e2e.py."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from _service import (
    SQLITE_ONLY,
    FakePrompt,
    FakeRunner,
    add_key,
    hdr,
    make_app,
    open_store,
    service_bert,
    upload_body,
    wait_job,
)
from fastapi.testclient import TestClient
from safetensors.torch import load_file, save_file

from rapt.service import ServiceConfig, auth, create_app
from rapt.service.store import MIGRATIONS, Store


def make_prompt(c, key, seed=0, n=6, **job) -> str:
    """Upload a dataset, tune on it, return the prompt id."""
    r = c.post("/v1/datasets", json=upload_body(n=n), headers=hdr(key))
    assert r.status_code == 201, r.text
    r = c.post("/v1/jobs", json={"dataset_id": r.json()["id"], "seed": seed, **job},
               headers=hdr(key))
    assert r.status_code == 202, r.text
    st = wait_job(c, key, r.json()["id"])
    assert st["state"] == "succeeded", st
    return st["prompt_id"]


@pytest.fixture()
def svc(tmp_path, tiny_bert, backend):
    alice, bob = add_key(tmp_path, "alice"), add_key(tmp_path, "bob")
    admin = add_key(tmp_path, "ops", admin=True)
    runner = FakeRunner()
    app = make_app(tmp_path, tiny_bert, runner, max_upload_bytes=20_000, max_seq_len=32,
                   max_queued_jobs=2, max_predict_rows=16)
    with TestClient(app) as c:
        c.alice, c.bob, c.admin, c.runner = alice, bob, admin, runner
        c.store = app.state.svc.store
        yield c


def test_openapi_and_health(svc):
    spec = svc.get("/openapi.json").json()
    for path in ("/v1/datasets", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel",
                 "/v1/prompts/{prompt_id}", "/v1/predict"):
        assert path in spec["paths"], path
    assert svc.get("/v1/health").json()["backbones"] == ["tiny"]
    import sqlalchemy as sa

    with svc.store._tx() as db:  # the store's lock: its one SQLite connection is shared
        if svc.store.dialect == "sqlite":
            assert db.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        hashes = list(db.exec_driver_sql("SELECT key_hash FROM api_keys").scalars())
        assert db.execute(sa.text("SELECT MAX(version) FROM schema_version")).scalar() \
            == MIGRATIONS[-1].version
    assert auth.hash_key(svc.alice) in hashes and svc.alice not in hashes
    r = svc.get("/v1/nowhere")
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = svc.delete("/v1/predict")
    assert r.status_code == 405 and set(r.json()) == {"error", "detail"}


def test_full_lifecycle_and_tenancy(svc):
    a, b = svc.alice, svc.bob
    r = svc.post("/v1/datasets", json=upload_body(), headers=hdr(a))
    assert r.status_code == 201, r.text
    ds = r.json()
    assert ds["n_examples"] == 6 and ds["privacy"]["eta"] == 10.0
    r = svc.post("/v1/jobs", json={"dataset_id": ds["id"], "epochs": 1, "lr": 0.01},
                 headers=hdr(a))
    assert r.status_code == 202, r.text
    st = wait_job(svc, a, r.json()["id"])
    assert st["state"] == "succeeded" and st["step"] == 4 and st["total_steps"] == 4
    assert st["loss"] == pytest.approx(0.25) and st["eta_s"] == 0.0 and st["elapsed_s"] >= 0
    assert st["epoch"] == 1.0  # epochs done (issue 32 item 6), not the last epoch's index 0
    pid = st["prompt_id"]
    # Privatized texts are accepted too; the service tokenizes them.
    r = svc.post("/v1/predict", json={"prompt_id": pid, "texts": ["the movie", "bad plot"]},
                 headers=hdr(a))
    assert r.status_code == 200 and len(r.json()["labels"]) == 2, r.text
    body = upload_body()
    body["texts"] = ["a good film"] * 6
    del body["input_ids"]
    r = svc.post("/v1/datasets", json=body, headers=hdr(a))
    assert r.status_code == 201 and r.json()["max_row_len"] == 5, r.text
    info = svc.get(f"/v1/prompts/{pid}", headers=hdr(a)).json()
    assert info["num_labels"] == 2 and info["job_id"] == st["id"]
    rows = upload_body(3)["input_ids"]
    r = svc.post("/v1/predict", json={"prompt_id": pid, "input_ids": rows}, headers=hdr(a))
    assert r.status_code == 200, r.text
    out = r.json()
    ref = FakePrompt.load(svc.store.files / "prompts" / pid).predict_proba(None, rows)
    assert out["labels"] == ref.argmax(-1).tolist()
    assert torch.allclose(torch.tensor(out["probabilities"]), ref, atol=1e-6)
    # Bob sees none of Alice's objects, and lists only his own (none).
    for path in (f"/v1/datasets/{ds['id']}", f"/v1/jobs/{st['id']}", f"/v1/prompts/{pid}"):
        r = svc.get(path, headers=hdr(b))
        assert r.status_code == 404 and r.json()["error"] == "not_found", path
    assert svc.get("/v1/jobs", headers=hdr(b)).json() == []
    assert [j["id"] for j in svc.get("/v1/jobs", headers=hdr(a)).json()] == [st["id"]]
    before = svc.store.counts()
    for method, path, body in [
            ("POST", "/v1/predict", {"prompt_id": pid, "input_ids": rows}),
            ("POST", "/v1/jobs", {"dataset_id": ds["id"]}),
            ("POST", f"/v1/jobs/{st['id']}/cancel", None)]:
        r = svc.request(method, path, json=body, headers=hdr(b))
        assert r.status_code == 404, (path, r.text)
    assert svc.store.counts() == before


BAD = [  # (description, body or raw bytes, expected status, expected error, text in detail)
    ("labels length", lambda b: b.update(labels=[0]), 422, "validation_error", "labels"),
    ("label range", lambda b: b["labels"].__setitem__(0, 7), 422, "validation_error",
     "num_labels"),
    ("unknown mechanism", lambda b: b["privacy"].update(mechanism="magic"), 422,
     "validation_error", "privacy.mechanism"),
    ("eta <= 0", lambda b: b["privacy"].update(eta=-1.0), 422, "validation_error", "eta"),
    ("token id", lambda b: b["input_ids"][1].__setitem__(2, 10**6), 422, "invalid_token_id",
     "input_ids[1][2]"),
    ("string id", lambda b: b["input_ids"][0].__setitem__(1, "7"), 422, "validation_error",
     "input_ids[0][1]"),
    ("float label", lambda b: b["labels"].__setitem__(0, 1.0), 422, "validation_error",
     "labels[0]"),
    ("plain id", lambda b: b.update(plain_ids=[5, -1]), 422, "invalid_token_id", "plain_ids[1]"),
    ("sequence length", lambda b: b["input_ids"].__setitem__(0, [5] * 40), 422,
     "limit_exceeded", "max_seq_len=32"),
    ("backbone", lambda b: b.update(backbone="gpt-9"), 422, "unknown_backbone", "gpt-9"),
    ("ids and texts", lambda b: b.update(texts=["a"] * 6), 422, "validation_error",
     "exactly one of input_ids and texts"),
    ("empty row", lambda b: b["input_ids"].__setitem__(2, []), 422, "validation_error",
     "input_ids[2] is empty"),
    ("long text", lambda b: (b.pop("input_ids"), b.update(texts=["the movie"] * 5
                                                          + ["good " * 40])), 422,
     "limit_exceeded", "max_seq_len=32"),
    ("extra field", lambda b: b.update(raw_text=["secret"]), 422, "validation_error",
     "raw_text"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_uploads_leave_store_unchanged(svc, case):
    _, mutate, status, error, detail = case
    body = upload_body()
    mutate(body)
    before = svc.store.counts()
    r = svc.post("/v1/datasets", json=body, headers=hdr(svc.alice))
    assert r.status_code == status, r.text
    assert r.json()["error"] == error and detail in r.json()["detail"], r.json()
    assert svc.store.counts() == before


def test_auth_malformed_and_oversize(svc):
    before = svc.store.counts()
    for headers in ({}, hdr("rapt_wrong"), {"Authorization": "Basic abc"}):
        r = svc.post("/v1/datasets", json=upload_body(), headers=headers)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
    r = svc.post("/v1/datasets", content=b"{not json", headers={
        **hdr(svc.alice), "Content-Type": "application/json"})
    assert r.status_code == 422 and "JSON" in r.json()["detail"]
    r = svc.post("/v1/datasets", json=upload_body(n=1500), headers=hdr(svc.alice))
    assert r.status_code == 413 and "max_upload_bytes=20000" in r.json()["detail"]
    assert svc.store.counts() == before


BAD_JOBS = [
    ("unknown method", {"method": "magic"}, "method"),
    ("lr too big", {"lr": 5.0}, "lr"),
    ("epochs 0", {"epochs": 0}, "epochs"),
    ("batch too big", {"batch_size": 10**6}, "batch_size"),
    ("dp both", {"dp": {"target_epsilon": 1.0, "noise_multiplier": 1.0}}, "dp"),
    # Old behaviour: 202, then DP-SGD without noise reporting ε null like a job without DP.
    ("dp noise 0", {"dp": {"noise_multiplier": 0.0}}, "no privacy guarantee"),
    ("dp delta 1/N", {"batch_size": 2, "dp": {"noise_multiplier": 1.0, "delta": 1 / 6}},
     "dp.delta"),
    # Old behaviour: accepted, and ε reported 0.0 (the conversion at δ = 1/N went below 0).
    ("dp target out of reach", {"batch_size": 2, "dp": {"target_epsilon": 1e-6}},
     "cannot reach ε = 1e-06"),
    # Old behaviour: a 500 (ZeroDivisionError in opacus), and for 1e-6 a job that "succeeded"
    # with ε = 2.2e12, summed into the key's ε metric.
    ("dp noise 1e-300", {"batch_size": 2, "dp": {"noise_multiplier": 1e-300}},
     "dp.noise_multiplier = 1e-300 gives ε = ∞"),
    ("dp noise 1e-6", {"batch_size": 2, "dp": {"noise_multiplier": 1e-6}}, "above ε_max = 100"),
    ("dp noise smallest", {"batch_size": 2, "dp": {"noise_multiplier": 1e-6}},
     "smallest σ accepted here is"),
    ("dp target above ε_max", {"dp": {"target_epsilon": 101.0}}, "target_epsilon"),
    ("unknown option", {"momentum": 0.9}, "momentum"),
    ("descriptions per label", {"label_descriptions": ["a", "b", "c"]}, "label_descriptions"),
    ("description head without them", {"head": "label-description"}, "label_descriptions"),
    ("unknown head", {"head": "mlm"}, "head"),
    ("rec reduction", {"rec_reduction": "max"}, "rec_reduction"),
]


@pytest.mark.parametrize("case", BAD_JOBS, ids=[c[0] for c in BAD_JOBS])
def test_bad_jobs_leave_store_unchanged(svc, case):
    _, extra, field = case
    ds = svc.post("/v1/datasets", json=upload_body(), headers=hdr(svc.alice)).json()
    before = svc.store.counts()
    r = svc.post("/v1/jobs", json={"dataset_id": ds["id"], **extra}, headers=hdr(svc.alice))
    assert r.status_code == 422 and field in r.json()["detail"], r.text
    assert svc.store.counts() == before


def test_job_limits_and_cancel(svc):
    a = svc.alice
    ds = svc.post("/v1/datasets", json=upload_body(), headers=hdr(a)).json()
    before = svc.store.counts()
    r = svc.post("/v1/jobs", json={"dataset_id": ds["id"], "reconstruction": True},
                 headers=hdr(a))
    assert r.status_code == 422 and "plain_ids" in r.json()["detail"]
    assert svc.store.counts() == before
    svc.runner.gate.clear()  # the first job stops at step 2 and holds the worker
    j1 = svc.post("/v1/jobs", json={"dataset_id": ds["id"]}, headers=hdr(a)).json()["id"]
    assert svc.runner.at_gate.wait(10)
    st = svc.get(f"/v1/jobs/{j1}", headers=hdr(a)).json()
    assert st["state"] == "running" and st["step"] == 2 and st["eta_s"] is not None
    queued = [svc.post("/v1/jobs", json={"dataset_id": ds["id"]}, headers=hdr(a)).json()["id"]
              for _ in range(2)]
    before = svc.store.counts()
    r = svc.post("/v1/jobs", json={"dataset_id": ds["id"]}, headers=hdr(a))
    assert r.status_code == 429 and "max_queued_jobs=2" in r.json()["detail"]
    assert svc.store.counts() == before
    assert svc.post(f"/v1/jobs/{queued[0]}/cancel", headers=hdr(a)).json()["state"] == \
        "cancelled"
    assert svc.post(f"/v1/jobs/{j1}/cancel", headers=hdr(a)).status_code == 200
    assert wait_job(svc, a, j1)["state"] == "cancelled"
    svc.runner.gate.set()
    st = wait_job(svc, a, queued[1])
    assert st["state"] == "succeeded" and st["prompt_id"]
    r = svc.post(f"/v1/jobs/{j1}/cancel", headers=hdr(a))
    assert r.status_code == 409 and "cancelled" in r.json()["detail"]
    assert svc.store.counts()["prompts"] == 1  # cancelled jobs leave no prompt


def test_restart_resumes_from_checkpoint_or_fails_with_reason(tmp_path, tiny_bert, backend):
    key = add_key(tmp_path)
    runner = FakeRunner()
    runner.gate.clear()
    app = make_app(tmp_path, tiny_bert, runner)
    with TestClient(app) as c:
        ds = c.post("/v1/datasets", json=upload_body(), headers=hdr(key)).json()
        jid = c.post("/v1/jobs", json={"dataset_id": ds["id"]}, headers=hdr(key)).json()["id"]
        assert runner.at_gate.wait(10)
        store = app.state.svc.store
        # A second job that "was running" in a crashed process before any checkpoint.
        ghost = store.create_job(store.get_job(jid, None)["owner"], ds["id"], "tiny",
                                 {"method": "prompt", "seed": 0})
        store.update_job(ghost, state="running")
    # Shutdown stopped the job at step 2 with a checkpoint; it must not be lost.
    runner2 = FakeRunner()
    with TestClient(make_app(tmp_path, tiny_bert, runner2)) as c:
        st = wait_job(c, key, jid)
        assert st["state"] == "succeeded" and st["resumed_from_step"] == 2, st
        assert runner2.resumes[0]["step"] == 2
        g = c.get(f"/v1/jobs/{ghost}", headers=hdr(key)).json()
        assert g["state"] == "failed" and "restart" in g["error"]
        pid = st["prompt_id"]
    with TestClient(make_app(tmp_path, tiny_bert, FakeRunner())) as c:
        assert c.get(f"/v1/prompts/{pid}", headers=hdr(key)).status_code == 200


@SQLITE_ONLY  # HTTP and batching behaviour: the store backend plays no part
def test_concurrent_requests_share_forward_passes(svc):
    a = svc.alice
    prompts = []
    for seed in range(3):
        ds = svc.post("/v1/datasets", json=upload_body(n=4 + seed), headers=hdr(a)).json()
        jid = svc.post("/v1/jobs", json={"dataset_id": ds["id"], "seed": seed},
                       headers=hdr(a)).json()["id"]
        prompts.append(wait_job(svc, a, jid)["prompt_id"])
    rows = upload_body(n=2)["input_ids"]
    refs = {p: FakePrompt.load(svc.store.files / "prompts" / p).predict_proba(None, rows)
            for p in prompts}
    ops = hdr(svc.admin)
    before = dict(svc.get("/v1/stats", headers=ops).json()["tiny"])

    def one(i):
        p = prompts[i % 3]
        r = svc.post("/v1/predict", json={"prompt_id": p, "input_ids": rows}, headers=hdr(a))
        return p, r.json()

    with ThreadPoolExecutor(12) as ex:
        results = list(ex.map(one, range(60)))
    for p, out in results:
        assert torch.allclose(torch.tensor(out["probabilities"]), refs[p], atol=1e-6)
    after = svc.get("/v1/stats", headers=ops).json()["tiny"]
    assert after["requests"] - before["requests"] == 60
    assert after["batches"] - before["batches"] < 60  # requests were grouped
    assert after["max_prompts_in_batch"] >= 2  # groups mixed several prompts
    r = svc.post("/v1/predict", json={"prompt_id": prompts[0], "input_ids": rows * 9},
                 headers=hdr(a))
    assert r.status_code == 422 and "max_predict_rows=16" in r.json()["detail"]


def test_mixed_prompts_one_forward_pass_matches_per_prompt(tiny_bert):
    """Soft prompts of several tasks share one backbone pass and give each prompt's own
    predict_proba (plain-token masking included)."""
    from rapt.service import mixed
    from rapt.service.inference import MicroBatcher
    from rapt.tuning.reconstruction import build_rows
    from rapt.tuning.tune import TuneConfig, tune

    tok = tiny_bert.tokenizer
    texts = ["the movie was good", "awful plot and boring actors", "great fun", "sad and dull"]
    plain = [10, 11, 12]
    prompts = []
    for seed, pl, C in ((0, None, 2), (1, plain, 3), (2, None, 2)):
        rows = build_rows(tok, texts, 32, plain_ids=pl)
        prompts.append((tune(tiny_bert, rows, [i % C for i in range(4)], C,
                             TuneConfig(num_virtual_tokens=4, epochs=1, batch_size=4, seed=seed,
                                        reconstruction=pl is not None, rec_vocab_size=20),
                             plain_ids=pl), rows))
    assert len({mixed.mixable(tiny_bert, p).family for p, _ in prompts}) == 1
    items = [(p, rows[i:i + 2 + i % 2]) for i, (p, rows) in enumerate(prompts)]
    got = mixed.forward(tiny_bert, items)
    for (p, rows), probs in zip(items, got, strict=True):
        assert torch.allclose(probs, p.predict_proba(tiny_bert, rows), atol=1e-5)
    batcher = MicroBatcher(tiny_bert, max_wait_s=0.2)
    try:
        with batcher._cond:  # hold the batcher until all three are queued
            futures = [batcher.submit(p, rows) for p, rows in items]
        for f, probs in zip(futures, got, strict=True):
            assert torch.allclose(f.result(10), probs, atol=1e-5)
        # One micro-batch; rows are cut into passes by padding cost, fewer than one pass per
        # prompt.
        assert batcher.stats.batches == 1 and batcher.stats.forward_passes < len(items)
    finally:
        batcher.close()
    from rapt.tuning.tuners import base_model

    passes = []
    hook = base_model(tiny_bert.model).register_forward_hook(lambda *a: passes.append(1))
    specs = [mixed.mixable(tiny_bert, p) for p, _ in items]
    one = mixed.group_forward(tiny_bert, specs, [r for _, r in items], max_padding=float("inf"))
    hook.remove()
    assert len(passes) == 1  # all rows of all three prompts in a single pass
    for a, b in zip(one, got, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


class InterruptAfterFirstCheckpoint:
    """The real runner, held after its first checkpoint until the server shuts down."""

    def __init__(self):
        self.checkpointed = threading.Event()

    def __call__(self, backbone, data, params, *, progress, should_stop, checkpoint, resume):
        from rapt.service.worker import default_runner

        def ck(state):
            checkpoint(state)
            self.checkpointed.set()
            while not should_stop():
                time.sleep(0.01)

        return default_runner(backbone, data, params, progress=progress, should_stop=should_stop,
                              checkpoint=ck, resume=resume)


@pytest.mark.parametrize("dp", [None, {"noise_multiplier": 0.5, "max_grad_norm": 1.0}],
                         ids=["plain", "dp"])
def test_real_trainer_job_resumes_exactly_after_restart(tmp_path, dp):
    from rapt.service.worker import default_runner

    key = add_key(tmp_path)
    body = {"epochs": 2, "batch_size": 4, "num_virtual_tokens": 4, "lr": 0.05, "dp": dp}
    runner = InterruptAfterFirstCheckpoint()
    app = make_app(tmp_path, service_bert(), runner)
    with TestClient(app) as c:
        ds = c.post("/v1/datasets", json=upload_body(n=8), headers=hdr(key)).json()
        jid = c.post("/v1/jobs", json={"dataset_id": ds["id"], **body},
                     headers=hdr(key)).json()["id"]
        assert runner.checkpointed.wait(30)
        ref = c.post("/v1/jobs", json={"dataset_id": ds["id"], **body},
                     headers=hdr(key)).json()["id"]  # queued: runs after the restart
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"], progress_interval_s=0)
    with TestClient(create_app(cfg, backbones={"tiny": service_bert()},
                               runner=default_runner)) as c:
        st, st_ref = wait_job(c, key, jid, timeout=60), wait_job(c, key, ref, timeout=60)
        assert st["state"] == st_ref["state"] == "succeeded", (st, st_ref)
        assert st["resumed_from_step"] >= 1 and st_ref["resumed_from_step"] is None
        assert (st["epsilon"] is not None) == (dp is not None)
        files = app.state.svc.store.files / "prompts"
        if dp is not None:
            # DP noise is fresh per run, so tensors are not comparable; the accounting is. A
            # resume that dropped the engine's step count reported ε over the resumed steps
            # only (2.38 over 4 steps instead of 4.33 over 12).
            from rapt.dp import DPConfig
            from rapt.dp.accounting import epsilon

            total = st_ref["total_steps"]
            assert st["step"] == st["total_steps"] == st_ref["step"] == total
            q = DPConfig(**dp).resolve_sample_rate(8, body["batch_size"])
            planned = epsilon(dp["noise_multiplier"], q, total, 1e-5)  # δ at N = 8
            assert st["delta"] == st_ref["delta"] == 1e-5
            assert st["epsilon"] == pytest.approx(st_ref["epsilon"], rel=1e-9)
            assert st["epsilon"] == pytest.approx(planned, rel=1e-9)
            for s in (st, st_ref):
                rec = json.loads((files / s["prompt_id"] / "config.json").read_text())["meta"]
                assert rec["dp"]["steps"] == rec["dp"]["planned_steps"] == total
                assert rec["dp"]["epsilon"] == pytest.approx(planned, rel=1e-9)
            return
        a = load_file(str(files / st["prompt_id"] / "prompt.safetensors"))
        b = load_file(str(files / st_ref["prompt_id"] / "prompt.safetensors"))
        assert a.keys() == b.keys()
        for k in a:  # the interrupted job ends where the uninterrupted one does
            assert torch.allclose(a[k], b[k], atol=1e-5), k


class CrashAfterFirstCheckpoint:
    """The real runner, whose process "dies" right after its first checkpoint: no later
    checkpoint or progress of the run reaches the store, as after kill -9."""

    def __init__(self):
        self.checkpointed = threading.Event()
        self.first_step: int | None = None

    def __call__(self, backbone, data, params, *, progress, should_stop, checkpoint, resume):
        from rapt.service.worker import default_runner

        dead = threading.Event()

        def ck(state):
            if dead.is_set():
                return
            checkpoint(state)
            self.first_step = state["step"]
            dead.set()
            self.checkpointed.set()
            while not should_stop():
                time.sleep(0.01)

        def prog(info):
            if not dead.is_set():
                progress(info)

        return default_runner(backbone, data, params, progress=prog, should_stop=should_stop,
                              checkpoint=ck, resume=resume)


def _as_killed(tmp_path, jid: str) -> None:
    """Leave the job's row as kill -9 of its server leaves it: running, leased by a process
    of this host that no longer exists, with the checkpoint it recorded."""
    import socket
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()
    store = open_store(tmp_path)
    try:
        assert store.get_job(jid, None)["checkpoint"]
        store.update_job(jid, state="running", worker=f"{socket.gethostname()}:{gone.pid}:x",
                         heartbeat=time.time())
    finally:
        store.close()


def test_dp_job_checkpoints_mid_run_and_resumes_after_a_crash(tmp_path):
    """Old behaviour: a DP job checkpointed only at the end of each epoch, so a crash in its
    only epoch (kill -9 at step 27/128) failed it, "interrupted ... before its first
    checkpoint", while a LoRA job resumed. Now it checkpoints about ten times per run like the
    others, and resumes: it ends at the planned step with the ε of an uninterrupted run (the
    steps before the crash are counted once)."""
    from rapt.dp.accounting import epsilon
    from rapt.service.worker import default_runner

    key = add_key(tmp_path)
    dp = {"noise_multiplier": 1.0, "max_grad_norm": 1.0}
    body = {"epochs": 1, "batch_size": 2, "num_virtual_tokens": 4, "lr": 0.05, "dp": dp}
    runner = CrashAfterFirstCheckpoint()
    with TestClient(make_app(tmp_path, service_bert(), runner)) as c:
        ds = c.post("/v1/datasets", json=upload_body(n=16), headers=hdr(key)).json()
        jid = c.post("/v1/jobs", json={"dataset_id": ds["id"], **body},
                     headers=hdr(key)).json()["id"]
        assert runner.checkpointed.wait(30)
        ref = c.post("/v1/jobs", json={"dataset_id": ds["id"], **body},
                     headers=hdr(key)).json()["id"]  # queued: runs after the restart
    total = 8  # q = 2/16: one expected pass in 8 Poisson steps
    assert 1 <= runner.first_step < total  # a checkpoint before the end of the only epoch
    _as_killed(tmp_path, jid)
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"], progress_interval_s=0)
    with TestClient(create_app(cfg, backbones={"tiny": service_bert()},
                               runner=default_runner)) as c:
        st, st_ref = wait_job(c, key, jid, timeout=60), wait_job(c, key, ref, timeout=60)
        assert st["state"] == st_ref["state"] == "succeeded", (st, st_ref)
        assert st["resumed_from_step"] == runner.first_step, st
        assert st["step"] == st["total_steps"] == st_ref["step"] == total
        planned = epsilon(dp["noise_multiplier"], 2 / 16, total, 1e-5)
        assert st["delta"] == st_ref["delta"] == 1e-5
        assert st["epsilon"] == pytest.approx(planned, rel=1e-9)
        assert st_ref["epsilon"] == pytest.approx(planned, rel=1e-9)
        info = c.get(f"/v1/prompts/{st['prompt_id']}", headers=hdr(key)).json()
        assert info["dp"]["steps"] == total and info["dp"]["delta"] == 1e-5, info
        assert info["dp"]["epsilon"] == pytest.approx(planned, rel=1e-9)
        assert info["dp"]["seeded"] is False  # OS noise: the resumed steps drew fresh noise
        assert not list((tmp_path / "svc.db.files" / "checkpoints").glob("*.pt"))


def test_prompt_info_shows_the_dp_guarantee_or_none():
    """A prompt's info carries ε with its δ (and σ, q, steps) of a DP run; none without DP,
    nor for the noise-free runs older servers accepted (ε = ∞ is no guarantee, and JSON has no
    infinity to send)."""
    from rapt.service.routes.prompts import _dp_guarantee

    rec = {"epsilon": 0.63, "delta": 1e-5, "noise_multiplier": 5.0, "max_grad_norm": 1.0,
           "sample_rate": 0.5, "steps": 2, "accountant": "rdp", "seeded": False,
           "n_examples": 2, "planned_steps": 2}
    got = _dp_guarantee(rec)
    assert (got.epsilon, got.delta, got.steps) == (0.63, 1e-5, 2)
    assert "n_examples" not in got.model_dump()
    assert _dp_guarantee(None) is None
    assert _dp_guarantee({**rec, "epsilon": math.inf, "noise_multiplier": 0.0}) is None


def test_graceful_shutdown_before_first_checkpoint_requeues(tmp_path):
    """A job stopped by a clean shutdown before any checkpoint runs again from the start;
    only a crash (no shutdown path) leaves it failed with a reason (tested above)."""

    class NoCheckpointUntilStopped(FakeRunner):
        def __call__(self, backbone, data, params, *, progress, should_stop, checkpoint,
                     resume):
            if not self.at_gate.is_set():
                self.resumes.append(resume)
                progress({"step": 1, "total_steps": 4, "loss": 1.0})
                self.at_gate.set()
                while not should_stop():
                    time.sleep(0.01)
                return FakePrompt(torch.zeros(1, 2))
            return super().__call__(backbone, data, params, progress=progress,
                                    should_stop=should_stop, checkpoint=checkpoint,
                                    resume=resume)

    key = add_key(tmp_path)
    runner = NoCheckpointUntilStopped()
    with TestClient(make_app(tmp_path, service_bert(), runner)) as c:
        ds = c.post("/v1/datasets", json=upload_body(), headers=hdr(key)).json()
        jid = c.post("/v1/jobs", json={"dataset_id": ds["id"]}, headers=hdr(key)).json()["id"]
        assert runner.at_gate.wait(10)
    with TestClient(make_app(tmp_path, service_bert(), runner)) as c:
        st = wait_job(c, key, jid)
        assert st["state"] == "succeeded" and st["resumed_from_step"] is None, st
        assert runner.resumes == [None, None]


class CheckpointAtTwo(FakeRunner):
    """First run: progress to step 3 of 6, its only checkpoint at step 2, then wait to be
    stopped; later runs: hold at their start until ``gate`` opens, then run to the end."""

    def __call__(self, backbone, data, params, *, progress, should_stop, checkpoint, resume):
        self.resumes.append(resume)
        if resume is None:
            for s in (1, 2, 3):
                progress({"step": s, "total_steps": 6, "loss": 1.0 / s, "epoch": 0})
                if s == 2:
                    checkpoint({"step": 2, "w": torch.zeros(1)})
            self.at_gate.set()
            while not should_stop():
                time.sleep(0.01)
            return FakePrompt(torch.zeros(1, 2))
        self.at_gate.set()
        assert self.gate.wait(30)
        for s in range(int(resume["step"]) + 1, 7):
            progress({"step": s, "total_steps": 6, "loss": 1.0 / s, "epoch": 0})
        return FakePrompt(torch.zeros(backbone.embeddings.shape[0], data.num_labels))


def test_a_killed_jobs_status_shows_the_step_it_resumes_from(tmp_path):
    """Old behaviour: after kill -9 the status kept the last step the dead run reported (3),
    while the job resumes from its checkpoint's (2): taken back, queued and running again, it
    said 3 of 6 until the new run's own progress caught up."""
    from rapt.service.worker import JobWorker

    key, runner = add_key(tmp_path), CheckpointAtTwo()
    with TestClient(make_app(tmp_path, service_bert(), runner)) as c:
        ds = c.post("/v1/datasets", json=upload_body(), headers=hdr(key)).json()
        jid = c.post("/v1/jobs", json={"dataset_id": ds["id"]}, headers=hdr(key)).json()["id"]
        assert runner.at_gate.wait(10)
    _as_killed(tmp_path, jid)
    store = open_store(tmp_path)
    try:
        store.update_job(jid, step=3)  # the dead run's last progress
        assert JobWorker(store, {}, FakeRunner(), max_queued=4).reap_stale() == [jid]
        row = store.get_job(jid, None)
        assert (row["state"], row["step"], row["resumed_from_step"]) == ("queued", 2, 2)
    finally:
        store.close()
    runner.at_gate.clear()
    runner.gate.clear()
    with TestClient(make_app(tmp_path, service_bert(), runner)) as c:
        assert runner.at_gate.wait(10)  # the new run holds at its start
        st = c.get(f"/v1/jobs/{jid}", headers=hdr(key)).json()
        assert (st["state"], st["step"], st["resumed_from_step"]) == ("running", 2, 2), st
        runner.gate.set()
        st = wait_job(c, key, jid)
        assert (st["state"], st["step"]) == ("succeeded", 6), st


# -- issue 12 item 7, issue 17: request isolation in the inference batcher ---------------------
def row_of(n: int) -> list[int]:
    """A token id row of length n (specials at both ends)."""
    return [2] + [7] * (n - 2) + [3]


def test_rows_must_fit_the_backbone_positions_with_the_prompt(tmp_path, tiny_bert):
    """Old behaviour: rows were checked against max_seq_len only. Under a 4-token soft prompt a
    253-token row needs 257 positions of a 256-position BERT: it passed validation and crashed
    the shared forward pass (`expanded size`, 500 for the whole batch); a job with 20 virtual
    tokens over 250-token rows was accepted and failed later. Now: 422 at the door, naming the
    field and the limit."""
    from rapt.service.worker import default_runner

    key = add_key(tmp_path)
    app = make_app(tmp_path, tiny_bert, default_runner, prompt_loader=None, max_seq_len=512)
    with TestClient(app) as c:
        pid = make_prompt(c, key, method="prompt", num_virtual_tokens=4, epochs=1, batch_size=6)
        r = c.post("/v1/predict", json={"prompt_id": pid, "input_ids": [row_of(8), row_of(253)]},
                   headers=hdr(key))
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert "input_ids[1]" in detail and "252" in detail and "256 positions" in detail, detail
        r = c.post("/v1/predict", json={"prompt_id": pid, "input_ids": [row_of(252)]},
                   headers=hdr(key))
        assert r.status_code == 200, r.text
        before = c.app.state.svc.store.counts()
        body = upload_body()
        body["input_ids"][0] = row_of(257)
        r = c.post("/v1/datasets", json=body, headers=hdr(key))
        assert r.status_code == 422 and "input_ids[0]" in r.json()["detail"], r.text
        assert "256 positions" in r.json()["detail"]
        body["input_ids"] = [row_of(250)] * 6
        ds = c.post("/v1/datasets", json=body, headers=hdr(key)).json()["id"]
        before = c.app.state.svc.store.counts()
        r = c.post("/v1/jobs", json={"dataset_id": ds, "method": "prompt",
                                     "num_virtual_tokens": 20}, headers=hdr(key))
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert "num_virtual_tokens" in detail and "256" in detail and "<= 6" in detail, detail
        assert c.app.state.svc.store.counts() == before


class RaisingPrompt:
    def __init__(self, message: str):
        self.message = message

    def predict_proba(self, backbone, input_ids, batch_size=64):
        raise RuntimeError(self.message)


class GatePrompt(FakePrompt):
    """Holds the batcher thread inside its forward pass until ``release`` is set."""

    def __init__(self, weight):
        super().__init__(weight)
        self.entered, self.release = threading.Event(), threading.Event()

    def predict_proba(self, backbone, input_ids, batch_size=64):
        self.entered.set()
        assert self.release.wait(20)
        return super().predict_proba(backbone, input_ids, batch_size)


def test_batcher_isolates_a_failing_request(tiny_bert):
    """Old behaviour: one raising prompt failed every request of its micro-batch, and each of
    them got the raising request's error text (another tenant's shapes)."""
    from rapt.service.inference import MicroBatcher

    good = FakePrompt(torch.randn(64, 2, generator=torch.Generator().manual_seed(0)))
    rows = upload_body(2)["input_ids"]
    batcher = MicroBatcher(tiny_bert, max_wait_s=0.2)
    try:
        with batcher._cond:  # all three are queued before the batcher takes any
            f_bad = batcher.submit(RaisingPrompt("tenant A: expanded size (513)"), rows)
            f_good = [batcher.submit(good, rows), batcher.submit(good, rows[:1])]
        ref = good.predict_proba(None, rows)
        assert torch.allclose(f_good[0].result(10), ref)
        assert torch.allclose(f_good[1].result(10), ref[:1])
        with pytest.raises(RuntimeError, match="tenant A"):
            f_bad.result(10)
        assert batcher.stats.batches == 1
    finally:
        batcher.close()


def test_cross_tenant_failure_isolation_over_http(tmp_path, tiny_bert):
    """Old behaviour (issue 17, untested): Bob's request, batched with Alice's failing prompt,
    got a 500 carrying Alice's error text."""
    overrides: dict = {}

    def loader(folder):
        return overrides.get(Path(folder).name) or FakePrompt.load(folder)

    alice, bob = add_key(tmp_path, "alice"), add_key(tmp_path, "bob")
    app = make_app(tmp_path, tiny_bert, prompt_loader=loader)
    with TestClient(app) as c:
        pa, pb, pg = make_prompt(c, alice), make_prompt(c, bob, seed=1), make_prompt(c, bob, 2)
        overrides[pa] = RaisingPrompt("alice-secret: expanded size (3, 513)")
        overrides[pg] = gate = GatePrompt(torch.zeros(64, 2))
        batcher = app.state.svc.batchers["tiny"]
        rows = upload_body(2)["input_ids"]

        def post(key, pid):
            return c.post("/v1/predict", json={"prompt_id": pid, "input_ids": rows},
                          headers=hdr(key))

        with ThreadPoolExecutor(3) as ex:
            f_gate = ex.submit(post, bob, pg)
            assert gate.entered.wait(10)  # the batcher is busy; the next two queue together
            fa, fb = ex.submit(post, alice, pa), ex.submit(post, bob, pb)
            t0 = time.time()
            while len(batcher._pending) < 2 and time.time() - t0 < 10:
                time.sleep(0.01)
            gate.release.set()
            ra, rb, rg = fa.result(), fb.result(), f_gate.result()
        assert rg.status_code == 200
        ref = FakePrompt.load(app.state.svc.store.files / "prompts" / pb).predict_proba(None,
                                                                                       rows)
        assert rb.status_code == 200, rb.text
        assert torch.allclose(torch.tensor(rb.json()["probabilities"]), ref, atol=1e-6)
        assert ra.status_code == 500
        assert "alice-secret" not in ra.text and "513" not in ra.text
        assert batcher.stats.max_prompts_in_batch >= 2  # they did share a micro-batch


def test_mixed_prefix_and_lora_customers_match_their_requests_alone(tmp_path, tiny_bert):
    """Issue 14: requests of two customers' prefix (lengths 2 and 5) and LoRA (ranks 2 and 4)
    prompts that share one micro-batch, and so mixed passes, get what each gets alone and
    what the per-prompt path gives."""
    from _tiny import random_prompt

    overrides: dict = {}

    def loader(folder):
        return overrides.get(Path(folder).name) or FakePrompt.load(folder)

    alice, bob = add_key(tmp_path, "alice"), add_key(tmp_path, "bob")
    app = make_app(tmp_path, tiny_bert, prompt_loader=loader)
    with TestClient(app) as c:
        tenants = []
        for k, (key, cfg) in enumerate([
                (alice, {"method": "prefix", "num_virtual_tokens": 2}),
                (bob, {"method": "prefix", "num_virtual_tokens": 5, "prefix_projection": True}),
                (alice, {"method": "lora", "lora_r": 2}), (bob, {"method": "lora", "lora_r": 4})]):
            pid = make_prompt(c, key, seed=k)
            overrides[pid] = random_prompt(tiny_bert, seed=k, num_labels=2 + k % 2, **cfg)
            tenants.append((key, pid, upload_body(1 + k, L=3 + 4 * k)["input_ids"]))
        pg = make_prompt(c, bob, seed=9)
        overrides[pg] = gate = GatePrompt(torch.zeros(64, 2))
        batcher = app.state.svc.batchers["tiny"]

        def post(key, pid, rows):
            r = c.post("/v1/predict", json={"prompt_id": pid, "input_ids": rows},
                       headers=hdr(key))
            assert r.status_code == 200, r.text
            return torch.tensor(r.json()["probabilities"])

        alone = [post(*t) for t in tenants]
        with ThreadPoolExecutor(5) as ex:
            f_gate = ex.submit(post, bob, pg, upload_body(1)["input_ids"])
            assert gate.entered.wait(10)  # the batcher is busy; the next four queue together
            futures = [ex.submit(post, *t) for t in tenants]
            t0 = time.time()
            while len(batcher._pending) < len(tenants) and time.time() - t0 < 10:
                time.sleep(0.01)
            gate.release.set()
            together = [f.result() for f in futures]
            f_gate.result()
        assert batcher.stats.max_prompts_in_batch == len(tenants)
        for (_, pid, rows), a, t in zip(tenants, alone, together, strict=True):
            ref = overrides[pid].predict_proba(tiny_bert, rows)
            assert torch.allclose(t, a, atol=1e-5) and torch.allclose(t, ref, atol=1e-5)


# -- item 8: invalid Unicode and non-finite numbers ---------------------------------------------
@SQLITE_ONLY  # HTTP and batching behaviour: the store backend plays no part
def test_lone_surrogates_and_non_finite_numbers_are_422(svc):
    """Old behaviour: a lone UTF-16 surrogate in `texts` crashed the tokenizer (500); an `eta` of
    Infinity, 1e999 or NaN was accepted and stored."""
    a = svc.alice
    pid = make_prompt(svc, a)
    up = upload_body()
    del up["input_ids"]
    up["texts"] = ["a good film", "bad \ud800 plot"] + ["fine"] * 4
    plain = json.dumps(upload_body())
    assert '"eta": 10.0' in plain
    odd = upload_body()
    odd["privacy"]["embedding"] = "mini\udfffLM"
    cases = [
        ("/v1/datasets", json.dumps(up), "texts[1]", "surrogate"),
        ("/v1/predict", json.dumps({"prompt_id": pid, "texts": ["ok", "x\udfff"]}), "texts[1]",
         "surrogate"),
        ("/v1/datasets", json.dumps(odd), "privacy.embedding", "surrogate"),
        ("/v1/datasets", plain.replace('"eta": 10.0', '"eta": Infinity'), "privacy.eta",
         "finite"),
        ("/v1/datasets", plain.replace('"eta": 10.0', '"eta": 1e999'), "privacy.eta", "finite"),
        ("/v1/datasets", plain.replace('"eta": 10.0', '"eta": NaN'), "privacy.eta", "finite"),
        ("/v1/datasets", plain[:-1] + ', "\\ud800": 1}', "body", "valid string"),
    ]
    before = svc.store.counts()
    for path, content, field, word in cases:
        r = svc.post(path, content=content.encode(),
                     headers={**hdr(a), "Content-Type": "application/json"})
        assert r.status_code == 422, (path, content[-60:], r.text)
        detail = r.json()["detail"]
        assert field in detail and word in detail, (field, detail)
    assert svc.store.counts() == before


# -- item 9: opaque 500s -------------------------------------------------------------------------
def test_internal_errors_are_opaque_and_logged_once(tmp_path, tiny_bert, caplog):
    """Old behaviour: a 500 carried `RuntimeError: <message>` (server file paths, other tenants'
    shapes), was logged twice with full tracebacks, and the exception was re-raised to the
    server (uvicorn logged it again and closed the keep-alive connection; TestClient, which
    re-raises server exceptions, raised it here)."""

    def boom(backbone, items):
        raise RuntimeError("/srv/rapt/secret.py: expanded size (513) of tenant bob")

    key = add_key(tmp_path)
    with TestClient(make_app(tmp_path, tiny_bert, forward=boom)) as c:
        pid = make_prompt(c, key)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            r = c.post("/v1/predict", json={"prompt_id": pid, "input_ids": upload_body(2)[
                "input_ids"]}, headers=hdr(key))
    assert r.status_code == 500
    body = r.json()
    assert set(body) == {"error", "detail"} and body["error"] == "internal", body
    m = re.search(r"\bid ([0-9a-f]{16})\b", body["detail"])
    assert m, body
    for leak in ("RuntimeError", "/srv", "513", "secret", "bob"):
        assert leak not in r.text
    tracebacks = [rec for rec in caplog.records if rec.exc_info]
    assert len(tracebacks) == 1, [rec.getMessage() for rec in tracebacks]
    assert m.group(1) in tracebacks[0].getMessage()


# -- item 10: damaged prompt files -------------------------------------------------------------
def test_broken_prompt_files_give_503_and_are_not_cached(tmp_path, tiny_bert):
    """Old behaviour: a prompt whose files were missing or damaged gave 500, and one that loaded
    but did not fit its model stayed cached, so restoring the file did not help."""
    from rapt.service.worker import default_runner

    key = add_key(tmp_path)
    app = make_app(tmp_path, tiny_bert, default_runner, prompt_loader=None)
    with TestClient(app) as c:
        pids = [make_prompt(c, key, seed=s, num_virtual_tokens=4, epochs=1, batch_size=6)
                for s in (0, 1)]
        files = app.state.svc.store.files / "prompts"
        rows = upload_body(2)["input_ids"]

        def predict(pid, status):
            r = c.post("/v1/predict", json={"prompt_id": pid, "input_ids": rows},
                       headers=hdr(key))
            assert r.status_code == status, r.text
            if status == 503:
                assert r.json()["error"] == "prompt_unavailable" and pid in r.json()["detail"]
                assert str(tmp_path) not in r.text
            return r

        # Loadable tensors of the wrong shape, then the real file again.
        t = files / pids[0] / "prompt.safetensors"
        good = t.read_bytes()
        save_file({k: torch.zeros(3, 3) for k in load_file(str(t))}, str(t))
        predict(pids[0], 503)
        t.write_bytes(good)
        predict(pids[0], 200)
        # Missing, then garbage, then restored.
        t = files / pids[1] / "prompt.safetensors"
        good = t.read_bytes()
        t.unlink()
        predict(pids[1], 503)
        t.write_bytes(b"not a safetensors file")
        predict(pids[1], 503)
        t.write_bytes(good)
        predict(pids[1], 200)


# -- item 11: key before body, body limits, quotas ----------------------------------------------
def _asgi(app, method, path, headers, chunks):
    """Drive the ASGI app directly; returns (status, JSON body, body chunks the app pulled)."""
    import asyncio

    pulled, sent = [0], []

    async def receive():
        if pulled[0] < len(chunks):
            pulled[0] += 1
            return {"type": "http.request", "body": chunks[pulled[0] - 1],
                    "more_body": pulled[0] < len(chunks)}
        return {"type": "http.disconnect"}

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body), pulled[0]


@SQLITE_ONLY  # HTTP and batching behaviour: the store backend plays no part
def test_api_key_is_checked_before_the_body_is_read(svc):
    """Old behaviour: the body (anything up to max_upload_bytes) was read and parsed before the
    key was checked: an unauthenticated 31 MiB upload cost 0.5 s and 135 MB."""
    body = json.dumps(upload_body()).encode()
    chunks = [body[:100], body[100:]]
    ctype = {"content-type": "application/json", "content-length": str(len(body))}
    for headers in ({}, hdr("rapt_wrong"), {"X-API-Key": "rapt_wrong"}):
        status, out, pulled = _asgi(svc.app, "POST", "/v1/datasets", {**headers, **ctype},
                                    chunks)
        assert status == 401 and out["error"] == "unauthorized", out
        assert pulled == 0
    status, out, pulled = _asgi(svc.app, "POST", "/v1/datasets", {**hdr(svc.alice), **ctype},
                                chunks)
    assert status == 201 and pulled == 2, out
    # A streamed (chunked) body is cut off at the limit without being read to its end.
    big = [b" " * 4096] * 10
    status, out, pulled = _asgi(svc.app, "POST", "/v1/datasets",
                                {**hdr(svc.alice), "content-type": "application/json"}, big)
    assert status == 413 and "max_upload_bytes=20000" in out["detail"] and pulled < 10
    # Public routes and unknown paths need no key; an unknown path's body is not read either.
    assert svc.get("/v1/health").status_code == 200
    status, out, pulled = _asgi(svc.app, "POST", "/v1/nowhere", ctype, chunks)
    assert status == 404 and pulled == 0, out


def test_per_key_dataset_quotas(tmp_path, tiny_bert, backend):
    """Old behaviour: no quota at all; one key could fill the provider's disk with datasets."""
    (tmp_path / "n").mkdir()
    (tmp_path / "b").mkdir()
    alice, bob = add_key(tmp_path / "n", "alice"), add_key(tmp_path / "n", "bob")
    with TestClient(make_app(tmp_path / "n", tiny_bert, max_datasets_per_key=2)) as c:
        ids = [c.post("/v1/datasets", json=upload_body(), headers=hdr(alice)).json()["id"]
               for _ in range(2)]
        before = c.app.state.svc.store.counts()
        r = c.post("/v1/datasets", json=upload_body(), headers=hdr(alice))
        assert r.status_code == 429 and r.json()["error"] == "quota_exceeded", r.text
        assert "max_datasets_per_key=2" in r.json()["detail"]
        assert c.app.state.svc.store.counts() == before
        assert c.post("/v1/datasets", json=upload_body(), headers=hdr(bob)).status_code == 201
        assert c.delete(f"/v1/datasets/{ids[0]}", headers=hdr(alice)).status_code == 204
        assert c.post("/v1/datasets", json=upload_body(), headers=hdr(alice)).status_code == 201
    carol = add_key(tmp_path / "b", "carol")
    with TestClient(make_app(tmp_path / "b", tiny_bert, max_dataset_bytes_per_key=5000)) as c:
        codes = [c.post("/v1/datasets", json=upload_body(n=60), headers=hdr(carol)).status_code
                 for _ in range(4)]
        assert codes[0] == 201 and codes[-1] == 429, codes
        r = c.post("/v1/datasets", json=upload_body(n=60), headers=hdr(carol))
        assert "max_dataset_bytes_per_key=5000" in r.json()["detail"], r.text


# -- item 12: operator traps ------------------------------------------------------------------
def test_cli_db_option_and_key_revocation(tmp_path, monkeypatch):
    """Old behaviour: `rapt serve --db X keys add NAME` ignored X and wrote ./rapt-service.db;
    keys could not be revoked."""
    from typer.testing import CliRunner

    from rapt.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAPT_DB", raising=False)
    db = tmp_path / "x" / "svc.db"

    def run(*args, code=0):
        out = CliRunner().invoke(app, [str(a) for a in args])
        assert out.exit_code == code, out.output
        return out

    key_a = run("serve", "--db", db, "keys", "add", "alice").stdout.strip()
    key_b = run("serve", "keys", "add", "bob", "--db", db).stdout.strip()
    run("serve", "--db", db, "keys", "add", "ops", "--admin")
    assert not (tmp_path / "rapt-service.db").exists()
    listing = run("serve", "--db", db, "keys", "list").stdout
    assert "alice" in listing and "bob" in listing and "admin" in listing
    assert key_a not in listing
    run("serve", "--db", db, "keys", "revoke", "alice")
    store = Store(db)
    try:
        assert store.owner_of_hash(auth.hash_key(key_a)) is None
        assert store.owner_of_hash(auth.hash_key(key_b)) is not None
    finally:
        store.close()
    assert "revoked" in run("serve", "--db", db, "keys", "list").stdout
    out = run("serve", "--db", db, "keys", "revoke", "nobody", code=2)
    assert "nobody" in out.output
    out = run("serve", "--db", db, "keys", "add", "bob", code=2)  # a live key's name
    assert "a live key is named 'bob' already" in out.output
    assert run("serve", "--db", db, "keys", "add", "alice").stdout.startswith("rapt_")  # revoked
    out = run("serve", "--db", db, "keys", "add", "y" * 1000, code=2)
    assert "at most 100 characters" in out.output
    out = run("serve", "--db", db, "keys", "add", "c", "--db", tmp_path / "other.db", code=2)
    assert "--db" in out.output and not (tmp_path / "other.db").exists()


def test_revoked_key_is_refused(svc):
    """Old behaviour: there was no revocation; a leaked key worked forever."""
    assert svc.get("/v1/jobs", headers=hdr(svc.bob)).status_code == 200
    bob_id = svc.store.owner_of_hash(auth.hash_key(svc.bob))
    svc.store.revoke_key(bob_id)
    r = svc.get("/v1/jobs", headers=hdr(svc.bob))
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"


def test_users_list_and_delete_their_datasets_and_prompts(svc):
    """Old behaviour: a user could neither list nor delete datasets and prompts, so they could
    not erase their data."""

    a, b = svc.alice, svc.bob
    ds = [svc.post("/v1/datasets", json=upload_body(n=4 + i), headers=hdr(a)).json()["id"]
          for i in range(3)]
    jid = svc.post("/v1/jobs", json={"dataset_id": ds[0]}, headers=hdr(a)).json()["id"]
    pid = wait_job(svc, a, jid)["prompt_id"]
    assert [d["id"] for d in svc.get("/v1/datasets", headers=hdr(a)).json()] == ds
    assert [p["id"] for p in svc.get("/v1/prompts", headers=hdr(a)).json()] == [pid]
    assert svc.get("/v1/datasets", headers=hdr(b)).json() == []
    assert svc.get("/v1/prompts", headers=hdr(b)).json() == []
    for path in (f"/v1/datasets/{ds[0]}", f"/v1/prompts/{pid}"):
        assert svc.delete(path, headers=hdr(b)).status_code == 404
    # A dataset a job is still using cannot go until the job is cancelled.
    svc.runner.gate.clear()
    j2 = svc.post("/v1/jobs", json={"dataset_id": ds[1]}, headers=hdr(a)).json()["id"]
    assert svc.runner.at_gate.wait(10)
    r = svc.delete(f"/v1/datasets/{ds[1]}", headers=hdr(a))
    assert r.status_code == 409 and j2 in r.json()["detail"], r.text
    svc.post(f"/v1/jobs/{j2}/cancel", headers=hdr(a))
    assert wait_job(svc, a, j2)["state"] == "cancelled"
    svc.runner.gate.set()
    folder = svc.store.files / "prompts" / pid
    assert folder.is_dir()
    assert svc.delete(f"/v1/prompts/{pid}", headers=hdr(a)).status_code == 204
    assert not folder.exists()
    assert svc.get(f"/v1/prompts/{pid}", headers=hdr(a)).status_code == 404
    r = svc.post("/v1/predict", json={"prompt_id": pid, "input_ids": [[2, 7, 3]]},
                 headers=hdr(a))
    assert r.status_code == 404
    for d in ds:
        assert svc.delete(f"/v1/datasets/{d}", headers=hdr(a)).status_code == 204
        assert svc.get(f"/v1/datasets/{d}", headers=hdr(a)).status_code == 404
        assert svc.delete(f"/v1/datasets/{d}", headers=hdr(a)).status_code == 404
    assert svc.get("/v1/datasets", headers=hdr(a)).json() == []
    assert svc.get("/v1/prompts", headers=hdr(a)).json() == []
    r = svc.post("/v1/jobs", json={"dataset_id": ds[0]}, headers=hdr(a))
    assert r.status_code == 404
    # No row holds the data any more (datasets still named by a job keep an empty record).
    with svc.store._tx() as db:  # the store's lock: its one SQLite connection is shared
        rows = dict(db.exec_driver_sql("SELECT id, data FROM datasets").all())
    assert ds[2] not in rows and all(rows[d] == "" for d in ds[:2]), rows


def test_failed_and_cancelled_jobs_leave_no_checkpoint(svc):
    """Old behaviour: checkpoints of failed and cancelled jobs stayed on disk for good. Also
    (issue 17, untested) a runner exception marks the job failed with its reason."""
    a = svc.alice
    ck = svc.store.files / "checkpoints"
    ds = svc.post("/v1/datasets", json=upload_body(), headers=hdr(a)).json()["id"]
    svc.runner.gate.clear()
    j1 = svc.post("/v1/jobs", json={"dataset_id": ds}, headers=hdr(a)).json()["id"]
    assert svc.runner.at_gate.wait(10)
    assert (ck / f"{j1}.pt").exists()
    svc.post(f"/v1/jobs/{j1}/cancel", headers=hdr(a))
    assert wait_job(svc, a, j1)["state"] == "cancelled"
    svc.runner.gate.set()
    svc.runner.fail_at = 3
    j2 = svc.post("/v1/jobs", json={"dataset_id": ds}, headers=hdr(a)).json()["id"]
    st = wait_job(svc, a, j2)
    assert st["state"] == "failed" and "label 7 is out of range at step 3" in st["error"], st
    assert st["prompt_id"] is None
    assert sorted(p.name for p in ck.iterdir()) == []


def test_database_and_its_folders_are_private(tmp_path):
    """Old behaviour: the SQLite file and its folders took the process umask (world-readable
    0644 / 0755), exposing every tenant's data and key hashes to local users."""
    old = os.umask(0o022)
    try:
        store = Store(tmp_path / "new" / "svc.db")
        store.add_key("alice", auth.hash_key(auth.new_key()))
        store.close()
        assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700
        assert (tmp_path / "new" / "svc.db").stat().st_mode & 0o777 == 0o600
        assert (tmp_path / "new" / "svc.db.files").stat().st_mode & 0o777 == 0o700
        for p in (tmp_path / "new").glob("svc.db-*"):  # WAL and shared-memory files
            assert p.stat().st_mode & 0o777 == 0o600, p
        shared = tmp_path / "shared"  # an existing folder is the operator's: left alone
        shared.mkdir(mode=0o755)
        loose = shared / "loose.db"  # an existing database with loose permissions
        Store(loose).close()
        os.chmod(loose, 0o644)
        Store(loose).close()
        assert loose.stat().st_mode & 0o777 == 0o600
        assert shared.stat().st_mode & 0o777 == 0o755
    finally:
        os.umask(old)


def test_database_of_the_previous_schema_is_migrated(tmp_path):
    """A database written before keys could be revoked or marked admin, and before datasets had
    sizes and deletion marks, opens with its keys and datasets intact."""
    import sqlite3

    old_schema = """
    CREATE TABLE api_keys (id TEXT PRIMARY KEY, name TEXT NOT NULL,
        key_hash TEXT NOT NULL UNIQUE, created REAL NOT NULL);
    CREATE TABLE datasets (id TEXT PRIMARY KEY, owner TEXT NOT NULL REFERENCES api_keys(id),
        backbone TEXT NOT NULL, n_examples INTEGER NOT NULL, num_labels INTEGER NOT NULL,
        max_row_len INTEGER NOT NULL, privacy TEXT NOT NULL, plain_ids TEXT,
        data TEXT NOT NULL, created REAL NOT NULL);
    """
    key = auth.new_key()
    with sqlite3.connect(tmp_path / "svc.db") as db:
        db.executescript(old_schema)
        db.execute("INSERT INTO api_keys VALUES ('key_1', 'alice', ?, 0)", (auth.hash_key(key),))
        db.execute("INSERT INTO datasets VALUES ('ds_1', 'key_1', 'tiny', 1, 2, 3, '{}', NULL, "
                   "'{\"input_ids\":[[2,7,3]],\"labels\":[0]}', 0)")
    store = Store(tmp_path / "svc.db")
    try:
        assert store.owner_of_hash(auth.hash_key(key)) == "key_1"
        assert not store.is_admin("key_1")
        assert [d["id"] for d in store.list_datasets("key_1")] == ["ds_1"]
        with pytest.raises(Exception, match="max_datasets_per_key=1"):
            store.create_dataset("key_1", "tiny", [[2, 3]], [0], 2, {}, None, max_count=1)
        store.revoke_key("alice")
        assert store.owner_of_hash(auth.hash_key(key)) is None
    finally:
        store.close()


@SQLITE_ONLY  # HTTP and batching behaviour: the store backend plays no part
def test_stats_need_an_admin_key(svc):
    """Old behaviour: any key read /v1/stats, which counts every tenant's requests."""
    r = svc.get("/v1/stats", headers=hdr(svc.alice))
    assert r.status_code == 403 and r.json()["error"] == "forbidden" and "admin" in r.text
    r = svc.get("/v1/stats", headers=hdr(svc.admin))
    assert r.status_code == 200 and "tiny" in r.json()


def test_serve_tls_options_reach_uvicorn(tmp_path, monkeypatch):
    """Old behaviour: `rapt serve` had no TLS options and said nothing when it served plain http
    on a public interface, where keys and data cross the network readable."""
    import uvicorn
    from typer.testing import CliRunner

    from rapt.cli import app

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    keyfile, certfile = tmp_path / "key.pem", tmp_path / "cert.pem"
    keyfile.write_text("k")
    certfile.write_text("c")
    base = ["serve", "--db", str(tmp_path / "svc.db"), "--backbone", "tiny"]
    out = CliRunner().invoke(app, [*base, "--ssl-keyfile", str(keyfile),
                                   "--ssl-certfile", str(certfile)])
    assert out.exit_code == 0, out.output
    assert calls[-1]["ssl_keyfile"] == str(keyfile) and calls[-1]["ssl_certfile"] == str(certfile)
    assert "https://127.0.0.1:8000" in out.output
    n = len(calls)
    out = CliRunner().invoke(app, [*base, "--ssl-keyfile", str(keyfile)])
    assert out.exit_code == 2 and "--ssl-certfile" in out.output
    out = CliRunner().invoke(app, [*base, "--ssl-keyfile", str(tmp_path / "nope.pem"),
                                   "--ssl-certfile", str(certfile)])
    assert out.exit_code == 2 and "nope.pem" in out.output
    assert len(calls) == n
    out = CliRunner().invoke(app, [*base, "--host", "0.0.0.0"])
    assert out.exit_code == 0 and "plain http" in out.output
    assert calls[-1].get("ssl_keyfile") is None


def test_client_warns_before_sending_the_key_over_plain_http():
    """Old behaviour: the client sent the API key over plain http to any host, silently."""
    from rapt.client.client import PrivacyWarning, RaptClient

    with pytest.warns(PrivacyWarning, match="plain http"):
        RaptClient("http://203.0.113.5:8000", "rapt_x").close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for url in ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000",
                    "https://example.com"):
            RaptClient(url, "rapt_x").close()


# -- issue 17: untested failure paths -----------------------------------------------------------
def test_inference_queue_full_is_429(tmp_path, tiny_bert):
    """Untested before (issue 17): a full micro-batching queue answers 429 naming its limit,
    and the requests already queued still succeed."""
    overrides: dict = {}

    def loader(folder):
        return overrides.get(Path(folder).name) or FakePrompt.load(folder)

    key = add_key(tmp_path)
    app = make_app(tmp_path, tiny_bert, prompt_loader=loader, max_inference_queue=4)
    with TestClient(app) as c:
        pid, pg = make_prompt(c, key), make_prompt(c, key, seed=1)
        overrides[pg] = gate = GatePrompt(torch.zeros(64, 2))
        batcher = app.state.svc.batchers["tiny"]
        rows = upload_body(2)["input_ids"]

        def post(p):
            return c.post("/v1/predict", json={"prompt_id": p, "input_ids": rows},
                          headers=hdr(key))

        with ThreadPoolExecutor(3) as ex:
            f_gate = ex.submit(post, pg)
            assert gate.entered.wait(10)
            queued = [ex.submit(post, pid) for _ in range(2)]
            t0 = time.time()
            while batcher._pending_rows < 4 and time.time() - t0 < 10:
                time.sleep(0.01)
            r = post(pid)
            gate.release.set()
            assert r.status_code == 429 and "max_inference_queue=4" in r.json()["detail"]
            assert [f.result().status_code for f in [f_gate, *queued]] == [200] * 3


def test_backbone_not_loaded_is_503(tmp_path, tiny_bert):
    """Old behaviour (issue 17, untested): a job on a dataset of a backbone the server did not
    load was accepted (202) and failed in the worker; predict answered 503 untested."""
    key = add_key(tmp_path)
    with TestClient(make_app(tmp_path, tiny_bert)) as c:
        pid = make_prompt(c, key)
        ds = c.post("/v1/datasets", json=upload_body(), headers=hdr(key)).json()["id"]
    with TestClient(make_app(tmp_path, tiny_bert, name="other")) as c:
        before = c.app.state.svc.store.counts()
        r = c.post("/v1/predict", json={"prompt_id": pid, "input_ids": [[2, 7, 3]]},
                   headers=hdr(key))
        assert r.status_code == 503 and r.json()["error"] == "backbone_unavailable", r.text
        assert "'tiny'" in r.json()["detail"]
        r = c.post("/v1/jobs", json={"dataset_id": ds}, headers=hdr(key))
        assert r.status_code == 503 and r.json()["error"] == "backbone_unavailable", r.text
        assert c.app.state.svc.store.counts() == before


def test_per_prompt_passes_config_selects_the_reference_forward(tmp_path, tiny_bert):
    """`rapt serve --per-prompt-passes` (the benchmarks' "before") must really switch paths."""
    from rapt.service.inference import default_forward, per_prompt_forward

    for mixed, expected in ((True, default_forward), (False, per_prompt_forward)):
        cfg = ServiceConfig(db_path=tmp_path / f"svc{mixed}.db", backbones=["tiny"],
                            mixed_passes=mixed)
        app = create_app(cfg, backbones={"tiny": tiny_bert}, runner=FakeRunner(),
                         prompt_loader=FakePrompt.load)
        with TestClient(app):
            assert app.state.svc.batchers["tiny"].forward is expected
