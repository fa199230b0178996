"""GET /metrics: Prometheus text for operators, admin keys only; requests by route template and
status, latency, jobs by state, queue, workers, micro-batching, storage and ε per key."""

from __future__ import annotations

import pytest
from _service import FakeRunner, add_key, hdr, make_app, open_store, upload_body, wait_job
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from rapt.service import auth


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _value(samples: dict, metric: str, **labels) -> float | None:
    return samples.get((metric, tuple(sorted(labels.items()))))


@pytest.fixture()
def svc(tmp_path, tiny_bert):
    app = make_app(tmp_path, tiny_bert, FakeRunner(steps=3))
    admin_key = add_key(tmp_path, "ops", admin=True)
    user_key = add_key(tmp_path, "alice")
    with TestClient(app) as c:
        yield c, admin_key, user_key, tmp_path


def test_metrics_need_an_operator_key(svc):
    c, admin_key, user_key, _ = svc
    assert c.get("/metrics").status_code == 401
    r = c.get("/metrics", headers=hdr(user_key))
    assert r.status_code == 403 and r.json()["error"] == "forbidden"
    r = c.get("/metrics", headers=hdr(admin_key))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    # Not a documented API operation with a JSON body, but listed (for operators).
    assert "/metrics" in c.app.openapi()["paths"]


def test_metrics_report_requests_jobs_and_storage(svc):
    c, admin_key, user_key, tmp_path = svc
    ds = c.post("/v1/datasets", json=upload_body(), headers=hdr(user_key)).json()
    jid = c.post("/v1/jobs", json={"dataset_id": ds["id"], "epochs": 1},
                 headers=hdr(user_key)).json()["id"]
    assert wait_job(c, user_key, jid)["state"] == "succeeded"
    c.get("/v1/jobs/job_nope", headers=hdr(user_key))  # 404 under the route's template
    c.get("/no/such/path/job_abc")
    c.get("/metrics")  # the gate's 401 counts too
    text = c.get("/metrics", headers=hdr(admin_key)).text
    m = _samples(text)
    assert _value(m, "rapt_http_requests_total", route="/v1/datasets", method="POST",
                  status="201") == 1
    assert _value(m, "rapt_http_requests_total", route="/v1/jobs/{job_id}", method="GET",
                  status="404") == 1
    assert _value(m, "rapt_http_requests_total", route="unmatched", method="GET",
                  status="404") == 1
    assert _value(m, "rapt_http_requests_total", route="/metrics", method="GET",
                  status="401") == 1
    assert "job_nope" not in text and "job_abc" not in text  # templates, never raw paths
    polls = _value(m, "rapt_http_requests_total", route="/v1/jobs/{job_id}", method="GET",
                   status="200")
    assert polls >= 1
    assert _value(m, "rapt_http_request_duration_seconds_count",
                  route="/v1/jobs/{job_id}") == polls + 1
    assert _value(m, "rapt_jobs", state="succeeded") == 1
    assert _value(m, "rapt_jobs", state="queued") == 0
    assert _value(m, "rapt_queue_length") == 0
    assert _value(m, "rapt_job_workers", backend="inprocess") == 1
    store = open_store(tmp_path)
    try:
        kid = store.owner_of_hash(auth.hash_key(user_key))
        stored = store.stored_bytes(kid)
    finally:
        store.close()
    assert stored > 0
    assert _value(m, "rapt_key_stored_bytes", key=kid, name="alice") == stored


def test_metrics_count_micro_batches(svc):
    c, admin_key, user_key, _ = svc
    before = _samples(c.get("/metrics", headers=hdr(admin_key)).text)
    assert _value(before, "rapt_microbatch_rows_total", backbone="tiny") == 0
    ds = c.post("/v1/datasets", json=upload_body(), headers=hdr(user_key)).json()
    jid = c.post("/v1/jobs", json={"dataset_id": ds["id"], "epochs": 1},
                 headers=hdr(user_key)).json()["id"]
    pid = wait_job(c, user_key, jid)["prompt_id"]
    r = c.post("/v1/predict", json={"prompt_id": pid, "input_ids": [[2, 7, 8, 3]] * 3},
               headers=hdr(user_key))
    assert r.status_code == 200, r.text
    after = _samples(c.get("/metrics", headers=hdr(admin_key)).text)
    assert _value(after, "rapt_microbatch_rows_total", backbone="tiny") == 3
    assert _value(after, "rapt_microbatch_requests_total", backbone="tiny") == 1


def test_metrics_sum_the_epsilon_of_each_keys_dp_jobs(svc):
    c, admin_key, user_key, tmp_path = svc
    ds = c.post("/v1/datasets", json=upload_body(), headers=hdr(user_key)).json()
    jids = [c.post("/v1/jobs", json={"dataset_id": ds["id"], "epochs": 1},
                   headers=hdr(user_key)).json()["id"] for _ in range(2)]
    for jid in jids:
        wait_job(c, user_key, jid)
    store = open_store(tmp_path)
    try:  # as the DP worker records them (the fake trainer runs no DP)
        store.update_job(jids[0], epsilon=1.25)
        store.update_job(jids[1], epsilon=0.5)
        kid = store.owner_of_hash(auth.hash_key(user_key))
    finally:
        store.close()
    m = _samples(c.get("/metrics", headers=hdr(admin_key)).text)
    assert _value(m, "rapt_key_dp_epsilon_sum", key=kid, name="alice") == 1.75


def test_metrics_count_the_privatized_tokens_received_by_route_family(svc, tiny_bert):
    c, admin_key, user_key, _ = svc
    special = set(tiny_bert.special_ids)

    def tokens(rows):
        return sum(1 for r in rows for t in r if t not in special)

    m = _samples(c.get("/metrics", headers=hdr(admin_key)).text)
    for family in ("datasets", "predict"):
        assert _value(m, "rapt_privatized_tokens_total", route=family) == 0
    body = upload_body(n=6)
    ds = c.post("/v1/datasets", json=body, headers=hdr(user_key)).json()
    clear = {**upload_body(n=4), "privacy": {"mechanism": "none"}}  # opted out: not counted
    clear_id = c.post("/v1/datasets", json=clear, headers=hdr(user_key)).json()["id"]
    clear_job = c.post("/v1/jobs", json={"dataset_id": clear_id, "epochs": 1},
                       headers=hdr(user_key)).json()["id"]
    clear_pid = wait_job(c, user_key, clear_job)["prompt_id"]
    r = c.post("/v1/predict", json={"prompt_id": clear_pid, "input_ids": upload_body(n=2)[
        "input_ids"]}, headers=hdr(user_key))  # queries of a prompt tuned in clear: not counted
    assert r.status_code == 200, r.text
    jid = c.post("/v1/jobs", json={"dataset_id": ds["id"], "epochs": 1},
                 headers=hdr(user_key)).json()["id"]
    pid = wait_job(c, user_key, jid)["prompt_id"]
    queries = upload_body(n=3)["input_ids"]
    r = c.post("/v1/predict", json={"prompt_id": pid, "input_ids": queries},
               headers=hdr(user_key))
    assert r.status_code == 200, r.text
    m = _samples(c.get("/metrics", headers=hdr(admin_key)).text)
    assert _value(m, "rapt_privatized_tokens_total", route="datasets") == \
        tokens(body["input_ids"]) > 0
    assert _value(m, "rapt_privatized_tokens_total", route="predict") == tokens(queries) > 0


def test_made_up_methods_and_paths_add_no_series(svc):
    """Every label comes from a bounded set: 1,000 requests without a key, each with a random
    method and a random path (unmatched, or under a real route's template), leave the number
    of series where a few such requests put it. Old behaviour: each new method made a series
    (3,000 made-up methods: 789 -> 6,791 lines of /metrics)."""
    import random
    import string

    known = {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
    c, admin_key, _, _ = svc
    rng = random.Random(0)

    def method() -> str:
        while True:
            m = "".join(rng.choices(string.ascii_letters, k=rng.randint(3, 12)))
            if m not in known:
                return m

    def path() -> str:
        word = "".join(rng.choices(string.ascii_lowercase + string.digits, k=12))
        return rng.choice([f"/{word}", f"/v1/{word}/{word}", f"/v1/jobs/job_{word}",
                           f"/v1/datasets/ds_{word}", f"/console/{word}"])

    def series() -> int:
        text = c.get("/metrics", headers=hdr(admin_key)).text
        return sum(len(f.samples) for f in text_string_to_metric_families(text))

    for p in ("/x", "/v1/x/x", "/v1/jobs/job_x", "/v1/datasets/ds_x", "/console/x"):
        c.request("BREW", p)  # the series these kinds of requests fold into
    series()  # and the scrape's own
    before = series()
    answers = {c.request(method(), path()).status_code for _ in range(1000)}
    assert answers <= {404, 405}, answers
    assert series() == before
    m = _samples(c.get("/metrics", headers=hdr(admin_key)).text)
    assert _value(m, "rapt_http_requests_total", route="unmatched", method="other",
                  status="404") > 100
