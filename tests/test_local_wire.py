"""The user's side on the wire: with the local model on, `rapt client tune --wait` and
`rapt client predict` send exactly what they send with --no-local, plus one predict call of the
held-out rows, privatized as a query is. Nothing of the local model (its vocabulary, its
cross-validated accuracy, the fusion weights) and no clean word of the rows leaves."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from _service import ngrams
from _wire import recorded_wire, rows, write


@pytest.fixture()
def wire(tmp_path, monkeypatch):
    with recorded_wire(tmp_path, monkeypatch) as got:
        yield got


def _posts(sent) -> list[tuple[str, str, bytes]]:
    """What carries data: every request with a body (GET polls differ in number only)."""
    return [s for s in sent if s[2]]


def test_local_model_sends_nothing_more_than_plain_predict(wire, tmp_path):
    from typer.testing import CliRunner

    from rapt.artifacts import read_local_model
    from rapt.cli import app
    from rapt.local import holdout_split

    sent, key, folder, bb, seen = wire
    run = CliRunner().invoke
    base = ["--url", "http://testserver", "--key", key]
    data = rows(120, 0)
    # every token noised (--protect all): the n-gram check below holds for uniform noise only
    up = run(app, ["client", "upload", write(tmp_path / "d.csv", data), *base, "--backbone",
                   str(folder), "--eta", "5", "--max-length", "32", "--protect", "all"])
    assert up.exit_code == 0, up.output
    dataset = up.stdout.strip().splitlines()[-1]
    _, held = holdout_split([y for _, y in data], 0)
    assert len(held) == 24 and f"held out: {len(held)} rows" in up.stderr
    uploaded = json.loads(_posts(sent)[-1][2])
    assert len(uploaded["input_ids"]) == len(data) - len(held)  # held-out rows stay here
    tune = ["client", "tune", dataset, *base, "--epochs", "1", "--batch-size", "8", "--wait"]
    queries = write(tmp_path / "q.csv", rows(10, 1))
    runs = {}
    for mode, extra in (("local", ["--local-out", str(tmp_path / "mine")]),
                        ("plain", ["--no-local"])):
        n0 = len(sent)
        t = run(app, [*tune, *extra])
        assert t.exit_code == 0, t.output
        prompt = json.loads(t.stdout[t.stdout.index("{"):])["prompt_id"]
        n1 = len(sent)
        p = run(app, ["client", "predict", prompt, queries, *base, "--backbone", str(folder),
                      "--out", str(tmp_path / f"{mode}.csv"),
                      *(["--local", str(tmp_path / "mine"), "--fused"] if mode == "local"
                        else ["--no-local"])])
        assert p.exit_code == 0, p.output
        runs[mode] = (_posts(sent[n0:n1]), _posts(sent[n1:]), t, p, prompt)
    (l_tune, l_pred, t_local, p_local, prompt), (n_tune, n_pred, _, _, prompt_n) = (
        runs["local"], runs["plain"])
    # tune: the plain run's bodies, plus exactly one predict call of the held-out rows
    extra = [s for s in l_tune if s[1] == "/v1/predict"]
    assert len(extra) == 1 and [s for s in l_tune if s[1] != "/v1/predict"] == n_tune
    body = json.loads(extra[0][2])
    assert set(body) == {"prompt_id", "input_ids"} and body["prompt_id"] == prompt
    assert len(body["input_ids"]) == len(held)
    # the same form as a predict query: the predict body's keys, [CLS] ... [SEP] rows
    plain_query = json.loads(n_pred[0][2])
    assert set(plain_query) == set(body)
    cls, sep = bb.tokenizer.cls_token_id, bb.tokenizer.sep_token_id
    assert all(r[0] == cls and r[-1] == sep for r in body["input_ids"])
    clean = [bb.tokenizer(data[i][0])["input_ids"] for i in held]
    assert [len(r) for r in body["input_ids"]] == [len(r) for r in clean]
    kept = {g for r in clean for g in ngrams(r[1:-1], 3)}
    assert not kept & {g for r in body["input_ids"] for g in ngrams(r[1:-1], 3)}
    # predict: byte for byte what --no-local sends (the prompt id aside)
    assert [(m, u, b.replace(prompt.encode(), prompt_n.encode())) for m, u, b in l_pred] == \
        n_pred
    # nothing of the clean rows or of the local model in any request
    base_model, fusion = read_local_model(tmp_path / "mine")
    blob = b"\n".join(m.encode() + u.encode() + b for m, u, b in sent).decode() + "\n".join(
        seen)
    words = {w for t, _ in data for w in t.split() if len(w) >= 4}
    assert words and not [w for w in words if w in blob]
    vocab = set(base_model.state()[0]["vocabulary"])
    assert {"good", "very good"} & vocab or len(vocab) > 20  # the check below is not vacuous
    release = set(bb.tokenizer.decode(sum(uploaded["input_ids"], [])).split())
    assert not [t for t in vocab - release if len(t) >= 4 and t in blob]
    plain_blob = b"\n".join(b for _, _, b in n_tune + n_pred).decode()
    secrets = [base_model.cv_accuracy, fusion.remote, fusion.local,
               *fusion.accuracy.values()]
    assert not [v for v in secrets if json.dumps(v) not in plain_blob and json.dumps(v) in blob]
    assert '"cv_accuracy"' not in blob and '"fusion"' not in blob
    # what the user sees and keeps
    err = t_local.stderr
    assert "local model: TF-IDF + logistic regression on your 120 clean rows" in err
    assert f"held-out rows ({len(held)}, never trained on): privatized model" in err
    assert "On your data (" in err and "local model saved: " in err
    # later, `client local` for the same prompt: the held-out answer recorded here, nothing sent
    n2 = len(sent)
    loc = CliRunner().invoke(app, ["client", "local", prompt, *base, "--local-out",
                                   str(tmp_path / "mine")])
    assert loc.exit_code == 0, loc.output
    assert not [s for s in sent[n2:] if s[2]] and "held-out rows: nothing sent" in loc.stderr
    # predict without --fused does what the verdict chose: the local model alone here (the
    # words give the class), so no query leaves this machine
    assert read_local_model(tmp_path / "mine")[1].mode == "local"
    n3 = len(sent)
    p = CliRunner().invoke(app, ["client", "predict", prompt, queries, *base, "--backbone",
                                 str(folder), "--local", str(tmp_path / "mine")])
    assert p.exit_code == 0, p.output
    assert not [s for s in sent[n3:] if s[2]]
    assert "the verdict after tuning chose the local model alone" in p.stderr
    for f in (tmp_path / "mine.local.NOT-PRIVATE.json",
              tmp_path / "mine.local.NOT-PRIVATE.safetensors"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert "fused: the privatized model and your local model" in p_local.stderr
    import csv

    written = list(csv.DictReader((tmp_path / "local.csv").open()))
    assert {"p(0)", "p_remote(0)", "p_local(0)", "p_fused(0)"} <= set(written[0])
    plain_rows = list(csv.DictReader((tmp_path / "plain.csv").open()))
    assert "p_local(0)" not in plain_rows[0]


def test_small_upload_local_only_and_a_changed_file(wire, tmp_path):
    """Below about 100 rows nothing is held out: every row is uploaded and the local model is
    fitted by cross-validation only (no fusion). `client predict --local-only` sends no
    query. A file changed since its upload fits no local model, and the tune still succeeds."""
    from typer.testing import CliRunner

    from rapt.cli import app

    sent, key, folder, _, _ = wire
    run = CliRunner().invoke
    base = ["--url", "http://testserver", "--key", key]
    data = rows(40, 2)
    path = write(tmp_path / "small.csv", data)
    up = run(app, ["client", "upload", path, *base, "--backbone", str(folder), "--eta", "5",
                   "--max-length", "32"])
    assert up.exit_code == 0, up.output
    assert len(json.loads(_posts(sent)[-1][2])["input_ids"]) == 40 and "held out" not in \
        up.stderr
    dataset = up.stdout.strip().splitlines()[-1]
    tune = ["client", "tune", dataset, *base, "--epochs", "1", "--batch-size", "8", "--wait"]
    n0 = len(sent)
    t = run(app, tune)
    assert t.exit_code == 0, t.output
    assert not [s for s in sent[n0:] if s[1] == "/v1/predict"]  # nothing held out, no call
    assert "local model: TF-IDF + logistic regression on your 40 clean rows" in t.stderr
    assert "was not scored on held-out rows" in t.stderr and "held-out rows (" not in t.stderr
    prompt = json.loads(t.stdout[t.stdout.index("{"):])["prompt_id"]
    # later, for a prompt tuned without --wait: `client local` does the same
    loc = run(app, ["client", "local", prompt, *base, "--local-out", str(tmp_path / "later")])
    assert loc.exit_code == 0, loc.output
    assert "on your 40 clean rows" in loc.stderr
    assert (tmp_path / "later.local.NOT-PRIVATE.json").is_file()
    n1 = len(sent)
    q = run(app, ["client", "predict", prompt, "good fun film", "awful dull plot", *base,
                  "--backbone", str(folder), "--local-only"])  # the recorded one: "later"
    assert q.exit_code == 0, q.output
    assert not [s for s in sent[n1:] if s[2]]  # no body: no query left this machine
    assert "2 predictions" in q.stdout
    p = run(app, ["client", "predict", prompt, "good fun film", *base, "--backbone",
                  str(folder)])
    assert p.exit_code == 0 and "no fusion weights" in p.stderr, p.output
    # a local model of another prompt (3 labels, this one has 2): refused before any query
    from rapt.artifacts import write_local_model
    from rapt.local import LocalBaseline

    other = LocalBaseline.fit([f"{w} film {i}" for i in range(4) for w in ("good", "bad", "dull")],
                              [0, 1, 2] * 4, 3)
    write_local_model(tmp_path / "other", other)
    n2 = len(sent)
    p = run(app, ["client", "predict", prompt, "good fun film", *base, "--backbone",
                  str(folder), "--local", str(tmp_path / "other")])
    assert p.exit_code == 2 and "has 3 labels" in p.output, p.output
    assert not [s for s in sent[n2:] if s[2]]
    # the file changed after its upload: the rows are not the uploaded ones, no local model
    (tmp_path / "small.csv").write_text((tmp_path / "small.csv").read_text()
                                        .replace("good", "bad"))
    t = run(app, tune)
    assert t.exit_code == 0, t.output
    assert "note: no local model: " in t.stderr and "changed since" in t.stderr
    # --no-local at upload: every row goes up, and tune says there is no local model
    up = run(app, ["client", "upload", write(tmp_path / "big.csv", rows(120, 3)), *base,
                   "--backbone", str(folder), "--eta", "5", "--no-local"])
    assert up.exit_code == 0 and len(json.loads(_posts(sent)[-1][2])["input_ids"]) == 120


def test_the_held_out_rows_go_out_once(tmp_path, monkeypatch):
    """The held-out rows are privatized and sent once: asked again for the same prompt (`client
    local` after `client tune --wait`, another process), the client reads the answer it
    recorded (0600) and sends nothing; for another prompt of the same rows it sends the very
    rows it sent the first time, no fresh privatization."""
    import httpx
    from _service import service_bert

    from rapt.client.client import RaptClient
    from rapt.data import load_dataset
    from rapt.local import holdout_split

    monkeypatch.setenv("RAPT_CACHE", str(tmp_path / "cache"))
    bb = service_bert()
    posts: list[dict] = []

    def answer(req: httpx.Request) -> httpx.Response:
        path = req.url.path
        if path.startswith("/v1/prompts/"):
            return httpx.Response(200, json={
                "id": path.rsplit("/", 1)[1], "job_id": "j1", "num_labels": 2, "plain_ids": None,
                "privacy": {"mechanism": "dchi-text2text", "eta": 5.0}})
        if path == "/v1/jobs/j1":
            return httpx.Response(200, json={"id": "j1", "dataset_id": "d1"})
        assert path == "/v1/predict", path
        body = json.loads(req.content)
        posts.append(body)
        n = len(body["input_ids"])
        return httpx.Response(200, json={"prompt_id": body["prompt_id"], "labels": [1] * n,
                                         "probabilities": [[0.3, 0.7]] * n})

    def client() -> RaptClient:  # a new one each time, as each command starts afresh
        return RaptClient(api_key="k", backbone=bb, remote_backbone="tiny", http=httpx.Client(
            transport=httpx.MockTransport(answer), base_url="http://svc"))

    ds = load_dataset(write(tmp_path / "d.csv", rows(120, 0)))
    held = holdout_split(ds.labels, 0)[1].tolist()
    first = client()
    _, f1, _ = first.user_side("p1", data=ds, held=held)
    assert len(posts) == 1 and len(posts[0]["input_ids"]) == len(held) == 24
    again = client()
    _, f2, _ = again.user_side("p1", data=ds, held=held)
    assert len(posts) == 1  # nothing went out
    assert f2 == f1 and not again.last_heldout["sent"]
    assert first.last_heldout["sent"] and first.last_heldout["fresh"]
    record = Path(again.last_heldout["file"])
    assert record.name.endswith(".NOT-PRIVATE.json")
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    other = client()
    other.user_side("p2", data=ds, held=held)
    assert len(posts) == 2 and posts[1]["prompt_id"] == "p2"
    assert posts[1]["input_ids"] == posts[0]["input_ids"]  # the same release, sent again
    assert other.last_heldout["sent"] and not other.last_heldout["fresh"]
    # at another η they would be a second release: refused, saying why, before anything goes
    from rapt.client.client import ClientError

    at7 = RaptClient(api_key="k", backbone=bb, remote_backbone="tiny", eta=7.0,
                     http=httpx.Client(transport=httpx.MockTransport(answer),
                                       base_url="http://svc"))
    with pytest.raises(ClientError, match=r"sent once at η = 5.0; sending them at η = 7.0 "
                                          r"would release them a second time.*delete"):
        at7.user_side("p3", data=ds, held=held)
    assert len(posts) == 2
