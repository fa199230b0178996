"""Fair use of one service by several keys: a long job of one key yields its worker to another
key's job after a time slice (and resumes exactly, cancels, and survives a restart as before);
SAP sessions count in the key's storage quota, keep half-precision releases half-precision in
memory, and are bounded in memory per key and in all."""

from __future__ import annotations

import threading
import time

import torch
from fastapi.testclient import TestClient
from test_service import (  # noqa: F401  (backend: the store fixture)
    FakePrompt,
    add_key,
    backend,
    hdr,
    make_bert,
    store_options,
    upload_body,
    wait_job,
)

from rapt.service import Limits, ServiceConfig, create_app


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
    return create_app(cfg, backbones={"tiny": make_bert()}, runner=runner,
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


def test_short_job_of_another_key_runs_while_a_long_job_waits(tmp_path, backend):  # noqa: F811
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


def test_sliced_job_finishes_exactly_once(tmp_path, backend):  # noqa: F811
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
