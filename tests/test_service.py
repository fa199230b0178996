"""Service API in-process (FastAPI TestClient) with a fake trainer injected: routes, errors,
limits, tenancy, job lifecycle, restart recovery, micro-batching. The end-to-end test with the
real trainer and a uvicorn subprocess is in test_service_e2e.py."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file, save_file

from rapt.service import Limits, ServiceConfig, auth, create_app
from rapt.service.store import Store


class FakePrompt:
    """Deterministic stand-in for TunedPrompt: probabilities from a per-prompt weight on the
    row's token-id histogram, so different prompts give different answers."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight  # (V, C)
        self.calls = 0

    def predict_proba(self, backbone, input_ids, batch_size=64):
        self.calls += 1
        V = self.weight.shape[0]
        hist = torch.zeros(len(input_ids), V)
        for i, r in enumerate(input_ids):
            hist[i].index_add_(0, torch.tensor(r), torch.ones(len(r)))
        return torch.softmax(hist @ self.weight, -1)

    def save(self, folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        save_file({"weight": self.weight.contiguous()}, str(Path(folder) / "w.safetensors"))

    @classmethod
    def load(cls, folder):
        return cls(load_file(str(Path(folder) / "w.safetensors"))["weight"])


class FakeRunner:
    """Counts steps, reports progress, checkpoints every step; ``gate`` pauses it mid-job."""

    def __init__(self, steps: int = 4, step_s: float = 0.0):
        self.steps, self.step_s = steps, step_s
        self.gate = threading.Event()
        self.gate.set()
        self.at_gate = threading.Event()
        self.resumes: list = []

    def __call__(self, backbone, data, params, *, progress, should_stop, checkpoint, resume):
        self.resumes.append(resume)
        start = int(resume["step"]) if resume else 0
        V = backbone.embeddings.shape[0]
        g = torch.Generator().manual_seed(params["seed"] + 1000 * len(data.labels))
        w = torch.randn(V, data.num_labels, generator=g)
        for s in range(start + 1, self.steps + 1):
            if should_stop():
                return FakePrompt(w)
            time.sleep(self.step_s)
            progress({"step": s, "total_steps": self.steps, "loss": 1.0 / s, "epoch": 0})
            checkpoint({"step": s, "w": w})
            if s == 2 and not self.gate.is_set():
                self.at_gate.set()
                while not self.gate.wait(0.05):
                    if should_stop():
                        return FakePrompt(w)
        return FakePrompt(w)


WORDS = ("the a movie film good bad great awful boring fun plot actor story love hate is was not "
         "very really it this that and but of to in with funny sad dull brilliant terrible best "
         "worst ever one two time scene music long short fine nice poor weak").split()


def make_tokenizer():
    """~55-word BERT tokenizer built in code (for the tests that need a backbone outside a
    fixture, e.g. saved to disk for the server subprocess)."""
    from transformers import BertTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    return BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)


def make_bert(seed: int = 0):
    """rapt Backbone around a random 2-layer, 32-dim BERT over make_tokenizer()."""
    from transformers import BertConfig, BertModel

    from rapt.models import from_model

    tok = make_tokenizer()
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=256)
    return from_model(BertModel(cfg).eval(), tok, name="tiny", kind="encoder")


def make_app(tmp_path, backbone, runner=None, **limits):
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"],
                        limits=Limits(**limits), progress_interval_s=0.0, batch_wait_ms=20)
    return create_app(cfg, backbones={"tiny": backbone}, runner=runner or FakeRunner(),
                      prompt_loader=FakePrompt.load)


def add_key(tmp_path, name="alice") -> str:
    store = Store(tmp_path / "svc.db")
    key = auth.new_key()
    store.add_key(name, auth.hash_key(key))
    store.close()
    return key


def hdr(key):
    return {"Authorization": f"Bearer {key}"}


def upload_body(n=6, V=50, L=8, num_labels=2, plain=None):
    g = torch.Generator().manual_seed(n)
    ids = [[2] + torch.randint(5, V, (L,), generator=g).tolist() + [3] for _ in range(n)]
    return {"backbone": "tiny", "input_ids": ids, "labels": [i % num_labels for i in range(n)],
            "num_labels": num_labels, "privacy": {"mechanism": "dchi-text2text", "eta": 10.0},
            "plain_ids": plain}


def wait_job(c, key, jid, states=("succeeded", "failed", "cancelled"), timeout=20):
    t0 = time.time()
    while time.time() - t0 < timeout:
        st = c.get(f"/v1/jobs/{jid}", headers=hdr(key)).json()
        if st["state"] in states:
            return st
        time.sleep(0.02)
    raise AssertionError(f"job {jid} stuck: {st}")


@pytest.fixture()
def svc(tmp_path, tiny_bert):
    alice, bob = add_key(tmp_path, "alice"), add_key(tmp_path, "bob")
    runner = FakeRunner()
    app = make_app(tmp_path, tiny_bert, runner, max_upload_bytes=20_000, max_seq_len=32,
                   max_queued_jobs=2, max_predict_rows=16)
    with TestClient(app) as c:
        c.alice, c.bob, c.runner = alice, bob, runner
        c.store = app.state.svc.store
        yield c


def test_openapi_and_health(svc):
    spec = svc.get("/openapi.json").json()
    for path in ("/v1/datasets", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel",
                 "/v1/prompts/{prompt_id}", "/v1/predict"):
        assert path in spec["paths"], path
    assert svc.get("/v1/health").json()["backbones"] == ["tiny"]
    import sqlite3

    with sqlite3.connect(svc.store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        hashes = [r[0] for r in db.execute("SELECT key_hash FROM api_keys")]
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
    ("unknown option", {"momentum": 0.9}, "momentum"),
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


def test_restart_resumes_from_checkpoint_or_fails_with_reason(tmp_path, tiny_bert):
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
    before = dict(svc.get("/v1/stats", headers=hdr(a)).json()["tiny"])

    def one(i):
        p = prompts[i % 3]
        r = svc.post("/v1/predict", json={"prompt_id": p, "input_ids": rows}, headers=hdr(a))
        return p, r.json()

    with ThreadPoolExecutor(12) as ex:
        results = list(ex.map(one, range(60)))
    for p, out in results:
        assert torch.allclose(torch.tensor(out["probabilities"]), refs[p], atol=1e-6)
    after = svc.get("/v1/stats", headers=hdr(a)).json()["tiny"]
    assert after["requests"] - before["requests"] == 60
    assert after["batches"] - before["batches"] < 60  # requests were grouped
    assert after["max_prompts_in_batch"] >= 2  # groups mixed several prompts
    r = svc.post("/v1/predict", json={"prompt_id": prompts[0], "input_ids": rows * 9},
                 headers=hdr(a))
    assert r.status_code == 422 and "max_predict_rows=16" in r.json()["detail"]


def test_mixed_prompts_one_forward_pass_matches_per_prompt(tiny_bert):
    """Soft prompts of several tasks share one backbone pass and give each prompt's own
    predict_proba (plain-token masking included)."""
    from rapt.reconstruction import build_rows
    from rapt.service import mixed
    from rapt.service.inference import MicroBatcher
    from rapt.trainer import TuneConfig, tune

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
    assert mixed.supports(tiny_bert, [p for p, _ in prompts])
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
    from rapt.tuners import base_model

    passes = []
    hook = base_model(tiny_bert.model).register_forward_hook(lambda *a: passes.append(1))
    models = [p.build(tiny_bert) for p, _ in items]
    one = mixed.prompt_group_forward(tiny_bert, models, [r for _, r in items],
                                     max_padding=float("inf"))
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
    app = make_app(tmp_path, make_bert(), runner)
    with TestClient(app) as c:
        ds = c.post("/v1/datasets", json=upload_body(n=8), headers=hdr(key)).json()
        jid = c.post("/v1/jobs", json={"dataset_id": ds["id"], **body},
                     headers=hdr(key)).json()["id"]
        assert runner.checkpointed.wait(30)
        ref = c.post("/v1/jobs", json={"dataset_id": ds["id"], **body},
                     headers=hdr(key)).json()["id"]  # queued: runs after the restart
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"], progress_interval_s=0)
    with TestClient(create_app(cfg, backbones={"tiny": make_bert()},
                               runner=default_runner)) as c:
        st, st_ref = wait_job(c, key, jid, timeout=60), wait_job(c, key, ref, timeout=60)
        assert st["state"] == st_ref["state"] == "succeeded", (st, st_ref)
        assert st["resumed_from_step"] >= 1 and st_ref["resumed_from_step"] is None
        assert (st["epsilon"] is not None) == (dp is not None)
        if dp is not None:
            return  # DP noise is drawn from fresh OS randomness per run: not comparable
        files = app.state.svc.store.files / "prompts"
        a = load_file(str(files / st["prompt_id"] / "prompt.safetensors"))
        b = load_file(str(files / st_ref["prompt_id"] / "prompt.safetensors"))
        assert a.keys() == b.keys()
        for k in a:  # the interrupted job ends where the uninterrupted one does
            assert torch.allclose(a[k], b[k], atol=1e-5), k


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
    with TestClient(make_app(tmp_path, make_bert(), runner)) as c:
        ds = c.post("/v1/datasets", json=upload_body(), headers=hdr(key)).json()
        jid = c.post("/v1/jobs", json={"dataset_id": ds["id"]}, headers=hdr(key)).json()["id"]
        assert runner.at_gate.wait(10)
    with TestClient(make_app(tmp_path, make_bert(), runner)) as c:
        st = wait_job(c, key, jid)
        assert st["state"] == "succeeded" and st["resumed_from_step"] is None, st
        assert runner.resumes == [None, None]
