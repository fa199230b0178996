"""SAP as a service (/v1/sap/...): remote split training equals the in-process library, what
crosses the wire (no text, no ids, no labels out; no top weight back), bad messages refused with
nothing changed, and end to end on uvicorn with a server crash mid-step."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from test_client import LABELS, TEXTS, leaked_ngrams
from test_service import add_key, make_bert

from rapt.client import PrivacyNotConfiguredError, RaptClient
from rapt.service import Limits, ServiceConfig, create_app
from rapt.split import (
    Activations,
    BatchRef,
    OutputGrad,
    Release,
    SplitConfig,
    encode_texts,
    predict_split,
    setup_split,
    train_split,
)
from rapt.split import wire

OCTET = {"Content-Type": "application/octet-stream"}


def cfg(**kw) -> SplitConfig:
    base = dict(split_layer=1, eta=20.0, noise_seed=3, epochs=3, batch_size=4, lr=3e-2,
                warmup_ratio=0.0, max_length=32)
    return SplitConfig(**{**base, **kw})


@pytest.fixture()
def service(tmp_path):
    bb = make_bert()
    config = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"],
                           limits=Limits(max_seq_len=64), progress_interval_s=0.0)
    app = create_app(config, backbones={"tiny": bb})
    keys = add_key(tmp_path), add_key(tmp_path, "bob")
    with TestClient(app) as tc:
        yield tc, keys, bb


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


def local_run(bb, sc, labels=LABELS):
    rows = encode_texts(bb.tokenizer, TEXTS, sc.max_length)
    customer, provider = setup_split(bb, sc, 2, len(rows))
    customer.load(rows, labels)
    return train_split(customer, provider), predict_split(customer, provider, rows)


def safetensors_parts(body: bytes) -> tuple[dict, dict] | None:
    """(metadata, {name: tensor}) of a safetensors body, None for anything else."""
    try:
        n = struct.unpack("<Q", body[:8])[0]
        header = json.loads(body[8:8 + n])
    except (struct.error, ValueError, UnicodeDecodeError):
        return None
    from safetensors.torch import load

    return header.pop("__metadata__", {}), load(body)


def as_json(body: bytes) -> bytes:
    """A body as the JSON the existing id detector walks: safetensors integer tensors become
    id lists (a flattened release of token ids would show up here)."""
    parts = safetensors_parts(body)
    if parts is None:
        return body
    return json.dumps({k: t.tolist() for k, t in parts[1].items()
                       if not t.is_floating_point()}).encode()


@pytest.mark.parametrize("unfreeze", [False, True])
def test_remote_training_equals_in_process_and_wire_is_clean(service, tmp_path, unfreeze):
    tc, (key, _), bb = service
    sent, got = [], []
    tc.event_hooks["request"] = [lambda req: sent.append((req.url.path, req.read()))]
    tc.event_hooks["response"] = [lambda r: got.append(r.read())]
    sc = cfg(unfreeze_bottom=unfreeze)
    c, sid, hist, probs = remote_run(tc, key, bb, tmp_path, sc)
    ref_hist, ref_probs = local_run(bb, sc)
    assert [h["loss"] for h in hist] == [h["loss"] for h in ref_hist]
    assert torch.allclose(probs, ref_probs, atol=1e-6)
    st = c.sap_status(sid)
    assert st["steps_done"] == st["total_steps"] == 6 and st["last_step"] == 5
    assert st["rows_received"] == (0 if unfreeze else 8)

    bodies = [b for _, b in sent]
    # No raw text, no word, no original id n-gram in any request body.
    blob = b"\n".join(bodies)
    for t in TEXTS:
        assert t.encode() not in blob
    for w in ("boring", "brilliant", "terrible"):
        assert w.encode() not in blob
    assert not leaked_ngrams([as_json(b) for b in bodies if b], bb.tokenizer, n=3)
    # No labels and nothing derived from them but ∂l/∂g, which is what SAP sends.
    tensor_names, json_keys = set(), set()
    for path, b in sent:
        parts = safetensors_parts(b) if b else None
        if parts is not None:
            assert set(parts[0]) <= {"message", "step", "offset"}
            tensor_names |= set(parts[1])
        elif b:
            json_keys |= set(json.loads(b))
    assert tensor_names == ({"hidden", "mask", "grad"} if unfreeze
                            else {"hidden", "mask", "rows", "grad"})
    assert not [k for k in json_keys if "label" in k or "class" in k or k in ("eta",
                                                                              "noise_seed")]
    # A frozen release crosses once: 8 rows uploaded, then batches by index only.
    releases = [b for p, b in sent if p.endswith("/release")]
    assert len(releases) == (0 if unfreeze else 1)
    # No top weight in any response (the bottom download included): a 32-byte slice of every
    # non-constant top tensor, base weights and trained LoRA alike.
    top = tc.app.state.svc.sap._live[sid].provider.top.state_dict()
    assert any("lora_B" in k for k in top)
    checked = 0
    for v in top.values():
        flat = v.detach().float().flatten()
        if flat.numel() < 16:
            continue
        piece = flat[flat.numel() // 2:flat.numel() // 2 + 8]
        if piece.unique().numel() < 8:
            continue  # LayerNorm ones / zero biases exist in the bottom too
        needle = piece.contiguous().numpy().tobytes()
        assert not any(needle in r for r in got)
        checked += 1
    assert checked >= 8


def test_forward_traffic_does_not_depend_on_labels(service, tmp_path):
    tc, (key, _), bb = service
    """What the provider receives besides ∂l/∂g is byte for byte the same with other labels
    (the same noise seed), so no request but ``backward`` can carry label information."""
    tc, (key, _), bb = service
    runs = []
    for labels in (LABELS, [1 - y for y in LABELS]):
        sent: list = []
        tc.event_hooks["request"] = [lambda req, s=sent: s.append((req.url.path, req.read()))]
        remote_run(tc, key, bb, tmp_path, cfg(), labels=labels)
        runs.append([(p.rsplit("/", 1)[-1].split("_")[0], b) for p, b in sent])
    a, b = runs
    assert [p for p, _ in a] == [p for p, _ in b]
    same = [same_body(x, y) for (p, x), (_, y) in zip(a, b, strict=True) if p != "backward"]
    assert all(same) and len(same) > 10
    grads = [(x, y) for (p, x), (_, y) in zip(a, b, strict=True) if p == "backward"]
    assert not same_body(*grads[0])  # the labels were used, so the test could fail


def same_body(x: bytes, y: bytes) -> bool:
    """Equal messages (safetensors headers may order their metadata differently)."""
    px, py = safetensors_parts(x), safetensors_parts(y)
    if px is None or py is None:
        return x == y
    return px[0] == py[0] and px[1].keys() == py[1].keys() and all(
        torch.equal(px[1][k], py[1][k]) for k in px[1])
