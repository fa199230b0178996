"""The provider's channel model in the service (issue 27 item 5): loaded per backbone at
start-up (refused if it is not one, or built on another backbone), applied through
Customization.channel in jobs on privatized rows and at predict, named in the job, prompt,
predict and backbone responses, and predict refuses a prompt whose channel the server no
longer holds. The channel model only ever reads the uploaded (privatized) ids."""

from __future__ import annotations

import random
import time

import pytest
import torch
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from rapt.channel.denoiser import Denoiser, DenoiserConfig
from rapt.channel.model import channel_fingerprint
from rapt.config import tune_config
from rapt.pipeline import Customization, Encoding
from rapt.service import Limits, ServiceConfig, auth, create_app
from rapt.service.channels import ChannelError
from rapt.service.store import Store
from rapt.tuning.tune import TunedPrompt

JOB = {"method": "prompt", "num_virtual_tokens": 2, "epochs": 1, "batch_size": 4, "lr": 0.05,
       "max_length": 32, "head": "linear", "seed": 3}


def save_channel(bb, folder, *, backbone="tiny", bias=0.0):
    """An untrained channel model without the keep bonus: its argmax replaces most tokens, so
    rows read back through it visibly differ from the rows as uploaded."""
    den = Denoiser(bb, DenoiserConfig(max_length=32, keep_bonus=0.0, seed=1),
                   meta={"backbone": backbone, "hidden_size": bb.hidden_size})
    with torch.no_grad():
        den.bias += bias
    den.save(folder)
    return folder


def app_for(tmp_path, bb, channels: dict | None = None, runner=None):
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"], limits=Limits(),
                        progress_interval_s=0.0, channels=channels or {})
    return create_app(cfg, backbones={"tiny": bb}, runner=runner)


def add_key(tmp_path) -> dict:
    with Store(tmp_path / "svc.db") as store:
        key = auth.new_key()
        store.add_key("alice", auth.hash_key(key))
    return {"Authorization": f"Bearer {key}"}


def dataset(tok, n=8, plain=True, mechanism="dchi-text2text", seed=0) -> dict:
    """Rows laid out as a privatized upload: [CLS] k x [SEP] with two plain tokens k."""
    rng = random.Random(seed)
    words = [i for i in range(len(tok)) if i not in tok.all_special_ids]
    k = words[:2] if plain else []
    rows = [[tok.cls_token_id, *k, *rng.sample(words, rng.randint(3, 8)), tok.sep_token_id]
            for _ in range(n)]
    privacy = ({"mechanism": mechanism, "eta": 20.0} if mechanism != "none"
               else {"mechanism": "none"})
    return {"backbone": "tiny", "input_ids": rows, "labels": [i % 2 for i in range(n)],
            "num_labels": 2, "privacy": privacy, "plain_ids": k or None}


def wait_job(c, h, jid, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        st = c.get(f"/v1/jobs/{jid}", headers=h).json()
        if st["state"] in ("succeeded", "failed", "cancelled"):
            return st
        time.sleep(0.05)
    raise AssertionError(f"job {jid} stuck: {st}")


def tune(c, h, body, **job) -> dict:
    r = c.post("/v1/datasets", json=body, headers=h)
    assert r.status_code == 201, r.text
    r = c.post("/v1/jobs", json={"dataset_id": r.json()["id"], **JOB, **job}, headers=h)
    assert r.status_code == 202, r.text
    return {"created": r.json(), "done": wait_job(c, h, r.json()["id"])}


def test_jobs_and_predict_read_privatized_rows_back_through_the_channel(tmp_path, tiny_bert):
    tok = tiny_bert.tokenizer
    folder = save_channel(tiny_bert, tmp_path / "channel")
    h = add_key(tmp_path)
    app = app_for(tmp_path, tiny_bert, {"tiny": str(folder)})
    with TestClient(app) as c:
        svc = app.state.svc
        den = svc.channels["tiny"].model
        fp = channel_fingerprint(den)
        (bb_info,) = c.get("/v1/backbones").json()
        assert bb_info["channel"]["fingerprint"] == fp
        seen: list[list[int]] = []
        inner = den.denoise
        den.denoise = lambda rows, *a, **k: seen.extend(map(list, rows)) or inner(rows, *a, **k)

        body = dataset(tok)
        on = tune(c, h, body)
        assert on["created"]["channel"]["fingerprint"] == fp  # said when the job is created
        st = on["done"]
        assert st["state"] == "succeeded", st
        assert st["channel"]["fingerprint"] == fp
        assert st["channel"]["provenance"]["backbone"] == "tiny"
        assert "post-processing" in st["channel"]["note"].lower()
        # The channel model read the uploaded rows' text positions, nothing else: no
        # specials, no plain tokens, no originals (the server never has any).
        assert seen == [r[3:-1] for r in body["input_ids"]]
        prompt = c.get(f"/v1/prompts/{st['prompt_id']}", headers=h).json()
        assert prompt["channel"]["fingerprint"] == fp
        row = svc.store.get_prompt(st["prompt_id"], prompt_owner(svc, st["prompt_id"]))
        tuned = TunedPrompt.load(row["path"])
        assert tuned.meta["channel"]["fingerprint"] == fp

        # The job tuned exactly what a local Customization with the same channel tunes.
        params = svc.store.get_job(st["id"], None)["params"]
        local = Customization(tiny_bert, Encoding(32, body["plain_ids"]), tune_config(params),
                              channel=den)
        ref = local.tune(body["input_ids"], body["labels"], 2)
        for name, t in ref.tensors.items():
            assert torch.allclose(tuned.tensors[name], t, atol=1e-6), name

        off = tune(c, h, dataset(tok, seed=1), use_channel=False)["done"]
        assert off["state"] == "succeeded" and off["channel"] is None
        assert c.get(f"/v1/prompts/{off['prompt_id']}", headers=h).json()["channel"] is None

        queries = dataset(tok, n=5, seed=7)["input_ids"]
        seen.clear()
        r = c.post("/v1/predict", json={"prompt_id": st["prompt_id"], "input_ids": queries},
                   headers=h)
        assert r.status_code == 200, r.text
        assert r.json()["channel"]["fingerprint"] == fp
        assert seen == [q[3:-1] for q in queries]
        got = torch.tensor(r.json()["probabilities"])
        with_channel = Customization(tiny_bert, Encoding.of(tuned), channel=den,
                                     artifact=tuned).predict_proba(queries)
        as_uploaded = tuned.predict_proba(tiny_bert, queries)
        assert torch.allclose(got, with_channel, atol=1e-5)
        assert not torch.allclose(got, as_uploaded, atol=1e-3)  # the channel changed the rows

        seen.clear()
        r = c.post("/v1/predict", json={"prompt_id": off["prompt_id"], "input_ids": queries},
                   headers=h)
        assert r.status_code == 200 and r.json()["channel"] is None and seen == []
        plain = TunedPrompt.load(svc.store.get_prompt(
            off["prompt_id"], prompt_owner(svc, off["prompt_id"]))["path"])
        assert torch.allclose(torch.tensor(r.json()["probabilities"]),
                              plain.predict_proba(tiny_bert, queries), atol=1e-5)


def prompt_owner(svc, pid: str) -> str:
    with svc.store._tx() as conn:  # the store's lock: its one SQLite connection is shared
        return conn.exec_driver_sql("SELECT owner FROM prompts WHERE id = ?", (pid,)).scalar()


def test_use_channel_and_unprivatized_data(tmp_path, tiny_bert):
    from _service import FakeRunner

    tok = tiny_bert.tokenizer
    h = add_key(tmp_path)
    with TestClient(app_for(tmp_path, tiny_bert, runner=FakeRunner())) as c:  # no channel
        r = c.post("/v1/datasets", json=dataset(tok), headers=h)
        r = c.post("/v1/jobs", json={"dataset_id": r.json()["id"], "use_channel": True},
                   headers=h)
        assert r.status_code == 422 and r.json()["error"] == "channel_unavailable", r.text
        assert "holds no channel model for backbone 'tiny'" in r.json()["detail"]
        assert c.get("/v1/backbones").json()[0]["channel"] is None
    folder = save_channel(tiny_bert, tmp_path / "channel")
    with TestClient(app_for(tmp_path, tiny_bert, {"tiny": str(folder)},
                            runner=FakeRunner())) as c:
        clean = c.post("/v1/datasets", json=dataset(tok, mechanism="none"), headers=h).json()
        r = c.post("/v1/jobs", json={"dataset_id": clean["id"]}, headers=h)
        assert r.status_code == 202 and r.json()["channel"] is None  # nothing to read back
        r = c.post("/v1/jobs", json={"dataset_id": clean["id"], "use_channel": True}, headers=h)
        assert r.status_code == 422 and "uploaded unprivatized" in r.json()["detail"], r.text
        r = c.post("/v1/jobs", json={"dataset_id": clean["id"], "use_channel": "yes"},
                   headers=h)
        assert r.status_code == 422  # strict: a bool


def test_predict_refuses_a_prompt_whose_channel_is_gone(tmp_path, tiny_bert):
    tok = tiny_bert.tokenizer
    folder = save_channel(tiny_bert, tmp_path / "channel")
    other = save_channel(tiny_bert, tmp_path / "other", bias=1.0)
    h = add_key(tmp_path)
    with TestClient(app_for(tmp_path, tiny_bert, {"tiny": str(folder)})) as c:
        with_ch = tune(c, h, dataset(tok))["done"]
        without = tune(c, h, dataset(tok, seed=1), use_channel=False)["done"]
        ds_id = with_ch["dataset_id"]
        fp = with_ch["channel"]["fingerprint"]
    queries = {"input_ids": dataset(tok, n=2, seed=5)["input_ids"]}
    for channels in ({}, {"tiny": str(other)}):
        app = app_for(tmp_path, tiny_bert, channels)
        with TestClient(app) as c:
            r = c.post("/v1/predict", json={"prompt_id": with_ch["prompt_id"], **queries},
                       headers=h)
            assert r.status_code == 409 and r.json()["error"] == "channel_unavailable", r.text
            d = r.json()["detail"]
            assert fp[:12] in d and "--channel tiny=FOLDER" in d
            assert ("holds none" in d) == (not channels)
            r = c.post("/v1/predict", json={"prompt_id": without["prompt_id"], **queries},
                       headers=h)
            assert r.status_code == 200 and r.json()["channel"] is None, r.text
            # A job recorded with that channel (queued before the restart) fails, saying why.
            svc = app.state.svc
            params = svc.store.get_job(with_ch["id"], None)["params"]
            jid = svc.store.create_job(prompt_owner(svc, with_ch["prompt_id"]), ds_id, "tiny",
                                       params, max_queued=8, max_queued_per_key=8)
            svc.jobs.submit(jid)
            st = wait_job(c, h, jid)
            assert st["state"] == "failed" and fp[:12] in st["error"], st
            assert "does not hold" in st["error"]


def test_start_up_refuses_a_bad_channel_folder(tmp_path, tiny_bert):
    (tmp_path / "empty").mkdir()
    cases = [({"tiny": str(tmp_path / "empty")}, "not a channel model folder"),
             ({"tiny": str(save_channel(tiny_bert, tmp_path / "o", backbone="other"))},
              "was built on backbone 'other', not on 'tiny'"),
             ({"big": str(save_channel(tiny_bert, tmp_path / "b", backbone="big"))},
              "backbone 'big' is not loaded")]
    for channels, msg in cases:
        with pytest.raises(ChannelError, match=msg), TestClient(
                app_for(tmp_path, tiny_bert, channels)):
            pass
    # A folder whose shapes do not fit the backbone: named, refused.
    from transformers import BertConfig, BertModel

    from rapt.models import from_model

    cfg = BertConfig(vocab_size=len(tiny_bert.tokenizer), hidden_size=16, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    narrow = from_model(BertModel(cfg).eval(), tiny_bert.tokenizer, name="tiny")
    bad = save_channel(narrow, tmp_path / "narrow")
    with pytest.raises(ChannelError, match="narrow"), TestClient(
            app_for(tmp_path, tiny_bert, {"tiny": str(bad)})):
        pass


def test_serve_cli_checks_channel_options(tmp_path, tiny_bert, monkeypatch):
    import uvicorn

    from rapt.cli import app

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(app))
    good = save_channel(tiny_bert, tmp_path / "channel")
    wrong = save_channel(tiny_bert, tmp_path / "wrong", backbone="minilm")
    base = ["serve", "--db", str(tmp_path / "svc.db"), "--backbone", "tiny"]
    runner = CliRunner()
    r = runner.invoke(app, [*base, "--channel", f"tiny={good}"])
    assert r.exit_code == 0 and f"channel model for tiny: {good}" in r.output, r.output
    for argv, msg in [(["--channel", "tiny"], "give BACKBONE=FOLDER"),
                      (["--channel", f"tiny={good}", "--channel", f"tiny={good}"], "given twice"),
                      (["--channel", f"other={good}"], "add --backbone other"),
                      (["--channel", f"tiny={tmp_path / 'none'}"], "not a channel model folder"),
                      (["--channel", f"tiny={wrong}"], "built on backbone 'minilm'")]:
        r = runner.invoke(app, [*base, *argv])
        assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, (argv,
                                                                                     r.output)
    assert len(calls) == 1


def test_ray_actors_load_the_channel_and_apply_it(tmp_path, tiny_bert, ray_local):
    """`--jobs ray`: each actor loads the channel model from its folder on its own backbone;
    the job it runs tunes exactly what a local Customization with that channel tunes."""
    tok = tiny_bert.tokenizer
    folder = save_channel(tiny_bert, tmp_path / "channel")
    h = add_key(tmp_path)
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"], progress_interval_s=0.0,
                        jobs="ray", ray_actors=1, ray_actor_options={"num_cpus": 0.5},
                        channels={"tiny": str(folder)})
    app = create_app(cfg, backbones={"tiny": tiny_bert})
    body = dataset(tok)
    with TestClient(app) as c:
        svc = app.state.svc
        st = tune(c, h, body)["done"]
        assert st["state"] == "succeeded", st
        den = svc.channels["tiny"].model
        assert st["channel"]["fingerprint"] == channel_fingerprint(den)
        tuned = TunedPrompt.load(svc.store.get_prompt(
            st["prompt_id"], prompt_owner(svc, st["prompt_id"]))["path"])
        params = svc.store.get_job(st["id"], None)["params"]
        ref = Customization(tiny_bert, Encoding(32, body["plain_ids"]), tune_config(params),
                            channel=den).tune(body["input_ids"], body["labels"], 2)
        for name, t in ref.tensors.items():
            assert torch.allclose(tuned.tensors[name], t, atol=1e-6), name


def test_a_channel_adapter_tunes_and_predicts_on_the_adapted_backbone(tmp_path, tiny_bert):
    """With a channel adapter the rows stay as uploaded; the job tunes on, and predict runs on,
    the backbone with the adapter merged in (not the shared micro-batched one)."""
    from rapt.channel.adapter import ChannelAdapterConfig, train_channel_adapter

    tok = tiny_bert.tokenizer
    body = dataset(tok)
    text = [r[3:-1] for r in body["input_ids"]]
    shuffled = [list(reversed(r)) for r in text]  # any aligned pairs: a LoRA that moved
    ad = train_channel_adapter(tiny_bert, text * 4, shuffled * 4,
                               ChannelAdapterConfig(lora_r=4, lr=5e-2, batch_size=8,
                                                    max_length=16))
    ad.meta["backbone"] = "tiny"  # the service's name for tiny_bert
    folder = ad.save(tmp_path / "adapter")
    h = add_key(tmp_path)
    app = app_for(tmp_path, tiny_bert, {"tiny": str(folder)})
    with TestClient(app) as c:
        svc = app.state.svc
        ch = svc.channels["tiny"]
        assert ch.model.reader(tiny_bert) is not tiny_bert  # the adapted copy reads
        assert ch.fingerprint == channel_fingerprint(ad)
        st = tune(c, h, body)["done"]
        assert st["state"] == "succeeded", st
        assert st["channel"]["fingerprint"] == ch.fingerprint
        tuned = TunedPrompt.load(svc.store.get_prompt(
            st["prompt_id"], prompt_owner(svc, st["prompt_id"]))["path"])
        adapted = ch.model.adapted_backbone(tiny_bert)
        params = svc.store.get_job(st["id"], None)["params"]
        ref = Customization(tiny_bert, Encoding(32, body["plain_ids"]), tune_config(params),
                            channel=ch.model).tune(body["input_ids"], body["labels"], 2)
        for name, t in ref.tensors.items():
            assert torch.allclose(tuned.tensors[name], t, atol=1e-6), name
        queries = dataset(tok, n=5, seed=7)["input_ids"]
        r = c.post("/v1/predict", json={"prompt_id": st["prompt_id"], "input_ids": queries},
                   headers=h)
        assert r.status_code == 200, r.text
        assert r.json()["channel"]["fingerprint"] == ch.fingerprint
        got = torch.tensor(r.json()["probabilities"])
        assert torch.allclose(got, tuned.predict_proba(adapted, queries), atol=1e-5)
        assert not torch.allclose(got, tuned.predict_proba(tiny_bert, queries), atol=1e-4)
