"""RaptClient against the in-process service (real trainer, tiny backbone): what leaves the
device is privatized, refusal without privatization, env configuration, error mapping."""

from __future__ import annotations

import json
import warnings

import pytest
from _service import LABELS, TEXTS, add_key, folder_service, leaked_ngrams, service_bert, write_csv
from _tiny import save_backbone
from fastapi.testclient import TestClient

from rapt.client.client import ClientError, RaptClient, ServiceError
from rapt.privacy.by_kind import KindPolicy
from rapt.service import Limits, ServiceConfig, create_app

# Every token noised alike: the leak checks below (no n-gram of the private text reaches the
# service) hold for the uniform mechanism; rapt's default sends frequent words in clear by
# design (tests/test_by_kind_cli.py, test_the_default_policy_* here).
UNIFORM = KindPolicy()


@pytest.fixture()
def service(tmp_path):
    bb = service_bert()
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"],
                        limits=Limits(max_seq_len=64), progress_interval_s=0.0)
    app = create_app(cfg, backbones={"tiny": bb})
    key = add_key(tmp_path)
    with TestClient(app) as tc:
        yield tc, key, bb


def capture(tc):
    sent: list[bytes] = []
    tc.event_hooks["request"] = [lambda req: sent.append(req.read())]
    return sent


def run_flow(tc, key, bb, tmp_path, **client_kw):
    client_kw.setdefault("kind_policy", UNIFORM)
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc,
                   plain_tokens=4, **client_kw)
    ds = c.upload(write_csv(tmp_path / "private.csv"), reconstruction=True, max_length=32)
    job = c.tune(ds, epochs=1, batch_size=4, num_virtual_tokens=4, lr=0.05, rec_vocab_size=20)
    st = c.wait(job, progress=False, poll_s=0.05, timeout=60)
    assert st["state"] == "succeeded", st
    pred = c.predict(st["prompt_id"], TEXTS[:4])
    assert len(pred.labels) == 4 and all(abs(sum(p) - 1) < 1e-4 for p in pred.probabilities)
    return c


def test_nothing_private_leaves_the_device(service, tmp_path):
    tc, key, bb = service
    sent = capture(tc)
    c = run_flow(tc, key, bb, tmp_path, eta=5.0, seed=0)
    assert c.last_upload["replacement_probability"] > 0.9
    uploads = [json.loads(b) for b in sent if b and b"input_ids" in b]
    assert len(uploads) == 2  # the training set and one predict request
    blob = b"\n".join(sent).decode()
    for t in TEXTS:
        assert t not in blob
    for w in ("boring", "brilliant", "terrible", "music"):
        assert w not in blob
    assert not leaked_ngrams(sent, bb.tokenizer)
    # Only the mechanism: the measured P and per-kind privacy (statistics of the rows) stay on
    # the device.
    assert uploads[0]["privacy"] == {"mechanism": "dchi-text2text", "eta": 5.0,
                                     "embedding": "tiny", "nn_mode": "fast"}  # the default


def test_leak_detector_catches_unprivatized_uploads(service, tmp_path):
    """The same checks fire when the user opts out: they are not vacuous."""
    tc, key, bb = service
    sent = capture(tc)
    run_flow(tc, key, bb, tmp_path, no_privacy=True)
    assert len(leaked_ngrams(sent, bb.tokenizer)) > 20
    uploads = [json.loads(b) for b in sent if b and b"input_ids" in b]
    assert uploads[0]["privacy"] == {"mechanism": "none"}


def test_privatizes_at_the_default_level_without_configuration(service, tmp_path):
    """No η, no target_p, no no_privacy, no policy: the upload goes out under rapt's default
    policy (noise by kind of token, personal data at η 0, declared) at the η calibrated for
    the protected tokens' default level (the one every command uses), never in clear; a
    prompt tuned on clear text gets its queries privatized at the uniform default level, with
    a warning. Mutations caught: a clear default, another default level or policy."""
    from rapt.client.client import PrivacyWarning
    from rapt.privacy.by_kind import default_policy
    from rapt.privacy.mechanism import calibrate_eta_public
    from rapt.privacy.rule import DEFAULT_PROTECTED_P, DEFAULT_TARGET_P

    tc, key, bb = service
    sent = capture(tc)
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc)
    ds = c.upload(write_csv(tmp_path / "p.csv"), max_length=32)
    want = calibrate_eta_public(bb, DEFAULT_PROTECTED_P)
    assert c.eta == pytest.approx(want) and c.last_privacy["eta_source"] == "default"
    assert c.last_privacy["target_p"] == DEFAULT_PROTECTED_P
    assert c.kind_policy == default_policy() and c.kind_source == "default"
    uploads = [json.loads(b) for b in sent if b and b"input_ids" in b]
    assert uploads[0]["privacy"]["mechanism"] == "dchi-text2text"
    assert uploads[0]["privacy"]["eta"] == pytest.approx(want)
    declared = uploads[0]["privacy"]["by_kind"]
    assert declared["protect"] == "rare" and declared["eta_personal"] == 0.0
    want = calibrate_eta_public(bb, DEFAULT_TARGET_P)
    assert not any(t in b"\n".join(sent).decode() for t in TEXTS)
    # a prompt tuned on clear text: its queries still go out privatized, at the default level
    clear = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc,
                       no_privacy=True)
    with pytest.warns(PrivacyWarning):
        ds = clear.upload(write_csv(tmp_path / "c.csv"), max_length=32)
    st = clear.wait(clear.tune(ds, epochs=1, batch_size=4, num_virtual_tokens=2),
                    progress=False, poll_s=0.05, timeout=60)
    fresh = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc)
    with pytest.warns(PrivacyWarning, match="unprivatized data.*default level"):
        fresh.predict(st["prompt_id"], TEXTS[:2], max_length=32)
    assert fresh.eta == pytest.approx(want) and fresh.last_privacy["eta_source"] == "default"
    with pytest.raises(ServiceError, match="not_found"):
        c.predict("pr_x", ["a query"])
    with pytest.raises(ClientError, match="not both"):
        RaptClient(api_key=key, backbone=bb, http=tc, eta=1.0, no_privacy=True)


def test_env_configuration_and_errors(service, tmp_path, monkeypatch):
    tc, key, bb = service
    monkeypatch.delenv("RAPT_URL", raising=False)
    monkeypatch.delenv("RAPT_API_KEY", raising=False)
    with pytest.raises(ClientError, match="RAPT_URL"):
        RaptClient(api_key=key, backbone=bb)
    with pytest.raises(ClientError, match="RAPT_API_KEY"):
        RaptClient("http://127.0.0.1:9", backbone=bb)
    monkeypatch.setenv("RAPT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("RAPT_API_KEY", "rapt_k")
    c = RaptClient(backbone=bb, eta=1.0)
    assert str(c.http.base_url).startswith("http://127.0.0.1:9")
    assert c.http.headers["Authorization"] == "Bearer rapt_k"
    with pytest.raises(ServiceError, match="unreachable"):
        c.status("job_x")
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc, eta=1.0)
    with pytest.raises(ServiceError) as e:
        c.status("job_nope")
    assert e.value.status == 404 and e.value.error == "not_found"


def test_cli_upload_defaults_to_the_default_level(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rapt.cli import app

    monkeypatch.setenv("RAPT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("RAPT_API_KEY", "rapt_k")
    out = CliRunner().invoke(app, ["client", "upload", str(write_csv(tmp_path / "p.csv"))])
    assert out.exit_code == 2 and "the protected tokens' default level, P ≈ 0.7" in out.output
    assert "noise by kind of token (--protect rare)" in out.output
    assert "personal data (Presidio) η = 0" in out.output
    assert "--no-privacy for clear text" in out.output
    out = CliRunner().invoke(app, ["client", "upload", str(tmp_path / "p.csv"), "--no-privacy",
                                   "--target-p", "0.6"])
    assert out.exit_code == 2 and "not both" in out.output
    monkeypatch.delenv("RAPT_URL")
    out = CliRunner().invoke(app, ["client", "status", "job_x"])
    assert out.exit_code == 2 and "RAPT_URL" in out.output


@pytest.mark.integration
def test_minilm_no_trigram_of_private_text_is_sent(tmp_path):
    """Real vocabulary (30,522 tokens): with η giving P ≈ 0.9, no 3-gram of the private
    texts' token ids reaches the service, in training data or queries."""
    from rapt.models import load_backbone

    bb = load_backbone("minilm")
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["minilm"],
                        progress_interval_s=0.0)
    key = add_key(tmp_path)
    with TestClient(create_app(cfg, backbones={"minilm": bb})) as tc:
        sent = capture(tc)
        c = RaptClient(api_key=key, backbone=bb, remote_backbone="minilm", http=tc, eta=20.0,
                       seed=0, plain_tokens=8, kind_policy=UNIFORM)
        ds = c.upload(write_csv(tmp_path / "private.csv"), reconstruction=True, max_length=48)
        st = c.wait(c.tune(ds, epochs=1, batch_size=8, num_virtual_tokens=4, lr=0.05,
                           rec_vocab_size=200), progress=False, timeout=120)
        assert st["state"] == "succeeded", st
        c.predict(st["prompt_id"], TEXTS)
        # Issue 13: a sentence-pair file too, rows [CLS] k a [SEP] b [SEP], both privatized.
        n_before = len(sent)
        pairs = c.upload(write_pair_csv(tmp_path / "pairs.csv"), reconstruction=True,
                         max_length=64)
        assert all(r.count(bb.tokenizer.sep_token_id) == 2 for r in _sent_rows(sent)[-1])
        st = c.wait(c.tune(pairs, epochs=1, batch_size=8, num_virtual_tokens=4, lr=0.05,
                           rec_vocab_size=200), progress=False, timeout=120)
        assert st["state"] == "succeeded", st
        c.predict(st["prompt_id"], tmp_path / "pairs.csv")
        assert len(sent) > n_before
    assert c.last_upload["replacement_probability"] > 0.8
    assert not leaked_ngrams(sent, bb.tokenizer, n=3)
    blob = b"\n".join(sent).decode()
    assert not any(t in blob for t in TEXTS)


def test_unseeded_client_encodings_differ(service):
    """Two encodings of the same text by one unseeded client, and by two unseeded clients,
    differ. Mutation caught: a client that reuses one noise draw, or a default seed of 0."""
    tc, key, bb = service
    a = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc, eta=3.0)
    b = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc, eta=3.0)
    texts = TEXTS * 3
    first = a.encode(texts)
    assert a.privatizer.seeded is False
    assert first != a.encode(texts)
    assert first != b.encode(texts)


def test_privacy_is_reported_for_every_upload_and_predict(service, tmp_path):
    """Every upload and every predict records P and the inversion success of what was sent,
    and warns when P < min_p; --no-privacy warns before sending, on predict too.

    Mutations caught: measuring only on upload (predict's report would keep the upload's
    'what'), a threshold test inverted (no warning at η = 1e6), no warning on a clear predict."""
    from rapt.client.client import PrivacyWarning

    tc, key, bb = service
    with pytest.warns(PrivacyWarning) as seeded_warning:
        c = run_flow(tc, key, bb, tmp_path, eta=1e6, seed=0)  # η → ∞: nothing is replaced
    messages = [str(w.message) for w in seeded_warning]
    assert any("seeded" in m for m in messages)
    assert sum("weak privacy on this training data" in m for m in messages) == 1
    assert sum("weak privacy on this query set" in m for m in messages) == 1
    r = c.last_privacy
    assert r["what"] == "predict" and r["replacement_probability"] == 0.0
    assert r["inversion_success"] == 1.0 and r["n_tokens"] > 0
    # Strong privacy: no warning, P high and inversion success low, measured on the predict.
    strong = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc, eta=1.0,
                        kind_policy=UNIFORM)
    prompt_id = next(iter(c._prompt_info))

    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyWarning)
        strong.upload(write_csv(tmp_path / "again.csv"), max_length=32)
    assert strong.last_privacy["what"] == "upload"
    assert strong.last_privacy["replacement_probability"] > 0.8
    assert abs(strong.last_privacy["inversion_success"]
               - (1 - strong.last_privacy["replacement_probability"])) < 0.05
    # No privacy: the warning comes before the request leaves.
    sent = capture(tc)
    clear = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc,
                       no_privacy=True)
    seen_before: list[int] = []

    def with_ids() -> int:
        return sum(b"input_ids" in b for b in sent)

    def on_warning(message, category, *args, **kwargs):
        seen_before.append(with_ids())

    with warnings.catch_warnings():
        warnings.simplefilter("always", PrivacyWarning)
        warnings.showwarning = on_warning
        clear.upload(write_csv(tmp_path / "clear.csv"), max_length=32)
        n_upload = with_ids()
        clear.predict(prompt_id, TEXTS[:2])
    assert seen_before[0] == 0 and n_upload == 1
    assert len(seen_before) == 2 and seen_before[1] == n_upload  # predict warned before sending


# --------------------------------------------------------------------------- sentence pairs

PAIR_ROWS = [(TEXTS[i], TEXTS[(i + 3) % len(TEXTS)], LABELS[i]) for i in range(len(TEXTS))]


def write_pair_csv(path):
    """sentence1/sentence2 columns: detected as a pair, no flag needed."""
    path.write_text("sentence1,sentence2,label\n"
                    + "".join(f"{a},{b},{y}\n" for a, b, y in PAIR_ROWS))
    return path


def _sent_rows(sent: list[bytes]) -> list[list[list[int]]]:
    return [json.loads(b)["input_ids"] for b in sent if b and b"input_ids" in b]


def kept_in_place(sent_rows, clear_rows, special, n=1, after_sep: int | None = None) -> int:
    """Windows of n consecutive non-special positions sent with their original ids (only
    those after the first ``after_sep`` id with it given: the second text of a pair).
    Privatization keeps positions, so this is where a leak shows."""
    hits = 0
    for s_row, c_row in zip(sent_rows, clear_rows, strict=True):
        assert len(s_row) == len(c_row)
        start = c_row.index(after_sep) + 1 if after_sep is not None else 0
        same = [a == b and b not in special
                for a, b in zip(s_row[start:], c_row[start:], strict=True)]
        hits += sum(all(same[i:i + n]) for i in range(len(same) - n + 1))
    return hits


def test_pair_dataset_leaves_the_device_privatized(service, tmp_path):
    """Issue 13: a pair file goes up as rows [CLS] k a [SEP] b [SEP] with both texts
    privatized; no raw text and no original 3-gram of either text's ids is sent. The service
    trains on the pair rows and predicts, from ids or from privatized texts + text_pairs."""
    from rapt.tuning.reconstruction import encode_texts

    tc, key, bb = service
    sent = capture(tc)
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc, eta=5.0, seed=0,
                   plain_tokens=4, kind_policy=UNIFORM)
    ds = c.upload(write_pair_csv(tmp_path / "pairs.csv"), reconstruction=True, max_length=48)
    st = c.wait(c.tune(ds, epochs=1, batch_size=4, num_virtual_tokens=4, lr=0.05,
                       rec_vocab_size=20), progress=False, poll_s=0.05, timeout=60)
    assert st["state"] == "succeeded", st
    pred = c.predict(st["prompt_id"], tmp_path / "pairs.csv")
    assert len(pred.labels) == len(PAIR_ROWS) and pred.label_names == ["0", "1"]
    uploaded, queried = _sent_rows(sent)
    sep = bb.tokenizer.sep_token_id
    for rows in (uploaded, queried):
        assert len(rows) == len(PAIR_ROWS) and all(r.count(sep) == 2 for r in rows)
        assert all(r[0] == bb.tokenizer.cls_token_id and r[-1] == sep for r in rows)
    assert c.last_upload["replacement_probability"] > 0.9
    blob = b"\n".join(sent).decode()
    assert not any(t in blob for t in TEXTS)
    # On this 53-word vocabulary some 3-grams recur by chance (real vocabulary: the minilm
    # test above); 4-grams do not, and the second texts are privatized as much as the first.
    assert not leaked_ngrams(sent, bb.tokenizer, n=4)
    clear = c._rows([a for a, _, _ in PAIR_ROWS], [b for _, b, _ in PAIR_ROWS], c.plain_ids(),
                    48)
    special = set(bb.special_ids)
    n_second = kept_in_place(clear, clear, special, after_sep=sep)
    assert n_second > 5 * len(clear)  # not vacuous: unprivatized, every token is kept
    assert kept_in_place(uploaded, clear, special, after_sep=sep) < 0.12 * n_second
    assert kept_in_place(uploaded, clear, special, n=4) == 0
    # Privatized texts as a pair: the service encodes them as the client would.
    a, b = ["good movie", "bad plot"], ["fun story", "dull film"]
    by_text = tc.post("/v1/predict", headers={"Authorization": f"Bearer {key}"},
                      json={"prompt_id": st["prompt_id"], "texts": a, "text_pairs": b})
    assert by_text.status_code == 200, by_text.text
    plain = c.prompt(st["prompt_id"])["plain_ids"]
    assert plain is not None  # pair ids rows with k: build them locally for the reference
    by_ids = tc.post("/v1/predict", headers={"Authorization": f"Bearer {key}"},
                     json={"prompt_id": st["prompt_id"],
                           "input_ids": encode_texts(bb.tokenizer, a, b)})
    assert by_ids.json()["probabilities"] == by_text.json()["probabilities"]
    bad = tc.post("/v1/predict", headers={"Authorization": f"Bearer {key}"},
                  json={"prompt_id": st["prompt_id"], "texts": a, "text_pairs": b[:1]})
    assert bad.status_code == 422 and "text_pairs" in bad.text


def test_cli_client_upload_and_predict_pairs(service, tmp_path, monkeypatch):
    """`rapt client upload/predict --text-pair-column` on a file with custom column names; a
    missing pair column is one error line naming file and column, and nothing is sent."""
    from typer.testing import CliRunner

    import rapt.client.client as client_mod
    from rapt.cli import app
    from rapt.tuning.reconstruction import build_rows

    tc, key, bb = service
    folder = save_backbone(bb, tmp_path / "bb")
    init = client_mod.RaptClient.__init__

    def with_test_http(self, *args, **kw):  # the CLI's client talks to the in-process service
        init(self, *args, **{**kw, "http": tc, "remote_backbone": "tiny"})

    monkeypatch.setattr(client_mod.RaptClient, "__init__", with_test_http)
    path = tmp_path / "custom.csv"
    path.write_text("left,right,label\n" + "".join(f"{a},{b},{y}\n" for a, b, y in PAIR_ROWS))
    sent = capture(tc)
    cli = CliRunner(env={"RAPT_URL": "http://127.0.0.1:1", "RAPT_API_KEY": key})
    common = ["--backbone", str(folder), "--eta", "5", "--noise-seed", "0", "--protect", "all"]
    r = cli.invoke(app, ["client", "upload", str(path), "--text-column", "left",
                         "--text-pair-column", "nope", *common])
    assert r.exit_code == 2 and "custom.csv" in r.output and "'nope'" in r.output, r.output
    assert "--text-pair-column" in r.output and "Traceback" not in r.output and sent == []
    r = cli.invoke(app, ["client", "upload", str(path), "--text-column", "left",
                         "--text-pair-column", "right", *common])
    assert r.exit_code == 0, r.output
    rows = _sent_rows(sent)[0]
    assert all(row.count(bb.tokenizer.sep_token_id) == 2 for row in rows)
    assert not any(t in b"\n".join(sent).decode() for t in TEXTS)
    clear = build_rows(bb.tokenizer, [a for a, _, _ in PAIR_ROWS], 128,
                       text_pairs=[b for _, b, _ in PAIR_ROWS])
    assert kept_in_place(rows, clear, set(bb.special_ids), n=4) == 0
    assert not leaked_ngrams(sent, bb.tokenizer, n=4)
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", eta=5.0)
    st = c.wait(c.tune(r.stdout.strip().splitlines()[-1], epochs=1, batch_size=4,
                       num_virtual_tokens=4, lr=0.05), progress=False, poll_s=0.05, timeout=60)
    assert st["state"] == "succeeded", st
    r = cli.invoke(app, ["client", "predict", st["prompt_id"], str(path), "--text-column",
                         "left", "--text-pair-column", "right", "--backbone", str(folder),
                         "--eta", "5"])
    assert r.exit_code == 0, r.output
    # issue 32 item 2: rows by label name (recorded at upload on this machine) with both texts
    printed = [s.split("\t") for s in r.stdout.splitlines() if "\t" in s]
    assert [p[1:] for p in printed] == [[a, b] for a, b, _ in PAIR_ROWS][:10]
    assert {p[0] for p in printed} <= {"0", "1"} and "accuracy" in r.stdout
    out = tmp_path / "preds.csv"
    r = cli.invoke(app, ["client", "predict", st["prompt_id"], str(path), "--text-column",
                         "left", "--text-pair-column", "right", "--backbone", str(folder),
                         "--eta", "5", "--out", str(out), "--label-names", "no,yes"])
    assert r.exit_code == 0, r.output
    import csv

    written = list(csv.DictReader(out.open()))
    assert [(w["text"], w["text_pair"]) for w in written] == [(a, b) for a, b, _ in PAIR_ROWS]
    assert {w["label"] for w in written} <= {"no", "yes"}
    assert [w["gold"] for w in written] == [["no", "yes"][y] for _, _, y in PAIR_ROWS]
    assert all(abs(float(w["p(no)"]) + float(w["p(yes)"]) - 1) < 1e-4 for w in written)
    queried = _sent_rows(sent)[-1]
    assert all(row.count(bb.tokenizer.sep_token_id) == 2 for row in queried)
    # --pad-to-bucket: every row sent is a multiple of 8 tokens (issue 29 item 9)
    r = cli.invoke(app, ["client", "predict", st["prompt_id"], str(path), "--text-column",
                         "left", "--text-pair-column", "right", "--backbone", str(folder),
                         "--eta", "5", "--pad-to-bucket", "8"])
    assert r.exit_code == 0, r.output
    assert {len(row) % 8 for row in _sent_rows(sent)[-1]} == {0}
    assert {len(row) % 8 for row in queried} != {0}
    r = cli.invoke(app, ["client", "upload", str(path), "--pad-to-bucket", "0", *common])
    assert r.exit_code == 2 and "--pad-to-bucket" in r.output, r.output


def _predict_bodies(sent_paths) -> list[dict]:
    return [json.loads(b) for p, b in sent_paths if p == "/v1/predict"]


def test_every_predict_chunk_is_privatized(service, tmp_path):
    """Issue 29 item 11a: with chunk=2, 12 query rows go up in 6 requests, and the leak
    checks run on each /v1/predict body (a client that sent the raw rows of every chunk
    after the first passed the suite, which never sent more than one chunk)."""
    tc, key, bb = service
    c = run_flow(tc, key, bb, tmp_path, eta=5.0, seed=0)
    prompt_id = next(iter(c._prompt_info))
    sent: list[tuple[str, bytes]] = []
    tc.event_hooks["request"] = [lambda req: sent.append((req.url.path, req.read()))]
    queries = TEXTS + TEXTS[:4]
    pred = c.predict(prompt_id, queries, chunk=2)
    assert len(pred.labels) == 12
    bodies = _predict_bodies(sent)
    assert len(bodies) == 6 and all(len(b["input_ids"]) == 2 for b in bodies)
    clear = c._rows(queries, None, c.prompt(prompt_id)["plain_ids"], 128)
    special = set(bb.special_ids)
    assert kept_in_place(clear, clear, special, n=4) > 12  # not vacuous
    for i, body in enumerate(bodies):
        raw = json.dumps(body).encode()
        assert not leaked_ngrams([raw], bb.tokenizer), i
        assert not any(t in raw.decode() for t in queries)
        assert kept_in_place(body["input_ids"], clear[2 * i:2 * i + 2], special, n=4) == 0, i


def test_pad_to_bucket_hides_lengths_on_the_wire_and_keeps_predictions(service, tmp_path):
    """Issue 29 item 9: with pad_to_bucket=8 every row sent (upload and predict) is a
    multiple of 8 tokens, padded with the pad token; the service strips it, so the stored
    rows and the predictions equal those of the same privatized rows sent unpadded."""
    from rapt.padding import dedicated_pad_id

    tc, key, bb = service
    c = run_flow(tc, key, bb, tmp_path, eta=5.0, seed=0)
    prompt_id = next(iter(c._prompt_info))
    pad = bb.tokenizer.pad_token_id
    sent: list[tuple[str, bytes]] = []
    tc.event_hooks["request"] = [lambda req: sent.append((req.url.path, req.read()))]
    kw = dict(api_key=key, backbone=bb, remote_backbone="tiny", http=tc, eta=5.0, seed=0,
              plain_tokens=4)
    plain = RaptClient(**kw).predict(prompt_id, TEXTS, chunk=3)
    padded_client = RaptClient(**kw, pad_to_bucket=8)
    padded = padded_client.predict(prompt_id, TEXTS, chunk=3)
    bodies = _predict_bodies(sent)
    unpadded_rows = [r for b in bodies[:3] for r in b["input_ids"]]
    padded_rows = [r for b in bodies[3:] for r in b["input_ids"]]
    assert {len(r) % 8 for r in padded_rows} == {0}
    assert {len(r) % 8 for r in unpadded_rows} != {0}  # not vacuous: lengths differ
    for u, p in zip(unpadded_rows, padded_rows, strict=True):
        assert p[:len(u)] == u and set(p[len(u):]) <= {pad} and len(p) - len(u) < 8
    assert padded.labels == plain.labels
    assert max(abs(a - b) for pa, pb in zip(padded.probabilities, plain.probabilities,
                                            strict=True)
               for a, b in zip(pa, pb, strict=True)) < 1e-6
    # an upload is padded too, and stored as the real rows
    ds = padded_client.upload(write_csv(tmp_path / "again.csv"), max_length=32)
    up = json.loads(next(b for p, b in reversed(sent) if p == "/v1/datasets"))
    assert {len(r) % 8 for r in up["input_ids"]} == {0}
    info = padded_client.dataset(ds)
    real = RaptClient(**kw).encode(TEXTS, max_length=32)
    assert info["max_row_len"] == max(len(r) for r in real) < max(len(r) for r in up["input_ids"])
    # a tokenizer whose pad token is also its eos cannot pad (stripping would eat real tokens)
    from types import SimpleNamespace

    assert dedicated_pad_id(SimpleNamespace(pad_token_id=2, eos_token_id=2)) is None
    assert dedicated_pad_id(bb.tokenizer) == pad
    with pytest.raises(ClientError, match="pad_to_bucket"):
        RaptClient(**kw, pad_to_bucket=0)


def test_pad_to_bucket_and_strip_padding():
    from rapt.padding import pad_to_bucket, strip_padding

    rows = [[5, 6, 7], [5], [5, 6, 7, 8]]
    padded = pad_to_bucket(rows, 0, 4)
    assert padded == [[5, 6, 7, 0], [5, 0, 0, 0], [5, 6, 7, 8]]
    assert strip_padding(padded, 0) == rows
    assert strip_padding([[0, 0]], 0) == [[0]]  # never an empty row
    assert strip_padding([[5, 0]], None) == [[5, 0]]


def test_cli_client_flow_prints_like_the_other_commands(tmp_path, monkeypatch):
    """`client upload`, `client tune --wait` and `client predict` through the CLI, on the
    in-process service: the weak-privacy warning is the CLI's one line (`warning: weak privacy
    on this training data` / `query set`), after the privacy lines, as `rapt tune` prints it;
    no "Loading weights" bar; `tune --wait` prints the method, the training data's η and
    `head:` before the JSON status."""
    from transformers.utils import logging as hf_logging
    from typer.testing import CliRunner

    import rapt.client.client as client_module
    from rapt.cli import app
    from rapt.http import HttpSession

    bb, folder, cfg, key = folder_service(tmp_path, monkeypatch)
    hf_logging.enable_progress_bar()
    try:
        with TestClient(create_app(cfg, backbones={str(folder): bb})) as tc:
            monkeypatch.setattr(client_module, "HttpSession",
                                lambda url, k, timeout=120.0, client=None:
                                HttpSession(url, k, client=tc))
            run = CliRunner().invoke
            base = ["--url", "http://testserver", "--key", key]
            up = run(app, ["client", "upload", str(write_csv(tmp_path / "d.csv")), *base,
                           "--backbone", str(folder), "--eta", "1e6", "--max-length", "32",
                           "--protect", "all"])
            assert up.exit_code == 0, up.output
            tune = run(app, ["client", "tune", up.stdout.strip(), *base, "--epochs", "1",
                             "--batch-size", "4", "--wait"])
            assert tune.exit_code == 0, tune.output
            prompt_id = json.loads(tune.stdout[tune.stdout.index("{"):])["prompt_id"]
            pred = run(app, ["client", "predict", prompt_id, "a good film", "a bad plot",
                             *base, "--backbone", str(folder)])
            assert pred.exit_code == 0, pred.output
    finally:
        hf_logging.enable_progress_bar()
    for r, what in ((up, "training data"), (pred, "query set")):
        err = r.stderr
        assert "Loading weights" not in err and "WARNING" not in err
        assert err.count(f"warning: weak privacy on this {what}: ") == 1
        assert err.index("rows privatized; privacy: η = 1000000.00") < err.index("warning: weak")
    out = tune.output
    assert "method: lora (default; --method" in out
    assert "privacy: η = 1000000.00 (declared with dataset" in out
    assert out.index("method:") < out.index("head: ") < out.index('"state": "succeeded"')


def test_the_clients_own_records_are_readable_by_the_user_only(service, tmp_path,
                                                                monkeypatch):
    """The client's records on this machine (user-side.NOT-PRIVATE.json: the held-out rows'
    indices and how to reload the file; label-names.json) are 0600 under the usual umask
    022. Mutation caught: _write_0600 opening with 0o644."""
    import os
    import stat

    tc, key, bb = service
    cache = tmp_path / "cache"
    monkeypatch.setenv("RAPT_CACHE", str(cache))
    old = os.umask(0o022)
    try:
        c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc, eta=5.0)
        c.upload(write_csv(tmp_path / "private.csv"), max_length=32)
    finally:
        os.umask(old)
    records = {p.name: stat.S_IMODE(p.stat().st_mode) for p in cache.iterdir()}
    assert records == {"user-side.NOT-PRIVATE.json": 0o600, "label-names.json": 0o600}, \
        records
    assert "holdout|" in (cache / "user-side.NOT-PRIVATE.json").read_text()
