"""Fair use of one service by several keys: a long job of one key yields its worker to another
key's job after a time slice (and resumes exactly, cancels, and survives a restart as before);
SAP sessions count in the key's storage quota, keep half-precision releases half-precision in
memory, and are bounded in memory per key and in all."""

from __future__ import annotations

import threading
import time

import torch
from _service import (
    FakePrompt,
    add_key,
    hdr,
    ones,
    service_bert,
    store_options,
    upload_body,
    wait_job,
)
from fastapi.testclient import TestClient

from rapt.service import Limits, ServiceConfig, auth, create_app
from rapt.split import Activations, BatchRef, OutputGrad, Release, wire


class StepsRunner:
    """A fake trainer of one step per row and epoch (batch size 1), ``step_s`` seconds each,
    checkpointing every step; records every step it runs, per job (by seed), and each resume."""

    def __init__(self, step_s: float = 0.002):
        self.step_s = step_s
        self.ran: dict[int, list[int]] = {}
        self.resumes: dict[int, list[int | None]] = {}
        self.lock = threading.Lock()

    def __call__(self, backbone, data, params, *, progress, should_stop, checkpoint, resume):
        seed, steps = params["seed"], params["epochs"] * len(data.labels)
        start = int(resume["step"]) if resume else 0
        with self.lock:
            self.resumes.setdefault(seed, []).append(resume and int(resume["step"]))
        w = torch.zeros(backbone.embeddings.shape[0], data.num_labels)
        for s in range(start + 1, steps + 1):
            if should_stop():
                break
            time.sleep(self.step_s)
            with self.lock:
                self.ran.setdefault(seed, []).append(s)
            progress({"step": s, "total_steps": steps, "loss": 1.0 / s, "epoch": 0})
            checkpoint({"step": s})
        return FakePrompt(w)


def fair_app(tmp_path, runner, slice_s: float, **limits):
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"],
                        limits=Limits(**limits), progress_interval_s=0.0,
                        job_slice_s=slice_s, heartbeat_s=0.05, **store_options(tmp_path))
    return create_app(cfg, backbones={"tiny": service_bert()}, runner=runner,
                      prompt_loader=FakePrompt.load)


def submit(c, key, steps: int, seed: int) -> str:
    """A job of ``steps`` steps: rows × epochs at batch size 1 (epochs are at most 100)."""
    epochs = min(steps, 100)
    assert steps % epochs == 0
    r = c.post("/v1/datasets", json=upload_body(n=steps // epochs), headers=hdr(key))
    assert r.status_code == 201, r.text
    r = c.post("/v1/jobs", json={"dataset_id": r.json()["id"], "epochs": epochs, "seed": seed,
                                 "batch_size": 1}, headers=hdr(key))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def wait_state(c, key, jid, pred, timeout=20.0) -> dict:
    t0 = time.time()
    while time.time() - t0 < timeout:
        st = c.get(f"/v1/jobs/{jid}", headers=hdr(key)).json()
        if pred(st):
            return st
        time.sleep(0.01)
    raise AssertionError(f"job {jid}: {st}")


def test_short_job_of_another_key_runs_while_a_long_job_waits(tmp_path, backend):
    """One worker, a 100,000-step job of key A running: key B's 1-step job is done within a
    slice or so, A's job yields (queued or running again, from its checkpoint), and A's job
    can still be cancelled, leaving no checkpoint."""
    a, b = add_key(tmp_path, "alice"), add_key(tmp_path, "bob")
    runner = StepsRunner()
    app = fair_app(tmp_path, runner, slice_s=0.3)
    with TestClient(app) as c:
        long = submit(c, a, 100_000, seed=1)
        wait_state(c, a, long, lambda st: st["state"] == "running" and st["step"] >= 5)
        t0 = time.monotonic()
        short = submit(c, b, 1, seed=2)
        st = wait_job(c, b, short, timeout=20)
        waited = time.monotonic() - t0
        assert st["state"] == "succeeded", st
        la = c.get(f"/v1/jobs/{long}", headers=hdr(a)).json()
        assert la["state"] in ("queued", "running") and la["step"] < 100_000, la
        assert waited < 10, waited  # a slice (0.3 s) and two heartbeats, on a loaded machine
        # A resumes from where it yielded, then is cancelled like any job.
        wait_state(c, a, long, lambda s: s["state"] == "running"
                   and (s["resumed_from_step"] or 0) > 0)
        assert c.post(f"/v1/jobs/{long}/cancel", headers=hdr(a)).status_code == 200
        assert wait_job(c, a, long)["state"] == "cancelled"
        ck = app.state.svc.store.files / "checkpoints"
        assert not list(ck.glob(f"{long}*"))
    steps = runner.ran[1]
    assert steps == list(range(1, len(steps) + 1))  # every step once, in order, across slices
    assert runner.resumes[1][0] is None and runner.resumes[1][1] >= 5


def test_sliced_job_finishes_exactly_once(tmp_path, backend):
    """Two keys' jobs that each need several slices: both succeed with one prompt each, every
    step of each run once, with the workers alternating between the keys."""
    a, b = add_key(tmp_path, "alice"), add_key(tmp_path, "bob")
    runner = StepsRunner(step_s=0.005)
    with TestClient(fair_app(tmp_path, runner, slice_s=0.1)) as c:
        ja, jb = submit(c, a, 200, seed=1), submit(c, b, 200, seed=2)
        sa, sb = wait_job(c, a, ja, timeout=60), wait_job(c, b, jb, timeout=60)
        assert sa["state"] == sb["state"] == "succeeded", (sa, sb)
        assert len(c.get("/v1/prompts", headers=hdr(a)).json()) == 1
        assert len(c.get("/v1/prompts", headers=hdr(b)).json()) == 1
    for seed in (1, 2):
        assert runner.ran[seed] == list(range(1, 201))
        assert len(runner.resumes[seed]) >= 2  # it yielded at least once


def test_no_slices_without_another_key_or_with_slicing_off(tmp_path):
    """A job yields only to another key's job: one key's own queued job waits (the same
    key's order is kept), and with job_slice_s=0 nothing yields."""
    a, b = add_key(tmp_path, "alice"), add_key(tmp_path, "bob")
    runner = StepsRunner(step_s=0.005)
    with TestClient(fair_app(tmp_path, runner, slice_s=0.1)) as c:
        j1 = submit(c, a, 200, seed=1)
        wait_state(c, a, j1, lambda st: st["state"] == "running")
        j2 = submit(c, a, 1, seed=2)
        assert wait_job(c, a, j1, timeout=30)["state"] == "succeeded"
        assert wait_job(c, a, j2)["state"] == "succeeded"
    assert runner.resumes[1] == [None]
    runner = StepsRunner(step_s=0.005)
    with TestClient(fair_app(tmp_path, runner, slice_s=0.0)) as c:
        j1 = submit(c, a, 200, seed=3)
        wait_state(c, a, j1, lambda st: st["state"] == "running")
        j2 = submit(c, b, 1, seed=4)
        assert wait_job(c, b, j2, timeout=30)["state"] == "succeeded"
        assert c.get(f"/v1/jobs/{j1}", headers=hdr(a)).json()["state"] == "succeeded"
    assert runner.resumes[3] == [None]


# -- SAP sessions: storage quota, half precision in memory, in-memory bounds -------------------
OCTET = {"Content-Type": "application/octet-stream"}


def sap_app(tmp_path, **limits):
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"],
                        limits=Limits(max_seq_len=64, **limits), progress_interval_s=0.0,
                        **store_options(tmp_path))
    return create_app(cfg, backbones={"tiny": service_bert()})


def sap_session(c, key, **kw) -> str:
    body = {"backbone": "tiny", "n_examples": 8, "split_layer": 1, "epochs": 2,
            "batch_size": 4, "max_length": 16, **kw}
    r = c.post("/v1/sap/sessions", json=body, headers=hdr(key))
    assert r.status_code == 201, r.text
    return r.json()["id"]


def sap_post(c, key, sid, what, msg):
    data = wire.encode(msg) if not isinstance(msg, bytes) else msg
    return c.post(f"/v1/sap/sessions/{sid}/{what}", content=data, headers={**hdr(key), **OCTET})


def chunk(offset: int, dtype=torch.float32, seed: int = 0) -> Release:
    g = torch.Generator().manual_seed(seed + offset)
    return Release(offset, torch.randn(24, 32, generator=g).to(dtype), torch.full((4,), 6))


def test_sap_files_count_in_the_key_storage_quota(tmp_path, backend):
    """Old behaviour: 16 sessions × 1 GiB of release per key, outside the dataset quota. Now
    releases and saved state count with the datasets; a chunk over the quota stores nothing,
    another key is not affected, and deleting the session gives the bytes back."""
    alice, bob = add_key(tmp_path, "alice"), add_key(tmp_path, "bob")
    size = len(wire.encode(chunk(0)))
    app = sap_app(tmp_path, max_dataset_bytes_per_key=2 * size + 1000)
    with TestClient(app) as c:
        store = app.state.svc.store
        kid = store.owner_of_hash(auth.hash_key(alice))
        sid = sap_session(c, alice)
        assert sap_post(c, alice, sid, "release", chunk(0)).status_code == 200
        assert store.stored_bytes(kid) == size
        r = c.post("/v1/datasets", json=upload_body(n=300), headers=hdr(alice))
        assert r.status_code == 429 and "SAP sessions" in r.json()["detail"], r.text
        sid2 = sap_session(c, alice)
        assert sap_post(c, alice, sid2, "release", chunk(0)).status_code == 200
        files = sorted(p.name for p in (store.files / "sap" / sid2).iterdir())
        r = sap_post(c, alice, sid2, "release", chunk(4))
        assert r.status_code == 429 and r.json()["error"] == "quota_exceeded", r.text
        assert "max_dataset_bytes_per_key" in r.json()["detail"]
        assert sorted(p.name for p in (store.files / "sap" / sid2).iterdir()) == files
        assert c.get(f"/v1/sap/sessions/{sid2}", headers=hdr(alice)).json()[
            "rows_received"] == 4
        other = sap_session(c, bob)  # another key's quota is its own
        assert sap_post(c, bob, other, "release", chunk(0)).status_code == 200
        assert c.delete(f"/v1/sap/sessions/{sid}", headers=hdr(alice)).status_code == 204
        assert store.stored_bytes(kid) == size
        assert sap_post(c, alice, sid2, "release", chunk(4)).status_code == 200
        assert sap_post(c, alice, sid2, "forward", BatchRef(0, torch.tensor([0, 5]))) \
            .status_code == 200
        assert sap_post(c, alice, sid2, "backward", OutputGrad(0, torch.randn(2, 32))) \
            .status_code == 200  # a step's saved state counts too
        state = (store.files / "sap" / sid2 / "state.pt").stat().st_size
        assert store.stored_bytes(kid) == 2 * size + state


def test_half_precision_release_stays_half_precision_in_memory(tmp_path):
    """Old behaviour: an F16 release was held as F32 (twice its size). Now the rows stay F16
    (about the upload's bytes in memory, also after a reload from the files), and the top sees
    each batch converted, giving the same output as the same values uploaded in F32."""
    key = add_key(tmp_path)
    app = sap_app(tmp_path)
    with TestClient(app) as c:
        sap = app.state.svc.sap
        half, full = sap_session(c, key), sap_session(c, key)
        for off in (0, 4):
            assert sap_post(c, key, half, "release", chunk(off, torch.float16)).status_code == 200
            same = chunk(off, torch.float16)
            assert sap_post(c, key, full, "release", Release(
                off, same.hidden.float(), same.lengths)).status_code == 200

        def held(sid) -> tuple[set, int]:
            rows = sap._live[sid].release
            storages = {r.untyped_storage().data_ptr(): r.untyped_storage().nbytes()
                        for r in rows}
            return {r.dtype for r in rows}, sum(storages.values())

        uploaded = sap._live[half].release_bytes
        dtypes, nbytes = held(half)
        assert dtypes == {torch.float16} and nbytes <= uploaded
        assert held(full)[1] > 1.9 * nbytes
        outs = [sap_post(c, key, sid, "forward", BatchRef(0, torch.tensor([1, 6, 2])))
                for sid in (half, full)]
        assert all(r.status_code == 200 for r in outs)
        g = [wire.decode(r.content, wire.MESSAGES["TopOutput"], max_bytes=1 << 20).output
             for r in outs]
        assert torch.equal(g[0], g[1])
        sap._live.clear()  # reloaded from its files: still F16
        sap_post(c, key, half, "predict", Activations(0, torch.randn(1, 3, 32), ones(1, 3)))
        assert held(half)[0] == {torch.float16}


def test_sap_sessions_in_memory_are_bounded_per_key_and_in_all(tmp_path):
    """Old behaviour: any 8 sessions stayed in memory, all of one key if it liked. Now a key
    holds at most max_sap_live_sessions_per_key in memory (its least recently used idle one
    is dropped, not another key's), all keys at most max_sap_live_sessions and
    max_sap_live_bytes, and when the sessions in the way are all in use the answer is 429."""
    alice, bob = add_key(tmp_path, "alice"), add_key(tmp_path, "bob")
    app = sap_app(tmp_path, max_sap_live_sessions_per_key=1, max_sap_live_sessions=2)
    probe = Activations(0, torch.randn(1, 3, 32), ones(1, 3))
    with TestClient(app) as c:
        sap = app.state.svc.sap
        a1, a2, b1 = sap_session(c, alice), sap_session(c, alice), sap_session(c, bob)
        for sid, key in ((b1, bob), (a1, alice), (a2, alice)):
            assert sap_post(c, key, sid, "predict", probe).status_code == 200
        assert set(sap._live) == {b1, a2}  # alice's own older session went, not bob's
        sap._live[b1].lock.acquire()  # bob's session busy with a request
        try:
            b2 = sap_session(c, bob)
            r = sap_post(c, bob, b2, "predict", probe)
            assert r.status_code == 429 and "max_sap_live_sessions_per_key=1" in r.text
            # alice's a1 must push out her own idle a2 (bob's busy one stays)
            assert sap_post(c, alice, a1, "predict", probe).status_code == 200
            assert set(sap._live) == {b1, a1}
        finally:
            sap._live[b1].lock.release()
        one = sap._live[a1].memory
        sap.limits.max_sap_live_bytes = one + 10_000  # room for one session, and a chunk
        assert sap_post(c, alice, a2, "predict", probe).status_code == 200
        assert set(sap._live) == {a2}  # a1 for alice's own limit, b1 for the bytes
        sap._live[a2].lock.acquire()
        try:
            r = sap_post(c, bob, b1, "predict", probe)
            assert r.status_code == 429 and "max_sap_live_bytes" in r.text, r.text
        finally:
            sap._live[a2].lock.release()


def test_sap_client_retries_while_the_sessions_in_memory_are_busy(tmp_path):
    """A 429 sap_busy says retry shortly: the client's SAP requests do, within retry_s."""
    from rapt.client.client import RaptClient

    key = add_key(tmp_path)
    app = sap_app(tmp_path, max_sap_live_sessions=1)
    probe = wire.encode(Activations(0, torch.randn(1, 3, 32), ones(1, 3)))
    with TestClient(app) as c:
        sap = app.state.svc.sap
        busy, mine = sap_session(c, key), sap_session(c, key)
        assert sap_post(c, key, busy, "predict", probe).status_code == 200
        sap._live[busy].lock.acquire()
        threading.Timer(0.5, sap._live[busy].lock.release).start()
        client = RaptClient(api_key=key, backbone=service_bert(), remote_backbone="tiny", http=c)
        r = client.api.request_retrying("POST", f"/v1/sap/sessions/{mine}/predict",
                                        retry_s=30, content=probe, headers=OCTET)
        assert r.status_code == 200 and set(sap._live) == {mine}
