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
from _service import (
    LABELS,
    OCTET,
    TEXTS,
    leaked_ngrams,
    ones,
    remote_run,
    sap_post,
    sap_session,
    service_bert,
    split_config,
)
from _tiny import save_backbone
from fastapi.testclient import TestClient
from safetensors.torch import save

from rapt.client.client import PrivacyNotConfiguredError, RaptClient
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
    wire,
)


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
def test_remote_training_equals_in_process_and_wire_is_clean(sap_service, tmp_path, unfreeze):
    tc, (key, _), bb = sap_service
    sent, got = [], []
    tc.event_hooks["request"] = [lambda req: sent.append((req.url.path, req.read()))]
    tc.event_hooks["response"] = [lambda r: got.append(r.read())]
    sc = split_config(unfreeze_bottom=unfreeze)
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
    for _, b in sent:
        parts = safetensors_parts(b) if b else None
        if parts is not None:
            assert set(parts[0]) <= {"message", "step", "offset", "width"}
            tensor_names |= set(parts[1])
        elif b:
            json_keys |= set(json.loads(b))
    assert tensor_names == ({"hidden", "lengths", "grad"} if unfreeze
                            else {"hidden", "lengths", "rows", "grad"})
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


def test_forward_traffic_does_not_depend_on_labels(sap_service, tmp_path):
    tc, (key, _), bb = sap_service
    """What the provider receives besides ∂l/∂g is byte for byte the same with other labels
    (the same noise seed), so no request but ``backward`` can carry label information."""
    tc, (key, _), bb = sap_service
    runs = []
    for labels in (LABELS, [1 - y for y in LABELS]):
        sent: list = []
        tc.event_hooks["request"] = [lambda req, s=sent: s.append((req.url.path, req.read()))]
        remote_run(tc, key, bb, tmp_path, split_config(), labels=labels)
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


def test_bad_messages_are_refused_and_change_nothing(sap_service, tmp_path):
    tc, (key, bob), bb = sap_service
    me, other = {"Authorization": f"Bearer {key}"}, {"Authorization": f"Bearer {bob}"}
    files = Path(str(tmp_path / "svc.db") + ".files") / "sap"

    def post(sid, what, msg, who=me):
        data = wire.encode(msg) if not isinstance(msg, bytes) else msg
        return tc.post(f"/v1/sap/sessions/{sid}/{what}", content=data, headers={**who, **OCTET})

    def snapshot(sid):
        state = files / sid / "state.pt"
        return (tc.get(f"/v1/sap/sessions/{sid}", headers=me).json(),
                state.read_bytes() if state.exists() else None,
                sorted(p.name for p in (files / sid).iterdir()))

    def refused(sid, resp, status, word):
        before = snapshot(sid)
        r = resp()
        assert r.status_code == status and word in r.json()["detail"], (r.status_code, r.text)
        assert snapshot(sid) == before
        return r

    # unfrozen: activations with every forward
    sid = sap_session(tc, key, unfreeze_bottom=True)
    mask = ones(4, 6)
    good = Activations(0, torch.randn(4, 6, 32), mask)
    assert post(sid, "forward", good).status_code == 200
    for bad, word in [
            (Activations(0, torch.randn(4, 6, 16), mask), "expects 32"),  # hidden size
            (Activations(0, torch.randn(5, 6, 32), ones(5, 6)), "batch_size=4"),
            (wire.encode(good)[:-7], "safetensors"),  # truncated body
            (b"\x00" * 64, "safetensors"),
            (OutputGrad(0, torch.randn(4, 32)), "got 'OutputGrad'"),
            (BatchRef(0, torch.tensor([0, 1])), "expected a Activations")]:
        refused(sid, lambda b=bad: post(sid, "forward", b), 422, word)
    # a float64 mask and an integer hidden are refused from the header, before any tensor
    lens = torch.full((4,), 6)
    for tensors, word in [({"hidden": torch.ones(24, 32, dtype=torch.int32), "lengths": lens},
                           "dtype I32"),
                          ({"hidden": torch.randn(24, 32), "lengths": lens.double()},
                           "dtype F64"),
                          ({"hidden": torch.randn(24, 32), "mask": mask}, "expected exactly"),
                          ({"hidden": torch.randn(20, 32), "lengths": lens}, "sum to 24")]:
        data = save(tensors, metadata={"message": "Activations", "step": "0", "width": "6"})
        refused(sid, lambda d=data: post(sid, "forward", d), 422, word)
    nan = torch.randn(4, 32)
    nan[1, 3] = float("nan")
    nan_body = save({"grad": nan}, metadata={"message": "OutputGrad", "step": "0"})
    refused(sid, lambda: post(sid, "backward", nan_body), 422, "NaN")
    refused(sid, lambda: post(sid, "backward", OutputGrad(0, torch.randn(3, 32))), 422, "shape")
    refused(sid, lambda: post(sid, "backward", OutputGrad(1, torch.randn(4, 32))), 409,
            "skips ahead")
    # another tenant's session is a missing one, for every route
    for what in ("forward", "backward", "predict", "release"):
        refused(sid, lambda w=what: post(sid, w, good, who=other), 404, "no sap session")
    assert tc.get(f"/v1/sap/sessions/{sid}", headers=other).status_code == 404
    assert tc.delete(f"/v1/sap/sessions/{sid}", headers=other).status_code == 404
    assert tc.post(f"/v1/sap/sessions/{sid}/forward", content=wire.encode(good)).status_code \
        == 401
    # the pending forward survived all that: the right gradient applies step 0 once
    grad0 = wire.encode(OutputGrad(0, torch.randn(4, 32)))
    r = post(sid, "backward", grad0)
    assert r.status_code == 200 and r.headers["x-rapt-replayed"] == "0"
    reply = wire.decode(r.content, wire.MESSAGES["ActivationGrad"], max_bytes=1 << 20)
    assert reply.step == 0 and reply.grad.shape == (4, 6, 32)
    # a repeated backward (lost reply) is answered from the saved reply, nothing applied twice
    before = snapshot(sid)
    r2 = post(sid, "backward", grad0)
    assert r2.status_code == 200 and r2.headers["x-rapt-replayed"] == "1"
    assert torch.equal(wire.decode(r2.content, wire.MESSAGES["ActivationGrad"],
                                   max_bytes=1 << 20).grad, reply.grad)
    assert snapshot(sid) == before and before[0]["last_step"] == 0
    # a stale forward names the step to resume from
    r = refused(sid, lambda: post(sid, "forward", good), 409, "already applied")
    assert r.headers["x-rapt-last-step"] == "0"
    # no forward pending (e.g. after a restart): 409 no_forward
    refused(sid, lambda: post(sid, "backward", OutputGrad(1, torch.randn(4, 32))), 409,
            "no forward of step 1")
    # a release belongs to a frozen bottom only
    rel = Release(0, torch.randn(24, 32), torch.full((4,), 6))
    refused(sid, lambda: post(sid, "release", rel), 409, "trains the bottom")

    # frozen: the release first, contiguous; batches by index
    sid = sap_session(tc, key)
    refused(sid, lambda: post(sid, "forward", BatchRef(0, torch.tensor([0, 1]))), 409,
            "upload rows 0..")
    refused(sid, lambda: post(sid, "release", Release(4, torch.randn(24, 32),
                                                      torch.full((4,), 6))), 409,
            "send offset=0")
    refused(sid, lambda: post(sid, "release", Release(0, torch.randn(54, 32),
                                                      torch.full((9,), 6))), 422, "n_examples=8")
    refused(sid, lambda: post(sid, "release", Release(0, torch.randn(20, 32),
                                                      torch.tensor([17, 1, 1, 1]))), 422,
            "max_length=16")
    bad = save({"hidden": torch.randn(20, 32), "lengths": torch.tensor([6, 6, 6, 6])},
               metadata={"message": "Release", "offset": "0"})
    refused(sid, lambda: post(sid, "release", bad), 422, "sum to 24")
    for off in (0, 0, 4):  # the repeated chunk is accepted and changes nothing
        r = post(sid, "release", Release(off, torch.randn(24, 32), torch.full((4,), 6)))
        assert r.status_code == 200, r.text
    assert r.json()["rows_received"] == 8
    refused(sid, lambda: post(sid, "forward", good), 422, "expected a BatchRef")
    refused(sid, lambda: post(sid, "forward", BatchRef(0, torch.tensor([0, 8]))), 422,
            "not a row")
    dup = save({"rows": torch.tensor([1, 1])}, metadata={"message": "BatchRef", "step": "0"})
    refused(sid, lambda: post(sid, "forward", dup), 422, "distinct")
    assert post(sid, "forward", BatchRef(0, torch.tensor([0, 5]))).status_code == 200
    r = post(sid, "backward", OutputGrad(0, torch.randn(2, 32)))
    assert r.status_code == 200 and r.json() == {"step": 0, "last_step": 0, "replayed": False}
    # predict: any time, no step order; shapes checked the same way
    out = post(sid, "predict", Activations(0, torch.randn(3, 5, 32), ones(3, 5)))
    assert wire.decode(out.content, wire.MESSAGES["TopOutput"], max_bytes=1 << 20) \
        .output.shape == (3, 32)
    refused(sid, lambda: post(sid, "predict", Activations(0, torch.randn(3, 5, 8),
                                                          ones(3, 5))), 422, "expects 32")


def test_session_creation_refuses_labels_and_bad_configs(sap_service):
    tc, (key, _), bb = sap_service
    me = {"Authorization": f"Bearer {key}"}
    base = {"backbone": "tiny", "n_examples": 8}
    for extra, status, word in [({"labels": [0, 1]}, 422, "labels"),
                                ({"num_labels": 2}, 422, "num_labels"),
                                ({"noise_seed": 1}, 422, "noise_seed"),
                                ({"split_layer": 2}, 422, "0..1"),
                                ({"backbone": "nope"}, 422, "not loaded"),
                                ({"method": "prefix"}, 422, "method"),
                                ({"max_length": 65}, 422, "max_seq_len=64")]:
        r = tc.post("/v1/sap/sessions", json={**base, **extra}, headers=me)
        assert r.status_code == status and word in r.text, (extra, r.text)
    assert tc.app.state.svc.store.counts()["sap_sessions"] == 0
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc)
    with pytest.raises(PrivacyNotConfiguredError, match="eta"):
        c.sap_customer(SplitConfig(split_layer=1), 2)


def test_bottom_download_is_hashed_cached_and_holds_no_top(sap_service, tmp_path):
    tc, (key, _), bb = sap_service
    seen = []
    tc.event_hooks["response"] = [lambda r: seen.append(r.status_code)]
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc)
    t1 = c.sap_bottom(1, cache_dir=tmp_path)
    assert {k.split(".")[0] for k in t1} == {"embed", "blocks"}
    assert {k.split(".")[2] for k in t1 if k.startswith("blocks.")} == {"0"}  # block 0 only
    t2 = c.sap_bottom(1, cache_dir=tmp_path)
    assert seen == [200, 304] and all(torch.equal(t1[k], t2[k]) for k in t1)
    cached = next((tmp_path / "sap-bottoms").iterdir())
    cached.write_bytes(cached.read_bytes()[:-4] + b"\0\0\0\0")  # damaged cache: re-downloaded
    t3 = c.sap_bottom(1, cache_dir=tmp_path)
    assert seen[-1] == 200 and all(torch.equal(t1[k], t3[k]) for k in t1)
    r = tc.get("/v1/sap/bottom", params={"backbone": "tiny", "split_layer": 0},
               headers={"Authorization": f"Bearer {key}"})
    assert r.headers["x-content-sha256"] == __import__("hashlib").sha256(r.content).hexdigest()
    assert tc.get("/v1/sap/bottom", params={"backbone": "tiny"},
                  headers={"Authorization": ""}).status_code == 401


def test_end_to_end_over_uvicorn_survives_a_crash_mid_step(server, tmp_path):
    """`rapt serve` in a subprocess; the server is killed between a forward and its backward
    and started again: the session resumes from its files (the pending forward is sent again),
    every step is applied once, and losses and predictions equal the in-process run."""
    srv, key, folder = server  # conftest's: `rapt serve` on a saved tiny BERT
    c = RaptClient(srv.url, key, backbone=str(folder))
    sc = split_config(eta=60.0, epochs=12)
    rows = encode_texts(c.backbone.tokenizer, TEXTS, sc.max_length)
    customer = c.sap_customer(sc, 2, cache_dir=tmp_path / "cache")
    customer.load(rows, LABELS)
    sid = c.sap_session(sc, len(rows))
    provider = c.sap_provider(sid, customer)
    provider.upload_release()
    forward = provider.forward

    def crash_after_forward(acts, train=True):
        out = forward(acts, train=train)
        if train and acts.step == 6:
            srv.proc.kill()  # no shutdown: only what was saved survives
            srv.proc.wait(10)
            srv.start()
            c.http.base_url = httpx.URL(srv.url)
        return out

    provider.forward = crash_after_forward
    hist = train_split(customer, provider)
    assert provider.resent_forwards == 1
    st = c.sap_status(sid)
    assert st["steps_done"] == st["total_steps"] == len(hist) == 24
    assert sum(h["loss"] for h in hist[-4:]) < 0.8 * sum(h["loss"] for h in hist[:4])
    probs = predict_split(customer, provider, rows)
    ref_hist, ref_probs = local_run(service_bert(), sc)
    assert torch.allclose(torch.tensor([h["loss"] for h in hist]),
                          torch.tensor([h["loss"] for h in ref_hist]), atol=1e-6)
    assert torch.allclose(probs, ref_probs, atol=1e-5)


def test_cli_sap_tune_and_predict_against_the_service(sap_service, tmp_path, monkeypatch):
    """`rapt sap tune --url` trains through the service and keeps only the customer's half;
    `rapt sap predict` on that folder asks the session; errors are one line naming the flag."""
    from typer.testing import CliRunner

    import rapt.client.client as client_mod
    from rapt.cli import app

    tc, (key, _), bb = sap_service
    folder = save_backbone(bb, tmp_path / "bb")
    init = client_mod.RaptClient.__init__
    monkeypatch.setattr(client_mod.RaptClient, "__init__",  # CLI -> the in-process service
                        lambda self, *a, **kw: init(self, *a, **{**kw, "http": tc}))
    monkeypatch.setenv("RAPT_CACHE", str(tmp_path / "cache"))
    csv = tmp_path / "reviews.csv"
    csv.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in zip(TEXTS, LABELS,
                                                                         strict=True)))
    out = tmp_path / "sap"
    cli = CliRunner(env={"RAPT_API_KEY": key})
    common = ["sap", "tune", str(csv), "--backbone", str(folder), "--remote-backbone", "tiny",
              "--split-layer", "1", "--epochs", "2", "--batch-size", "4", "--out", str(out),
              "--url", "http://127.0.0.1:1"]
    r = cli.invoke(app, common)  # no level: the release leaves privatized at the default one
    assert r.exit_code == 0 and "privacy: the default level" in r.stderr, r.output
    assert json.loads((out / "sap.json").read_text())["config"]["eta"] is not None
    r = cli.invoke(app, [*common, "--eta", "30", "--noise-seed", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "sap.json").read_text())
    assert doc["remote"]["backbone"] == "tiny" and doc["steps"] == 4
    assert not (out / "provider.safetensors").exists() and key not in (out / "sap.json") \
        .read_text()
    st = tc.get(f"/v1/sap/sessions/{doc['remote']['session']}").json()
    assert st["steps_done"] == 4
    r = cli.invoke(app, ["sap", "predict", str(out), str(csv)])
    assert r.exit_code == 0, r.output
    assert "8 predictions:" in r.output and "accuracy" in r.output and "on 8 examples" in r.output
    tc.delete(f"/v1/sap/sessions/{doc['remote']['session']}")
    r = cli.invoke(app, ["sap", "predict", str(out), str(csv)])
    assert r.exit_code == 2 and "no sap session" in r.output and "Traceback" not in r.output


def test_sessions_evicted_from_memory_resume_exactly(sap_service, tmp_path):
    """With room for one live session, two trainings alternate step by step: each request
    reloads its session from its files (the other's pending forward is dropped and sent
    again), and both still equal the in-process runs."""
    tc, (key, _), bb = sap_service
    tc.app.state.svc.sap.max_live = 1
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc)
    rows = encode_texts(bb.tokenizer, TEXTS, 32)
    runs = []
    for sc in (split_config(epochs=1), split_config(epochs=1, unfreeze_bottom=True, seed=1)):
        customer = c.sap_customer(sc, 2, cache_dir=tmp_path)
        customer.load(rows, LABELS)
        provider = c.sap_provider(c.sap_session(sc, len(rows)), customer)
        if not sc.unfreeze_bottom:
            provider.upload_release()
        runs.append((sc, customer, provider, []))
    a, b = runs[0][2], runs[1][2]
    forward, probe = a.forward, Activations(0, torch.randn(2, 5, 32), ones(2, 5))

    def forward_then_touch_b(acts, train=True):
        out = forward(acts, train=train)
        b.forward(probe, train=False)  # loads B, which evicts A with its pending forward
        return out

    a.forward = forward_then_touch_b
    for stop in range(1, 3):
        for _, customer, provider, hist in runs:
            hist += train_split(customer, provider, should_stop=lambda p=provider, s=stop:
                                p.step >= s)
    for sc, customer, provider, hist in runs:
        ref_hist, ref_probs = local_run(bb, sc)
        assert [h["loss"] for h in hist] == [h["loss"] for h in ref_hist]
        assert torch.allclose(predict_split(customer, provider, rows), ref_probs, atol=1e-6)
    assert len(tc.app.state.svc.sap._live) == 1 and a.resent_forwards == 2


def test_session_state_is_the_loops_and_a_flat_one_from_before_still_resumes(sap_service,
                                                                             tmp_path):
    """The session's state.pt holds the training loop's TrainState (no random generator: the
    process serves other keys too). A session whose state.pt is in the flat layout that
    servers wrote before (rewritten so here, mid-training) is reloaded from it after an
    eviction and ends equal to the in-process run."""
    from rapt.split.provider import STATE_KIND
    from rapt.training.loop import STATE_FORMAT

    tc, (key, _), bb = sap_service
    sc = split_config(unfreeze_bottom=True)
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc)
    rows = encode_texts(bb.tokenizer, TEXTS, sc.max_length)
    customer = c.sap_customer(sc, 2, cache_dir=tmp_path)
    customer.load(rows, LABELS)
    sid = c.sap_session(sc, len(rows))
    provider = c.sap_provider(sid, customer)
    hist = train_split(customer, provider, should_stop=lambda: provider.step >= 3)
    path = Path(str(tmp_path / "svc.db") + ".files") / "sap" / sid / "state.pt"
    saved = torch.load(path, weights_only=True)
    st = saved["provider"]
    assert (st["format"], st["kind"], st["step"], st["rng"]) == (STATE_FORMAT, STATE_KIND, 3,
                                                                  None)
    comps = st["components"]
    saved["provider"] = {"kind": STATE_KIND, "method": st["method"],
                         "split_layer": st["meta"]["split_layer"],
                         "total_steps": st["meta"]["total_steps"], "step": st["step"],
                         "last_step": comps["step_ids"]["last_step"], "top": comps["top"],
                         "optimizer": comps["optimizer"], "scheduler": comps["scheduler"]}
    torch.save(saved, path)
    tc.app.state.svc.sap._live.clear()  # the next request reloads the session from its files
    hist += train_split(customer, provider)
    ref_hist, ref_probs = local_run(bb, sc)
    assert [h["loss"] for h in hist] == [h["loss"] for h in ref_hist]
    assert torch.allclose(predict_split(customer, provider, rows), ref_probs, atol=1e-6)
    assert c.sap_status(sid)["steps_done"] == 6


def test_lost_replies_are_retried_and_applied_once(sap_service, tmp_path, monkeypatch):
    """The first backward and the forward after it reach the server, but their replies are
    lost (a dropped connection): the client sends the same step again, the server answers the
    backward from its saved reply and recomputes the forward, and every step is applied once."""
    from rapt.client.client import ServiceError
    from rapt.http import HttpSession

    tc, (key, _), bb = sap_service
    request, lost = HttpSession.request, []

    def lose_replies(self, method, path, **kw):
        r = request(self, method, path, **kw)  # the server acted
        what = path.rsplit("/", 1)[-1]
        if what == ("forward" if lost else "backward") and len(lost) < 2:
            lost.append(what)
            raise ServiceError(0, "unreachable", "connection dropped")
        return r

    monkeypatch.setattr(HttpSession, "request", lose_replies)
    sc = split_config(unfreeze_bottom=True)
    c, sid, hist, probs = remote_run(tc, key, bb, tmp_path, sc)
    assert lost == ["backward", "forward"]
    ref_hist, ref_probs = local_run(bb, sc)
    assert [h["loss"] for h in hist] == [h["loss"] for h in ref_hist]
    assert torch.allclose(probs, ref_probs, atol=1e-6)
    assert c.sap_status(sid)["steps_done"] == 6


def test_overflowing_gradient_is_refused_and_a_correct_retry_applies_once(sap_service, tmp_path):
    """Issue 29 item 1: with an unfrozen bottom, ∂l/∂g = 3e38 overflows on the way back. It
    is refused (422) before anything changes: the same bad body is refused again (never
    'replayed'), the correct gradient then applies step 0, the next forward is finite, and a
    restarted service reads last_step 0 from the files."""
    tc, (key, _), bb = sap_service
    me = {"Authorization": f"Bearer {key}"}
    state = Path(str(tmp_path / "svc.db") + ".files") / "sap"
    sid = sap_session(tc, key, unfreeze_bottom=True)
    acts = Activations(0, torch.randn(4, 6, 32), ones(4, 6))
    assert sap_post(tc, sid, "forward", acts, me).status_code == 200
    for _ in range(2):
        r = sap_post(tc, sid, "backward", OutputGrad(0, torch.full((4, 32), 3e38)), me)
        assert r.status_code == 422 and "NaN or infinite" in r.json()["detail"], r.text
        assert tc.get(f"/v1/sap/sessions/{sid}", headers=me).json()["last_step"] == -1
        assert not (state / sid / "state.pt").exists()
    r = sap_post(tc, sid, "backward", OutputGrad(0, torch.randn(4, 32)), me)
    assert r.status_code == 200 and r.headers["x-rapt-replayed"] == "0", r.text
    assert wire.decode(r.content, wire.MESSAGES["ActivationGrad"], max_bytes=1 << 20).step == 0
    r = sap_post(tc, sid, "forward", Activations(1, torch.randn(4, 6, 32), ones(4, 6)), me)
    assert r.status_code == 200, r.text
    out = wire.decode(r.content, wire.MESSAGES["TopOutput"], max_bytes=1 << 20)
    assert bool(torch.isfinite(out.output).all())
    assert tc.get(f"/v1/sap/sessions/{sid}", headers=me).json()["last_step"] == 0
    config = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"],
                           limits=Limits(max_seq_len=64), progress_interval_s=0.0)
    with TestClient(create_app(config, backbones={"tiny": bb})) as again:  # a restart
        assert again.get(f"/v1/sap/sessions/{sid}", headers=me).json()["last_step"] == 0
        assert sap_post(again, sid, "forward", Activations(1, torch.randn(4, 6, 32), ones(4, 6)),
                     me).status_code == 200
        r = sap_post(again, sid, "backward", OutputGrad(1, torch.randn(4, 32)), me)
        assert r.status_code == 200, r.text
        assert again.get(f"/v1/sap/sessions/{sid}", headers=me).json()["last_step"] == 1


def test_unsaved_step_is_never_reported_applied(sap_service, tmp_path, monkeypatch):
    """A step whose state could not be saved answers an error, and the session (reloaded
    from its files) still says last_step -1: a retry of that backward is not 'replayed'."""
    import rapt.service.split_sessions as ss

    tc, (key, _), bb = sap_service
    tc_raw = TestClient(tc.app, raise_server_exceptions=False)
    me = {"Authorization": f"Bearer {key}"}
    sid = sap_session(tc, key, unfreeze_bottom=True)
    assert sap_post(tc, sid, "forward", Activations(0, torch.randn(4, 6, 32), ones(4, 6)),
                 me).status_code == 200
    real = ss._atomic_write

    def disk_full(path, write):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ss, "_atomic_write", disk_full)
    grad = OutputGrad(0, torch.randn(4, 32))
    assert sap_post(tc_raw, sid, "backward", grad, me).status_code == 500
    monkeypatch.setattr(ss, "_atomic_write", real)
    assert tc.get(f"/v1/sap/sessions/{sid}", headers=me).json()["last_step"] == -1
    r = sap_post(tc, sid, "backward", grad, me)
    assert r.status_code == 409 and r.json()["error"] == "no_forward", r.text
    assert r.headers["x-rapt-last-step"] == "-1"


def test_backward_under_another_key_is_a_missing_session(sap_service):
    """Issue 29 item 11c: a well-formed OutputGrad for the pending step, sent with another
    key, is 404 and applies nothing; the owner's own backward then applies step 0 once."""
    tc, (key, bob), _ = sap_service
    me, other = {"Authorization": f"Bearer {key}"}, {"Authorization": f"Bearer {bob}"}
    sid = sap_session(tc, key, unfreeze_bottom=True)
    assert sap_post(tc, sid, "forward", Activations(0, torch.randn(4, 6, 32), ones(4, 6)),
                 me).status_code == 200
    r = sap_post(tc, sid, "backward", OutputGrad(0, torch.randn(4, 32)), other)
    assert r.status_code == 404 and r.json()["error"] == "not_found", r.text
    assert tc.get(f"/v1/sap/sessions/{sid}", headers=me).json()["last_step"] == -1
    r = sap_post(tc, sid, "backward", OutputGrad(0, torch.randn(4, 32)), me)
    assert r.status_code == 200 and r.headers["x-rapt-replayed"] == "0"


@pytest.mark.parametrize("field,value", [("seed", 2**64), ("seed", 2**31), ("seed", -1),
                                         ("n_examples", 2**64), ("batch_size", 2**64),
                                         ("max_length", 2**64), ("split_layer", 2**64),
                                         ("epochs", 2**64), ("lora_r", 2**64)])
def test_session_integers_are_bounded_at_the_door(sap_service, field, value):
    """Issue 29 item 4: a seed of 2^64 was stored (201), then every forward and DELETE was a
    500. Every integer field is bounded by the schema: 422 naming it, nothing stored."""
    tc, (key, _), _ = sap_service
    r = tc.post("/v1/sap/sessions", json={"backbone": "tiny", "n_examples": 8, field: value},
                headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 422 and field in r.text, r.text
    assert tc.app.state.svc.store.counts()["sap_sessions"] == 0


def test_delete_works_whatever_the_session_state(sap_service, tmp_path):
    """A session whose files no longer load (here a damaged state.pt) is deleted all the
    same (204, files gone, out of the quota); so is one in memory mid-training."""
    tc, (key, _), _ = sap_service
    me = {"Authorization": f"Bearer {key}"}
    files = Path(str(tmp_path / "svc.db") + ".files") / "sap"
    broken, live = sap_session(tc, key, unfreeze_bottom=True), sap_session(tc, key)
    (files / broken / "state.pt").write_bytes(b"not a torch file")
    assert sap_post(tc, live, "release", Release(0, torch.randn(24, 32), torch.full((4,), 6)),
                 me).status_code == 200
    for sid in (broken, live):
        assert tc.delete(f"/v1/sap/sessions/{sid}", headers=me).status_code == 204
        assert not (files / sid).exists()
        assert tc.get(f"/v1/sap/sessions/{sid}", headers=me).status_code == 404
        assert tc.delete(f"/v1/sap/sessions/{sid}", headers=me).status_code == 404
    assert tc.app.state.svc.store.counts()["sap_sessions"] == 0
    assert not tc.app.state.svc.sap._live
