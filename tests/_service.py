"""Helpers shared by the service tests: a fake trainer and prompt, the service app on a tiny
BERT with its store backend and API keys, job polling, the client's toy data with its leak
detector, the SAP session helpers, and a real uvicorn server in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from _tiny import SPECIALS, WORDS, make_bert, save_backbone
from safetensors.torch import load_file, save_file

from rapt.client.client import RaptClient
from rapt.service import Limits, ServiceConfig, auth, create_app
from rapt.service.store import Store
from rapt.split import SplitConfig, encode_texts, predict_split, train_split, wire


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

    def __init__(self, steps: int = 4, step_s: float = 0.0, fail_at: int | None = None):
        self.steps, self.step_s, self.fail_at = steps, step_s, fail_at
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
            if s == self.fail_at:
                raise ValueError(f"label 7 is out of range at step {s}")
            if s == 2 and not self.gate.is_set():
                self.at_gate.set()
                while not self.gate.wait(0.05):
                    if should_stop():
                        return FakePrompt(w)
        return FakePrompt(w)


# The service tests' vocabulary: WORDS without "actors" (so "actors" in TEXTS is [UNK]), read
# by the slow tokenizer, built without touching the disk.
SERVICE_WORDS = [w for w in WORDS if w != "actors"]


def service_tokenizer():
    """~55-word BERT tokenizer built in code (for the tests that need a backbone outside a
    fixture, e.g. saved to disk for the server subprocess)."""
    from transformers import BertTokenizer

    vocab = SPECIALS + SERVICE_WORDS
    return BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)


def service_bert(seed: int = 0):
    """The backbone the service tests serve as "tiny": a random 2-layer, 32-dim BERT over
    service_tokenizer()."""
    return make_bert(service_tokenizer(), seed=seed, name="tiny", max_positions=256)


# The store backend of a test's service: SQLite (tmp_path / "svc.db") unless conftest's
# `backend` fixture registered a PostgreSQL database for this tmp_path.
PG_URLS: dict[Path, str] = {}


SQLITE_ONLY = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def store_options(tmp_path) -> dict:
    """ServiceConfig fields naming the test's store (and its files beside the SQLite path)."""
    url = PG_URLS.get(tmp_path)
    return ({"store_url": url, "files_dir": tmp_path / "svc.db.files"} if url else {})


def open_store(tmp_path) -> Store:
    url = PG_URLS.get(tmp_path)
    return Store(url, files=tmp_path / "svc.db.files") if url else Store(tmp_path / "svc.db")


def make_app(tmp_path, backbone, runner=None, *, prompt_loader=FakePrompt.load, forward=None,
             name="tiny", **limits):
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=[name],
                        limits=Limits(**limits), progress_interval_s=0.0, batch_wait_ms=20,
                        **store_options(tmp_path))
    return create_app(cfg, backbones={name: backbone}, runner=runner or FakeRunner(),
                      prompt_loader=prompt_loader, forward=forward)


def add_key(tmp_path, name="alice", **kw) -> str:
    store = open_store(tmp_path)
    key = auth.new_key()
    store.add_key(name, auth.hash_key(key), **kw)
    store.close()
    return key


def folder_service(tmp_path, monkeypatch):
    """(backbone, its folder, the service's config, an API key): the tiny BERT saved to a
    folder, which both the service and the CLI's client load by that path; the client's cache
    in ``tmp_path``."""
    bb = service_bert()
    folder = save_backbone(bb, tmp_path / "bb")
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=[str(folder)],
                        limits=Limits(max_seq_len=64), progress_interval_s=0.0)
    key = add_key(tmp_path)
    monkeypatch.setenv("RAPT_CACHE", str(tmp_path / "cache"))
    return bb, folder, cfg, key


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


# -- the client's toy data -------------------------------------------------------------------
TEXTS = [
    "the movie was really good and the music was great",
    "a boring plot with terrible actors and a dull story",
    "this film is one of the best ever with a brilliant scene",
    "the worst music and a weak plot that was very long",
    "funny and nice it was fun with good actors",
    "sad poor and awful this is not a fine film",
    "i love this story and the actor is great",
    "i hate the long scene and the bad music",
]
LABELS = [1, 0, 1, 0, 1, 0, 1, 0]


def write_csv(path, texts=TEXTS, labels=LABELS):
    rows = ["text,label"] + [f"{t},{y}" for t, y in zip(texts, labels, strict=True)]
    path.write_text("\n".join(rows) + "\n")
    return path


def ngrams(seq, n):
    return {tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)}


def leaked_ngrams(sent: list[bytes], tokenizer, n=4) -> set:
    """Original n-grams of TEXTS' token ids found contiguously in any id list sent."""
    originals = set()
    for t in TEXTS:
        originals |= ngrams(tokenizer(t, add_special_tokens=False)["input_ids"], n)
    seen = set()

    def walk(x):
        if isinstance(x, list) and x and all(isinstance(v, int) for v in x):
            seen.update(ngrams(x, n))
        elif isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)

    for body in sent:
        if body:
            walk(json.loads(body))
    return originals & seen


# -- split learning (SAP) over the service --------------------------------------------------
OCTET = {"Content-Type": "application/octet-stream"}


def ones(*shape: int) -> torch.Tensor:
    return torch.ones(*shape, dtype=torch.bool)


def split_config(**kw) -> SplitConfig:
    """A small SplitConfig for the SAP tests; ``kw`` overrides its fields."""
    base = dict(split_layer=1, eta=20.0, noise_seed=3, epochs=3, batch_size=4, lr=3e-2,
                warmup_ratio=0.0, max_length=32)
    return SplitConfig(**{**base, **kw})


def remote_run(tc, key, bb, tmp_path, sc, labels=LABELS):
    """Train and predict through the service; returns (client, session id, history, probs)."""
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc)
    rows = encode_texts(bb.tokenizer, TEXTS, sc.max_length)
    customer = c.sap_customer(sc, 2, cache_dir=tmp_path / "cache")
    customer.load(rows, labels)
    sid = c.sap_session(sc, len(rows))
    provider = c.sap_provider(sid, customer)
    if not sc.unfreeze_bottom:
        provider.upload_release()
    hist = train_split(customer, provider)
    return c, sid, hist, predict_split(customer, provider, rows)


def sap_session(tc, key, **kw) -> str:
    body = {"backbone": "tiny", "n_examples": 8, "split_layer": 1, "epochs": 2, "batch_size": 4,
            "max_length": 16, **kw}
    r = tc.post("/v1/sap/sessions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def sap_post(tc, sid, what, msg, who):
    data = wire.encode(msg) if not isinstance(msg, bytes) else msg
    return tc.post(f"/v1/sap/sessions/{sid}/{what}", content=data, headers={**who, **OCTET})


# -- a real server: `rapt serve` in a subprocess ----------------------------------------------
RAPT = [sys.executable, "-c", "import sys; from rapt.cli import main; sys.argv[0] = 'rapt'; main()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


class Server:
    def __init__(self, db: Path, backbone: Path, log: Path):
        self.db, self.backbone, self.log = db, backbone, log
        self.url = ""
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            RAPT + ["serve", "--host", "127.0.0.1", "--port", str(port), "--db", str(self.db),
                    "--backbone", str(self.backbone), "--batch-wait-ms", "10"],
            env=env(), stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        t0 = time.time()
        while time.time() - t0 < 60:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise AssertionError(f"server did not come up: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # graceful: lifespan shutdown runs
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
