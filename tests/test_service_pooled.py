"""`POST /v1/predict` with ``return_pooled``: the tuned prompt's pooled states of the rows sent
(what a user-side output denoiser reads), to the key that owns the prompt only."""

from __future__ import annotations

from pathlib import Path

import torch
from _service import FakePrompt, add_key, hdr, make_app, upload_body, wait_job
from _tiny import random_prompt
from fastapi.testclient import TestClient


def _prompt(c, key) -> str:
    r = c.post("/v1/datasets", json=upload_body(), headers=hdr(key))
    assert r.status_code == 201, r.text
    r = c.post("/v1/jobs", json={"dataset_id": r.json()["id"]}, headers=hdr(key))
    st = wait_job(c, key, r.json()["id"])
    assert st["state"] == "succeeded", st
    return st["prompt_id"]


def test_the_owner_gets_the_pooled_states_and_no_one_else(tmp_path, tiny_bert):
    overrides: dict = {}
    alice, bob = add_key(tmp_path, "alice"), add_key(tmp_path, "bob")
    app = make_app(tmp_path, tiny_bert, prompt_loader=lambda folder: overrides.get(
        Path(folder).name) or FakePrompt.load(folder))
    with TestClient(app) as c:
        pid = _prompt(c, alice)
        overrides[pid] = prompt = random_prompt(tiny_bert, seed=1, method="lora", lora_r=2)
        rows = upload_body(3)["input_ids"]
        body = {"prompt_id": pid, "input_ids": rows, "return_pooled": True}
        r = c.post("/v1/predict", json=body, headers=hdr(alice))
        assert r.status_code == 200, r.text
        got = torch.tensor(r.json()["pooled"])
        assert got.shape == (3, tiny_bert.hidden_size)
        torch.testing.assert_close(got, prompt.pooled(tiny_bert, rows))
        # the head on those states gives the probabilities returned beside them
        torch.testing.assert_close(prompt.head_proba(tiny_bert, got),
                                   torch.tensor(r.json()["probabilities"]), atol=1e-5,
                                   rtol=1e-4)
        plain = c.post("/v1/predict", json={"prompt_id": pid, "input_ids": rows},
                       headers=hdr(alice))
        assert plain.status_code == 200 and plain.json()["pooled"] is None
        other = c.post("/v1/predict", json=body, headers=hdr(bob))
        assert other.status_code == 404 and other.json()["error"] == "not_found"
        assert "pooled" not in other.text.replace('"error"', "")


def test_a_prompt_without_pooled_states_is_a_clear_422(tmp_path, tiny_bert):
    alice = add_key(tmp_path, "alice")
    with TestClient(make_app(tmp_path, tiny_bert)) as c:  # FakePrompt: probabilities only
        pid = _prompt(c, alice)
        r = c.post("/v1/predict", json={"prompt_id": pid, "input_ids": [[2, 7, 3]],
                                        "return_pooled": True}, headers=hdr(alice))
        assert r.status_code == 422 and r.json()["error"] == "no_pooled_state", r.text


def test_openapi_documents_return_pooled(tmp_path, tiny_bert):
    with TestClient(make_app(tmp_path, tiny_bert)) as c:
        spec = c.get("/openapi.json").json()["components"]["schemas"]
    assert spec["PredictRequest"]["properties"]["return_pooled"]["default"] is False
    assert "pooled" in spec["PredictResponse"]["properties"]
