"""The console (/console): sign-in through an HttpOnly SameSite=Strict cookie, CSRF tokens on
every form, the API's ownership rules (another tenant's job is a 404), cancel and key
revocation through forms, the loss curves as server-side SVG; the API never takes the cookie."""

from __future__ import annotations

import re

import pytest
from _service import FakeRunner, add_key, hdr, make_app, upload_body, wait_job
from fastapi.testclient import TestClient

from rapt.service.curves import loss_svg
from rapt.service.routes import prompts as prompt_routes


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, html
    return m.group(1)


def login(c: TestClient, key: str):
    token = _csrf(c.get("/console/login").text)
    return c.post("/console/login", data={"csrf": token, "key": key}, follow_redirects=False)


def _start_job(c, key, runner=None) -> str:
    ds = c.post("/v1/datasets", json=upload_body(), headers=hdr(key)).json()
    r = c.post("/v1/jobs", json={"dataset_id": ds["id"], "epochs": 1}, headers=hdr(key))
    assert r.status_code == 202, r.text
    return r.json()["id"]


@pytest.fixture()
def runner():
    return FakeRunner(steps=3)


@pytest.fixture()
def console(tmp_path, tiny_bert, runner):
    app = make_app(tmp_path, tiny_bert, runner)
    keys = {"alice": add_key(tmp_path, "alice"), "bob": add_key(tmp_path, "bob"),
            "ops": add_key(tmp_path, "ops", admin=True)}
    with TestClient(app) as c:
        yield c, keys


def _client(c: TestClient, base_url: str = "http://testserver") -> TestClient:
    """A second browser on the same app (its own cookie jar)."""
    return TestClient(c.app, base_url=base_url)


def test_login_sets_an_httponly_strict_cookie_and_logout_clears_it(console):
    c, keys = console
    r = c.get("/console", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/login"
    r = login(c, keys["alice"])
    assert r.status_code == 303 and r.headers["location"] == "/console"
    assert keys["alice"] not in r.headers["location"]
    cookie = next(v for v in r.headers.get_list("set-cookie")
                  if v.startswith("rapt_session="))
    assert keys["alice"] not in " ".join(r.headers.get_list("set-cookie"))  # a session token
    flags = [f.strip().lower() for f in cookie.split(";")]
    assert "httponly" in flags and "samesite=strict" in flags and "path=/console" in flags
    assert "secure" not in flags  # plain http (TestClient); see the https test
    page = c.get("/console")
    assert page.status_code == 200 and "alice" in page.text and "Sign out" in page.text
    assert "script" not in page.text.lower()
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["cache-control"] == "no-store"
    r = c.post("/console/logout", data={"csrf": _csrf(page.text)}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/console/login"
    assert c.get("/console", follow_redirects=False).status_code == 303


def test_cookies_are_secure_host_cookies_over_https(console):
    """Over HTTPS the cookies are ``__Host-`` cookies: Secure, on ``/``, no Domain, so no
    other host (a sibling subdomain) can plant one."""
    c, keys = console
    with _client(c, "https://testserver") as b:
        r = login(b, keys["alice"])
        assert r.status_code == 303, r.text
        cookies = {v.split("=", 1)[0]: [f.strip().lower() for f in v.split(";")]
                   for v in r.headers.get_list("set-cookie")}
        assert set(cookies) == {"__Host-rapt_session", "__Host-rapt_csrf"}, cookies
        for flags in cookies.values():
            assert "secure" in flags and "path=/" in flags and "httponly" in flags
            assert not any(f.startswith("domain=") for f in flags)
        assert b.get("/console").status_code == 200


def test_wrong_key_and_missing_csrf_are_refused(console):
    c, keys = console
    r = login(c, "rapt_not_a_key")
    assert r.status_code == 401 and "unknown or revoked" in r.text
    assert not any(v.startswith("rapt_key=") for v in r.headers.get_list("set-cookie"))
    with _client(c) as b:  # no CSRF cookie at all: a cross-site form post
        r = b.post("/console/login", data={"csrf": "x", "key": keys["alice"]},
                   follow_redirects=False)
        assert r.status_code == 403 and "CSRF" in r.text
    token = _csrf(c.get("/console/login").text)
    r = c.post("/console/login", data={"csrf": token + "x", "key": keys["alice"]})
    assert r.status_code == 403


def test_cancel_through_the_form_needs_the_csrf_token(console, runner):
    c, keys = console
    runner.gate.clear()  # the job holds at step 2 until cancelled
    jid = _start_job(c, keys["alice"])
    assert runner.at_gate.wait(10)
    login(c, keys["alice"])
    page = c.get("/console")
    assert f'/console/jobs/{jid}/cancel' in page.text and "<progress" in page.text
    assert 'http-equiv="refresh"' in page.text  # a running job: the page refreshes itself
    r = c.post(f"/console/jobs/{jid}/cancel", data={"csrf": "forged"}, follow_redirects=False)
    assert r.status_code == 403
    assert c.get(f"/v1/jobs/{jid}", headers=hdr(keys["alice"])).json()["state"] == "running"
    r = c.post(f"/console/jobs/{jid}/cancel", data={"csrf": _csrf(page.text), "back": "job"},
               follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/console/jobs/{jid}"
    assert wait_job(c, keys["alice"], jid)["state"] == "cancelled"
    r = c.post(f"/console/jobs/{jid}/cancel", data={"csrf": _csrf(page.text)})
    assert r.status_code == 409 and "already cancelled" in r.text


def test_tenants_see_only_their_own_objects(console):
    c, keys = console
    jid = _start_job(c, keys["alice"])
    wait_job(c, keys["alice"], jid)
    with _client(c) as b:
        login(b, keys["bob"])
        assert b.get(f"/console/jobs/{jid}").status_code == 404
        token = _csrf(b.get("/console").text)
        r = b.post(f"/console/jobs/{jid}/cancel", data={"csrf": token})
        assert r.status_code == 404 and "text/html" in r.headers["content-type"]
        for page in ("/console", "/console/datasets", "/console/prompts"):
            assert jid not in b.get(page).text
        assert b.get("/console/admin").status_code == 403
    login(c, keys["alice"])
    mine = c.get(f"/console/jobs/{jid}")
    assert mine.status_code == 200 and "succeeded" in mine.text
    assert jid in c.get("/console/prompts").text


def test_api_routes_never_accept_the_cookie(console):
    c, keys = console
    login(c, keys["alice"])
    assert c.get("/v1/jobs").status_code == 401  # the jar's cookie is scoped to /console
    # and even if a browser sent it beyond /console, the API reads keys from headers only
    r = c.get("/v1/jobs", headers={"Cookie": f"rapt_key={keys['alice']}"})
    assert r.status_code == 401
    assert c.get("/metrics", headers={"Cookie": f"rapt_key={keys['ops']}"}).status_code == 401


def test_job_page_draws_task_loss_and_l_rec_on_their_own_axes(console, monkeypatch):
    c, keys = console
    jid = _start_job(c, keys["alice"])
    wait_job(c, keys["alice"], jid)
    login(c, keys["alice"])
    assert "no training history" in c.get(f"/console/jobs/{jid}").text  # FakePrompt keeps none
    history = [{"step": s, "loss": 3.0 / s, "task_loss": 2.0 / s, "rec_loss": 50.0 / s}
               for s in range(1, 6)]
    monkeypatch.setattr(prompt_routes, "_saved_meta", lambda path: {"history": history})
    page = c.get(f"/console/jobs/{jid}").text
    assert page.count("<polyline") == 2 and "task loss" in page and "L_rec" in page
    assert ">50<" in page and ">2<" in page  # each panel's own y range (max labels)


def test_loss_svg_panels():
    assert loss_svg([]) is None
    assert loss_svg([{"step": 1, "loss": float("nan")}]) is None
    one = loss_svg([{"step": 1, "loss": 1.0}, {"step": 2, "loss": 1.0}])  # flat: no div by 0
    assert one.count("<polyline") == 1 and "L_rec" not in one
    two = loss_svg([{"step": s, "task_loss": 1 / s, "rec_loss": 4 / s} for s in (1, 2, 3)])
    assert two.count("<polyline") == 2 and 'height="300"' in two


def test_admin_revokes_a_key_and_its_console_stops_working(console):
    c, keys = console
    with _client(c) as alice:
        login(alice, keys["alice"])
        assert alice.get("/console").status_code == 200
        login(c, keys["ops"])
        page = c.get("/console/admin")
        assert page.status_code == 200 and "alice" in page.text and "bob" in page.text
        kid = re.search(r'name="key" value="(key_[^"]+)">\s*<input name="confirm" '
                        r'placeholder="alice"', page.text).group(1)
        form = {"csrf": _csrf(page.text), "key": kid, "op": "revoke"}
        r = c.post("/console/admin/keys", data={**form, "confirm": "bob"})
        assert r.status_code == 422  # the typed name must be the key's
        r = c.post("/console/admin/keys", data={**form, "confirm": "alice"},
                   follow_redirects=False)
        assert r.status_code == 303
        r = alice.get("/console", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/console/login"
        assert alice.get("/v1/jobs", headers=hdr(keys["alice"])).status_code == 401
        r = c.post("/console/admin/keys", data={"csrf": form["csrf"], "op": "create",
                                                "key": "carol"})
        new = re.search(r"<code>(rapt_[^<]+)</code>", r.text).group(1)
        assert r.status_code == 201 and c.get("/v1/jobs", headers=hdr(new)).status_code == 200


def test_datasets_and_prompts_pages_show_privacy_head_and_warnings(console, monkeypatch):
    c, keys = console
    jid = _start_job(c, keys["alice"])
    pid = wait_job(c, keys["alice"], jid)["prompt_id"]
    login(c, keys["alice"])
    page = c.get("/console/datasets").text
    assert "dchi-text2text" in page and "<td>6</td>" in page and "<td>10.0</td>" in page
    warning = "predicts label 0 for 100 % of the training rows <collapsed>"
    monkeypatch.setattr(prompt_routes, "_saved_meta", lambda path: {
        "head": "verbalizer", "training_check": {"warnings": [warning]}})
    page = c.get("/console/prompts").text
    assert pid in page and "verbalizer" in page
    assert "&lt;collapsed&gt;" in page and "<collapsed>" not in page  # escaped


# -- the forms that act: upload a privatized file, start a job, predict ------------------------
PRIVATE_CSV = ("text,label\nthe movie was good and great,positive\n"
               "a boring plot and a dull story,negative\nthe best film with a fine scene,positive\n"
               "the worst music and a weak plot,negative\n")
NO_FILE = {"file": ("", b"")}  # a browser sends the empty file input as an unnamed empty part


def _upload(c, csv: bytes | str = PRIVATE_CSV, name="data.private.csv", **fields):
    token = _csrf(c.get("/console/datasets").text)
    data = {"csrf": token, "backbone": "tiny", "eta": "12.5", **fields}
    return c.post("/console/datasets", data=data, files={"file": (name, csv, "text/csv")})


def test_upload_takes_the_privatized_file_through_the_api_checks(console):
    c, keys = console
    login(c, keys["alice"])
    page = c.get("/console/datasets").text
    assert "rapt privatize data.csv data.private.csv --backbone tiny" in page
    assert 'enctype="multipart/form-data"' in page
    r = _upload(c)
    assert r.status_code == 201, r.text
    assert "0 = negative, 1 = positive" in r.text
    (ds,) = c.get("/v1/datasets", headers=hdr(keys["alice"])).json()
    assert ds["n_examples"] == 4 and ds["num_labels"] == 2
    assert ds["privacy"] == {"mechanism": "dchi-text2text", "eta": 12.5, "embedding": "tiny",
                             "nn_mode": None, "by_kind": None}
    # the API's own errors, shown on the page that holds the form
    r = _upload(c, eta="")
    assert r.status_code == 422 and "needs eta" in r.text and 'id="upload-error"' in r.text
    r = _upload(c, backbone="nope")
    assert r.status_code == 422 and "nope" in r.text
    r = _upload(c, "text,label\nfine,1\n\"unclosed,0\n")
    assert r.status_code == 422 and "data.private.csv" in r.text
    r = _upload(c, "text\nno label here\n")
    assert r.status_code == 422 and "label" in r.text
    r = _upload(c, name="data.xlsx")
    assert r.status_code == 422 and "rapt privatize" in r.text
    assert len(c.get("/v1/datasets", headers=hdr(keys["alice"])).json()) == 1


def test_upload_and_job_forms_need_the_csrf_token_and_a_login(console):
    c, keys = console
    files = {"file": ("d.csv", PRIVATE_CSV, "text/csv")}
    r = c.post("/console/datasets", data={"eta": "10", "backbone": "tiny"}, files=files,
               follow_redirects=False)
    assert r.status_code == 303  # not signed in: to the login page
    login(c, keys["alice"])
    r = c.post("/console/datasets", data={"csrf": "forged", "eta": "10", "backbone": "tiny"},
               files=files)
    assert r.status_code == 403
    r = c.post("/console/jobs", data={"csrf": "forged", "dataset_id": "x"})
    assert r.status_code == 403
    token = _csrf(c.get("/console/datasets").text)
    r = c.post("/console/datasets", data={"csrf": token, "eta": "10", "backbone": "tiny"})
    assert r.status_code == 415  # a urlencoded post to the multipart form
    assert c.get("/v1/datasets", headers=hdr(keys["alice"])).json() == []


def test_start_a_job_from_the_datasets_page(console):
    c, keys = console
    login(c, keys["alice"])
    _upload(c)
    did = c.get("/v1/datasets", headers=hdr(keys["alice"])).json()[0]["id"]
    page = c.get("/console/datasets").text
    assert 'action="/console/jobs"' in page and f'value="{did}"' in page
    form = {"csrf": _csrf(page), "dataset_id": did, "method": "prompt", "epochs": "2",
            "batch_size": "4", "lr": "", "dp_epsilon": ""}
    r = c.post("/console/jobs", data=form, follow_redirects=False)
    assert r.status_code == 303, r.text
    jid = r.headers["location"].rsplit("/", 1)[1]
    st = wait_job(c, keys["alice"], jid)
    assert st["state"] == "succeeded" and st["method"] == "prompt"
    job = c.get(f"/v1/jobs/{jid}", headers=hdr(keys["alice"])).json()
    assert job["dataset_id"] == did
    r = c.post("/console/jobs", data={**form, "epochs": "0"})
    assert r.status_code == 422 and "epochs" in r.text and 'id="job-error"' in r.text
    r = c.post("/console/jobs", data={**form, "method": "lora", "dp_epsilon": "3"})
    assert r.status_code == 422 and "PromptDPSGD" in r.text
    with _client(c) as b:  # another tenant's dataset is a missing one
        login(b, keys["bob"])
        token = _csrf(b.get("/console/datasets").text)
        r = b.post("/console/jobs", data={**form, "csrf": token})
        assert r.status_code == 404 and did in r.text
    assert len(c.get("/v1/jobs", headers=hdr(keys["alice"])).json()) == 1


def test_predict_box_shows_label_names_and_probabilities(console):
    c, keys = console
    jid = _start_job(c, keys["alice"])
    pid = wait_job(c, keys["alice"], jid)["prompt_id"]
    login(c, keys["alice"])
    assert f'href="/console/prompts/{pid}"' in c.get("/console/prompts").text
    page = c.get(f"/console/prompts/{pid}").text
    assert "rapt privatize queries.txt" in page and "--eta 10.0" in page
    assert "never your clean text" in page
    rows = "the movie was good\n\na dull story\n"
    r = c.post(f"/console/prompts/{pid}/predict", files=NO_FILE,
               data={"csrf": _csrf(page), "rows": rows, "label_names": "neg, pos"})
    assert r.status_code == 200, r.text
    api = c.post("/v1/predict", headers=hdr(keys["alice"]),
                 json={"prompt_id": pid, "texts": ["the movie was good", "a dull story"]}).json()
    cells = re.findall(r'<td class="label">(\w+)</td>', r.text)
    assert cells == [["neg", "pos"][y] for y in api["labels"]]
    for probs in api["probabilities"]:
        assert f"neg: {probs[0]:.3f}" in r.text and f"pos: {probs[1]:.3f}" in r.text
    # a file of privatized rows (here JSONL, unlabelled)
    r = c.post(f"/console/prompts/{pid}/predict", data={"csrf": _csrf(page)},
               files={"file": ("q.jsonl", b'{"text": "a dull story"}\n', "text/plain")})
    assert r.status_code == 200 and r.text.count('<td class="label">') == 1
    r = c.post(f"/console/prompts/{pid}/predict", files=NO_FILE,
               data={"csrf": _csrf(page), "rows": "x", "label_names": "a, b, c"})
    assert r.status_code == 422 and "3 given" in r.text and 'id="predict-error"' in r.text
    r = c.post(f"/console/prompts/{pid}/predict", data={"csrf": _csrf(page), "rows": ""},
               files=NO_FILE)
    assert r.status_code == 422 and "paste privatized rows" in r.text
    r = c.post(f"/console/prompts/{pid}/predict", data={"csrf": "forged", "rows": "x"},
               files=NO_FILE)
    assert r.status_code == 403
    with _client(c) as b:
        login(b, keys["bob"])
        assert b.get(f"/console/prompts/{pid}").status_code == 404
        token = _csrf(b.get("/console").text)
        r = b.post(f"/console/prompts/{pid}/predict", data={"csrf": token, "rows": "x"},
                   files=NO_FILE)
        assert r.status_code == 404


def test_no_console_form_takes_clean_text(console):
    """Every form that sends rows says they must be privatized on the user's machine, and no
    page offers a privatize action (the service has no privatizer to offer)."""
    c, keys = console
    jid = _start_job(c, keys["alice"])
    pid = wait_job(c, keys["alice"], jid)["prompt_id"]
    login(c, keys["alice"])
    for url in ("/console", "/console/datasets", "/console/prompts", f"/console/prompts/{pid}"):
        page = c.get(url).text
        assert "/privatize" not in page
        if "multipart/form-data" in page:
            assert "rapt privatize" in page and "own machine" in page


def test_upload_takes_what_rapt_privatize_wrote_sentence_pairs_included(console, tiny_bert,
                                                                        tmp_path):
    """The file the user's own `rapt privatize` writes (here a CSV of sentence pairs with
    label names) is what the upload form reads: same reader, pairs kept as pairs."""
    from _tiny import save_backbone
    from typer.testing import CliRunner

    from rapt.cli import app
    from rapt.data import load_dataset

    c, keys = console
    src = tmp_path / "pairs.csv"
    src.write_text("sentence1,sentence2,label\nthe movie was good,the music was great,yes\n"
                   "a dull story,a great film,no\nthe plot was bad,the film was bad,yes\n")
    out = tmp_path / "pairs.private.csv"
    folder = save_backbone(tiny_bert, tmp_path / "bb")
    r = CliRunner().invoke(app, ["privatize", str(src), str(out), "--backbone", str(folder),
                                 "--eta", "5", "--noise-seed", "1"])
    assert r.exit_code == 0, r.output
    written = load_dataset(out)
    assert written.texts != load_dataset(src).texts  # privatized (η 5 replaces tokens)
    login(c, keys["alice"])
    r = _upload(c, out.read_bytes(), name=out.name, eta="5")
    assert r.status_code == 201, r.text
    assert "0 = no, 1 = yes" in r.text
    (ds,) = c.get("/v1/datasets", headers=hdr(keys["alice"])).json()
    assert ds["n_examples"] == 3 and ds["privacy"]["eta"] == 5
    tok = tiny_bert.tokenizer
    pairs = tok(written.texts, [p for p in written.text_pairs])["input_ids"]
    assert ds["max_row_len"] == max(len(p) for p in pairs)  # both texts of each pair


def test_dataset_page_shows_the_attack_tables_privacy_and_the_rules_verdict(console,
                                                                           monkeypatch):
    from rapt.privacy import attack_table

    c, keys = console
    login(c, keys["alice"])
    r = _upload(c, eta="40")  # "tiny" is in no shipped table
    assert r.status_code == 201, r.text
    assert "not in rapt's attack table: backbone &#39;tiny&#39; is not in it" in r.text
    # A table that holds "tiny": nearest neighbour recovers 20 % at η 40 and 50 % at η 80; the
    # Bayes attacker 30 % and 60 %: it sets the empirical privacy (an upper bound).
    pts = [{"eta": 40.0, "p": 0.8, "recovery": {"nn": {"all": 0.2, "replaced": 0.0},
                                                "bayes": {"all": 0.3, "replaced": 0.1}}},
           {"eta": 80.0, "p": 0.5, "recovery": {"nn": {"all": 0.5, "replaced": 0.0},
                                                "bayes": {"all": 0.6, "replaced": 0.2}}}]
    table = attack_table.parse_table({
        "format": "rapt-attack-table", "version": 1,
        "backbones": {"tiny": {"attackers": {"nn": {"name": "nearest neighbour"},
                                             "bayes": {"name": "mechanism-aware Bayes"}},
                               "points": pts}}})
    monkeypatch.setattr(attack_table, "load_table", lambda path=None: table)
    page = c.get("/console/datasets").text
    assert "0.80</td>" in page and "0.700, set by mechanism-aware Bayes" in page
    assert "weak: below" not in page and "upper bound" in page
    assert _upload(c, eta="80").status_code == 201  # EP 0.4 < the rule's 0.5: weak
    page = c.get("/console/datasets").text
    assert "0.400, set by mechanism-aware Bayes" in page and "weak: below 0.5" in page


def _create_key(c: TestClient, name: str):
    token = _csrf(c.get("/console/admin").text)
    return c.post("/console/admin/keys", data={"csrf": token, "op": "create", "key": name})


def test_a_new_key_needs_a_free_name_of_bounded_length(console):
    """Old behaviour: a second live key named 'alice', and a 100,000-character name, were
    created (a revoke by name then found two keys; the admin page carried the long one)."""
    c, keys = console
    login(c, keys["ops"])
    assert 'maxlength="100"' in c.get("/console/admin").text
    for name, why in (("alice", "a live key is named &#39;alice&#39; already"),
                      ("x" * 100_000, "at most 100 characters; this one has 100000"),
                      ("tab\there", "printable characters only"), ("  ", "give the new key")):
        r = _create_key(c, name)
        assert r.status_code == 422 and why in r.text, (name[:20], r.text[:300])
        assert "text/html" in r.headers["content-type"] and "<code>rapt_" not in r.text
    names = [k["name"] for k in c.app.state.svc.store.list_keys()]
    assert names == ["alice", "bob", "ops"]
    r = _create_key(c, "x" * 100)
    assert r.status_code == 201 and "<code>rapt_" in r.text


def test_a_form_over_the_size_limit_gets_an_html_page(tmp_path, tiny_bert):
    """Old behaviour: the request gate answered a console form over max_upload_bytes with the
    API's JSON error body."""
    app = make_app(tmp_path, tiny_bert, max_upload_bytes=2000)
    key = add_key(tmp_path, "alice")
    with TestClient(app) as c:
        login(c, key)
        token = _csrf(c.get("/console/datasets").text)
        r = c.post("/console/datasets", data={"csrf": token, "eta": "10", "backbone": "tiny"},
                   files={"file": ("d.csv", b"text,label\n" + b"x,1\n" * 2000, "text/csv")})
        assert r.status_code == 413 and "text/html" in r.headers["content-type"], r.text[:200]
        assert "max_upload_bytes=2000" in r.text and "<h1>413</h1>" in r.text
        assert "default-src 'none'" in r.headers["content-security-policy"]
        r = c.get("/console/no/such/page")
        assert r.status_code == 404 and "text/html" in r.headers["content-type"]
        r = c.post("/v1/datasets", content=b"x" * 3000, headers=hdr(key))
        assert r.status_code == 413 and r.json()["error"] == "payload_too_large"  # the API: JSON
