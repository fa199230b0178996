"""Issue 29 items 2, 3, 6, 7: deleted datasets leave no bytes (db, WAL, files), bounded and
fairly scheduled jobs, revoking and purging keys, private file modes. Each test failed on the
code before the fix (the docstrings say how)."""

from __future__ import annotations

import os
import stat
import time

import pytest
from _service import (
    SQLITE_ONLY,
    FakePrompt,
    FakeRunner,
    add_key,
    hdr,
    make_app,
    open_store,
    upload_body,
    wait_job,
)
from fastapi.testclient import TestClient

from rapt.service import auth
from rapt.service.store import QueueFullError

# A row no other test data holds: its JSON text is searched for in the raw files.
SECRET = [2] + [41, 17, 33, 29, 11, 37, 47, 23, 31, 19, 43, 13, 49, 7, 45] + [3]
NEEDLE = b"41,17,33,29,11,37,47,23,31,19,43,13,49,7,45"


@pytest.fixture()
def svc(tmp_path, tiny_bert, backend):
    alice, bob = add_key(tmp_path, "alice"), add_key(tmp_path, "bob")
    ops = add_key(tmp_path, "ops", admin=True)
    runner = FakeRunner()
    app = make_app(tmp_path, tiny_bert, runner, max_seq_len=32, max_queued_jobs=8,
                   max_steps_per_job=1000)
    with TestClient(app) as c:
        c.alice, c.bob, c.admin, c.runner = alice, bob, ops, runner
        c.store = app.state.svc.store
        c.tmp = tmp_path
        yield c


def raw_bytes(tmp_path) -> dict[str, bytes]:
    """Every file under the test's folder (database, WAL, files folder), raw."""
    out = {}
    for root, _, files in os.walk(tmp_path):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[p] = fh.read()
    return out


def secret_body(n=4):
    body = upload_body(n=n, L=len(SECRET) - 2)
    body["input_ids"] = [SECRET] * n
    return body


# -- item 2 -------------------------------------------------------------------------------------
def test_deleted_dataset_leaves_no_bytes_in_db_wal_or_files(svc):
    """Old behaviour: after DELETE (204) the rows' ids were still in svc.db-wal (secure_delete
    covers the main file only), and a dataset a job named kept its sizes."""
    a = svc.alice
    gone = svc.post("/v1/datasets", json=secret_body(), headers=hdr(a)).json()["id"]
    used = svc.post("/v1/datasets", json=secret_body(5), headers=hdr(a)).json()["id"]
    jid = svc.post("/v1/jobs", json={"dataset_id": used}, headers=hdr(a)).json()["id"]
    assert wait_job(svc, a, jid)["state"] == "succeeded"
    before = raw_bytes(svc.tmp)
    assert any(NEEDLE in b for b in before.values())  # the search does find stored rows
    for d in (gone, used):
        assert svc.delete(f"/v1/datasets/{d}", headers=hdr(a)).status_code == 204
    after = raw_bytes(svc.tmp)
    holders = [p for p, b in after.items() if NEEDLE in b]
    assert holders == [], holders
    # The record a job still names keeps no sizes.
    with svc.store._tx() as db:  # the store's lock: its one SQLite connection is shared
        rows = db.exec_driver_sql("SELECT id, n_examples, max_row_len, bytes, num_labels "
                                  "FROM datasets").all()
    assert [tuple(r) for r in rows] == [(used, 0, 0, 0, 0)], rows
    assert svc.get(f"/v1/jobs/{jid}", headers=hdr(a)).json()["dataset_id"] == used


@SQLITE_ONLY
def test_rows_of_an_older_database_move_to_files(tmp_path, backend):
    """A database whose dataset rows hold the data (before migration 4): the data moves to a
    0600 file and leaves the database and its WAL."""
    import sqlite3

    st = open_store(tmp_path)
    kid = st.add_key("alice", auth.hash_key(auth.new_key()))
    did = st.create_dataset(kid, "tiny", [SECRET], [0], 2, {}, None)
    data = st._data_path(did).read_bytes()
    st.close()
    st._data_path(did).unlink()
    with sqlite3.connect(tmp_path / "svc.db") as db:  # as an older release stored it
        db.execute("UPDATE datasets SET data=? WHERE id=?", (data.decode(), did))
    st = open_store(tmp_path)
    try:
        assert st.dataset_data(did)["input_ids"] == [SECRET]
        assert stat.S_IMODE(st._data_path(did).stat().st_mode) == 0o600
        for p in (tmp_path / "svc.db", tmp_path / "svc.db-wal"):
            assert not p.exists() or NEEDLE not in p.read_bytes(), p
    finally:
        st.close()


# -- item 3 -------------------------------------------------------------------------------------
def test_jobs_are_bounded_and_checked_at_creation(svc):
    """Old behaviour: a 2-row DP job with sample_rate 1e-9 was accepted (10^9 steps); a DP
    batch larger than the dataset and plain_ids longer than the rows failed only at run time."""
    a = svc.alice
    ds = svc.post("/v1/datasets", json=upload_body(n=2), headers=hdr(a)).json()["id"]
    before = svc.store.counts()
    dp = {"noise_multiplier": 1.0}
    for job, words in (
            ({"dp": {**dp, "sample_rate": 1e-9}}, ("max_steps_per_job=1000", "3000000000")),
            ({"epochs": 100, "batch_size": 1, "dp": {**dp, "sample_rate": 0.05}},
             ("max_steps_per_job=1000",)),
            ({"batch_size": 8, "dp": dp}, ("batch_size=8", "2 rows")),
    ):
        r = svc.post("/v1/jobs", json={"dataset_id": ds, **job}, headers=hdr(a))
        assert r.status_code == 422, r.text
        assert all(w in r.json()["detail"] for w in words), r.text
    assert svc.store.counts() == before
    r = svc.post("/v1/jobs", json={"dataset_id": ds, "batch_size": 2, "dp": dp},
                 headers=hdr(a))
    assert r.status_code == 202, r.text
    # plain_ids that do not fit the rows ([CLS] + 8 tokens + [SEP]) are refused at upload.
    r = svc.post("/v1/datasets", json=upload_body(n=2, plain=list(range(5, 15))),
                 headers=hdr(a))
    assert r.status_code == 422 and "plain_ids" in r.json()["detail"], r.text
    ok = svc.post("/v1/datasets", json=upload_body(n=2, plain=list(range(5, 13))),
                  headers=hdr(a))
    assert ok.status_code == 201, ok.text


def test_dp_epsilon_is_never_negative(tmp_path, tiny_bert):
    """Old behaviour: with δ = 1/N = 0.5 (2 rows) the running and final ε were about -0.69,
    then clamped to 0.0, which reads as perfect privacy; the status did not show δ. Now δ
    defaults to 1e-5 here, a conversion below 0 is refused, and ε is opacus' at that δ."""
    from opacus.accountants import RDPAccountant

    from rapt.dp.accounting import epsilon
    from rapt.service.worker import default_runner

    with pytest.raises(ValueError, match="too large"):
        epsilon(1.0, 1e-9, 10, 0.5)
    with pytest.raises(ValueError, match="too large"):
        epsilon(5.0, 0.5, 1, 0.5)
    assert epsilon(1.0, 0.01, 100, 1e-5) > 0
    ref = RDPAccountant()
    ref.history = [(5.0, 0.5, 4)]  # 2 epochs at q = 0.5
    key = add_key(tmp_path)
    app = make_app(tmp_path, tiny_bert, default_runner, max_seq_len=32)
    seen = []
    with TestClient(app) as c:
        ds = c.post("/v1/datasets", json=upload_body(n=2), headers=hdr(key)).json()["id"]
        r = c.post("/v1/jobs", json={"dataset_id": ds, "epochs": 2, "dp": {
            "noise_multiplier": 5.0, "sample_rate": 0.5}}, headers=hdr(key))
        assert r.status_code == 202, r.text
        t0 = time.time()
        while time.time() - t0 < 60:
            st = c.get(f"/v1/jobs/{r.json()['id']}", headers=hdr(key)).json()
            seen.append(st["epsilon"])
            if st["state"] not in ("queued", "running"):
                break
            time.sleep(0.02)
    assert st["state"] == "succeeded", st
    assert st["epsilon"] is not None and all(e is None or e > 0 for e in seen), seen
    assert st["delta"] == 1e-5 and st["epsilon"] == pytest.approx(ref.get_epsilon(1e-5))


def test_queue_is_fair_between_keys_and_bounded_per_key(tmp_path, backend):
    """Old behaviour: the queue ran jobs oldest first, so a key that queued many jobs held the
    only worker until all of them had run; there was no per-key bound."""
    st = open_store(tmp_path)
    try:
        a = st.add_key("a", "ha")
        b = st.add_key("b", "hb")
        da = st.create_dataset(a, "tiny", [[2, 5, 3]], [0], 2, {}, None)
        db = st.create_dataset(b, "tiny", [[2, 6, 3]], [0], 2, {}, None)
        ja = [st.create_job(a, da, "tiny", {}, max_queued_per_key=3) for _ in range(3)]
        with pytest.raises(QueueFullError, match="max_queued_jobs_per_key=3"):
            st.create_job(a, da, "tiny", {}, max_queued_per_key=3)
        time.sleep(0.01)
        jb = st.create_job(b, db, "tiny", {}, max_queued_per_key=3)
        order = []
        for _ in range(4):
            job = st.claim_next("w")
            order.append(job["id"])
            time.sleep(0.01)  # claim times must differ for the round robin
            st.update_job(job["id"], state="succeeded", finished=time.time())
        assert order == [ja[0], jb, ja[1], ja[2]], order
        # A key with a running job yields to one without, even when its last job started
        # before the other key's.
        j1 = st.create_job(a, da, "tiny", {})
        assert st.claim_next("w")["id"] == j1
        st.update_job(j1, started=1.0)
        st.update_job(jb, started=100.0)
        j2 = st.create_job(a, da, "tiny", {})
        time.sleep(0.01)
        j3 = st.create_job(b, db, "tiny", {})
        assert st.claim_next("w")["id"] == j3
        assert st.claim_next("w")["id"] == j2
    finally:
        st.close()


@SQLITE_ONLY
def test_per_key_queue_limit_is_429(tmp_path, tiny_bert, backend):
    a, b = add_key(tmp_path, "a"), add_key(tmp_path, "b")
    runner = FakeRunner()
    runner.gate.clear()
    app = make_app(tmp_path, tiny_bert, runner, max_queued_jobs=8, max_queued_jobs_per_key=1)
    with TestClient(app) as c:
        da = c.post("/v1/datasets", json=upload_body(), headers=hdr(a)).json()["id"]
        db = c.post("/v1/datasets", json=upload_body(), headers=hdr(b)).json()["id"]
        assert c.post("/v1/jobs", json={"dataset_id": da}, headers=hdr(a)).status_code == 202
        assert runner.at_gate.wait(10)
        assert c.post("/v1/jobs", json={"dataset_id": da}, headers=hdr(a)).status_code == 202
        r = c.post("/v1/jobs", json={"dataset_id": da}, headers=hdr(a))
        assert r.status_code == 429 and "max_queued_jobs_per_key=1" in r.json()["detail"]
        assert c.post("/v1/jobs", json={"dataset_id": db}, headers=hdr(b)).status_code == 202
        runner.gate.set()


# -- item 6 -------------------------------------------------------------------------------------
def _sap_session(c, key) -> str:
    body = {"backbone": "tiny", "n_examples": 8, "split_layer": 1, "epochs": 2,
            "batch_size": 4, "max_length": 16}
    r = c.post("/v1/sap/sessions", json=body, headers=hdr(key))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_revoke_cancels_jobs_and_sessions(svc):
    """Old behaviour: revoking a key stopped nothing; its running job finished and created a
    prompt, its queued jobs and split sessions stayed."""
    a, admin = svc.alice, svc.admin
    ds = svc.post("/v1/datasets", json=upload_body(), headers=hdr(a)).json()["id"]
    svc.runner.gate.clear()
    j1 = svc.post("/v1/jobs", json={"dataset_id": ds}, headers=hdr(a)).json()["id"]
    assert svc.runner.at_gate.wait(10)
    j2 = svc.post("/v1/jobs", json={"dataset_id": ds}, headers=hdr(a)).json()["id"]
    sid = _sap_session(svc, a)
    folder = svc.store.files / "sap" / sid
    assert folder.is_dir()
    assert svc.post("/v1/admin/keys/alice/revoke", headers=hdr(svc.bob)).status_code == 403
    r = svc.post("/v1/admin/keys/alice/revoke", headers=hdr(admin))
    assert r.status_code == 200, r.text
    assert r.json()["cancelled"] == [j2] and r.json()["stopping"] == [j1], r.json()
    assert svc.get("/v1/jobs", headers=hdr(a)).status_code == 401
    kid = svc.store.find_key_id("alice", live_only=False)
    t0 = time.time()
    while svc.store.get_job(j1, kid)["state"] == "running" and time.time() - t0 < 10:
        time.sleep(0.02)
    svc.runner.gate.set()
    for j in (j1, j2):
        job = svc.store.get_job(j, kid)
        assert job["state"] == "cancelled" and job["prompt_id"] is None, job
    assert svc.store.list_prompts(kid) == []
    assert svc.store.get_sap_session(sid, kid) is None and not folder.exists()
    assert not list((svc.store.files / "checkpoints").iterdir())
    assert svc.post("/v1/admin/keys/alice/revoke", headers=hdr(admin)).status_code == 404


def test_a_job_cancelled_after_its_last_step_creates_no_prompt(tmp_path, backend):
    """Old behaviour: finish_job_with_prompt ignored a cancel request or a revoked key."""
    st = open_store(tmp_path)
    try:
        a = st.add_key("a", "ha")
        d = st.create_dataset(a, "tiny", [[2, 5, 3]], [0], 2, {}, None)
        jid = st.create_job(a, d, "tiny", {})
        assert st.claim_next("w")["id"] == jid
        out = st.revoke_key("a")
        assert out["stopping"] == [jid]
        assert not st.finish_job_with_prompt(jid, a, "tiny", 2, "prompt", False, None,
                                             str(st.files / "prompts" / "p"), "pr_x", 1.0,
                                             worker="w")
        assert st.list_prompts(a) == []
    finally:
        st.close()


def test_purge_deletes_everything_a_key_owns(svc, monkeypatch):
    """Old behaviour: there was no purge, and a revoked key's data could not be deleted by
    anyone (its owner is refused, the routes take the owner's key)."""
    from typer.testing import CliRunner

    from rapt.cli import app as cli

    a, b, admin = svc.alice, svc.bob, svc.admin
    ids = {}
    for name, key in (("alice", a), ("bob", b)):
        ds = svc.post("/v1/datasets", json=secret_body(), headers=hdr(key)).json()["id"]
        jid = svc.post("/v1/jobs", json={"dataset_id": ds}, headers=hdr(key)).json()["id"]
        pid = wait_job(svc, key, jid)["prompt_id"]
        ids[name] = (ds, jid, pid, _sap_session(svc, key))
    r = svc.delete("/v1/admin/keys/alice", headers=hdr(admin))
    assert r.status_code == 200, r.text
    assert {k: r.json()[k] for k in ("datasets", "jobs", "prompts", "sessions")} == \
        {"datasets": 1, "jobs": 1, "prompts": 1, "sessions": 1}, r.json()
    files = svc.store.files
    ds, jid, pid, sid = ids["alice"]
    kid = svc.store.find_key_id("alice", live_only=False)
    assert svc.store.list_datasets(kid) == [] and svc.store.list_jobs(kid) == []
    assert svc.store.list_prompts(kid) == [] and svc.store.owned_sap_sessions(kid) == []
    for p in (files / "datasets" / f"{ds}.json", files / "prompts" / pid, files / "sap" / sid):
        assert not p.exists(), p
    # Bob's objects are untouched; then the CLI purges bob too (SQLite: the test's file).
    ds, jid, pid, sid = ids["bob"]
    assert svc.get(f"/v1/prompts/{pid}", headers=hdr(b)).status_code == 200
    assert (files / "datasets" / f"{ds}.json").exists()
    if svc.store.dialect == "sqlite":
        out = CliRunner().invoke(cli, ["serve", "--db", str(svc.tmp / "svc.db"), "keys",
                                       "purge", "bob", "--yes"])
        assert out.exit_code == 0, out.output
        assert svc.get("/v1/jobs", headers=hdr(b)).status_code == 401
        for p in (files / "datasets" / f"{ds}.json", files / "prompts" / pid,
                  files / "sap" / sid):
            assert not p.exists(), p
        assert not any(NEEDLE in v for v in raw_bytes(svc.tmp).values())
    assert svc.delete("/v1/admin/keys/nobody", headers=hdr(admin)).status_code == 404


# -- item 7 -------------------------------------------------------------------------------------
@SQLITE_ONLY
def test_service_files_have_no_group_or_other_bits(tmp_path, backend):
    """Old behaviour: state.pt, release-*.safetensors, checkpoints, prompt files and folders
    took the process umask (0644 / 0755) inside the 0700 tree."""
    from _service import remote_run, service_bert, split_config

    old = os.umask(0o022)
    try:
        bb = service_bert()
        key = add_key(tmp_path)
        runner = FakeRunner()
        runner.gate.clear()
        app = make_app(tmp_path, bb, runner, prompt_loader=FakePrompt.load, max_seq_len=64)
        with TestClient(app) as c:
            ds = c.post("/v1/datasets", json=upload_body(), headers=hdr(key)).json()["id"]
            jid = c.post("/v1/jobs", json={"dataset_id": ds}, headers=hdr(key)).json()["id"]
            assert runner.at_gate.wait(10)  # a checkpoint is on disk now
            ck = list((tmp_path / "svc.db.files" / "checkpoints").iterdir())
            assert ck and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in ck), \
                [oct(f.stat().st_mode) for f in ck]
            runner.gate.set()
            assert wait_job(c, key, jid)["state"] == "succeeded"
            for unfreeze in (False, True):
                remote_run(c, key, bb, tmp_path / f"client{unfreeze}",
                           split_config(epochs=1, unfreeze_bottom=unfreeze))
            sap = tmp_path / "svc.db.files" / "sap"
            names = {p.name for p in sap.rglob("*")}
            assert "state.pt" in names and any(n.startswith("release-") for n in names), names
            loose = [(str(p), oct(stat.S_IMODE(p.stat().st_mode)))
                     for p in [*(tmp_path / "svc.db.files").rglob("*"),
                               tmp_path / "svc.db.files"]
                     if p.exists() and stat.S_IMODE(p.stat().st_mode) & 0o077]
            assert loose == [], loose
        assert os.umask(0o022) == 0o022  # the service gave the process its umask back
    finally:
        os.umask(old)
