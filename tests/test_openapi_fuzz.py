"""schemathesis against the app in process: every operation of the published OpenAPI document
gets schema-valid and schema-invalid requests (a fixed seed, a few hundred cases in all), sent
with a valid operator key, and a few without a key; a 5xx, a status code the document does not
list, or a body, content type or header that does not match it fails the test. Some cases name
real objects (a dataset, a job, a prompt, a split session), so the routes behind the 404 are
reached too.

Not checked: that every schema-valid request is accepted (schemathesis'
``positive_data_acceptance``). Some rules are not in the schema and cannot be (exactly one of
``input_ids`` and ``texts``; a backbone this server loaded; strict integers, where JSON Schema
takes ``4.0`` as an integer): the document lists 422 for them instead."""

from __future__ import annotations

import time

import pytest
from _service import FakeRunner, add_key, hdr, make_app, upload_body, wait_job
from fastapi.testclient import TestClient

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed "
                                   "(pip install -e '.[dev]')")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

EXAMPLES = 8  # per operation and generation mode: 25 operations x 2 modes -> <= 400 cases
AUTH = {"authorization", "x-api-key"}


def _checks() -> list:
    from schemathesis import checks

    return [checks.not_a_server_error, checks.status_code_conformance,
            checks.content_type_conformance, checks.response_schema_conformance,
            checks.response_headers_conformance, checks.negative_data_rejection,
            checks.missing_required_header]


def _send(client: TestClient, case, key: str | None):
    """The case as an HTTP request through ``client``, under ``key`` (None: no key). The
    generated values of the security headers are dropped: a wrong key only reaches the 401."""
    kw = case.as_transport_kwargs(base_url="http://testserver")
    headers = {k: v for k, v in (kw.get("headers") or {}).items() if k.lower() not in AUTH}
    body = {"json": kw["json"]} if "json" in kw else (
        {"content": kw["data"]} if kw.get("data") is not None else {})
    client.cookies = kw.get("cookies") or {}
    return client.request(kw["method"], kw["url"],
                          headers={**headers, **(hdr(key) if key else {})},
                          params=kw.get("params"), **body)


def _objects(c: TestClient, key: str) -> dict[str, str]:
    """Real ids of the caller's objects, for path parameters."""
    ds = c.post("/v1/datasets", json=upload_body(), headers=hdr(key)).json()["id"]
    job = c.post("/v1/jobs", json={"dataset_id": ds}, headers=hdr(key)).json()["id"]
    prompt = wait_job(c, key, job)["prompt_id"]
    body = {"backbone": "tiny", "n_examples": 8, "split_layer": 1, "epochs": 1,
            "batch_size": 4, "max_length": 16}
    sid = c.post("/v1/sap/sessions", json=body, headers=hdr(key)).json()["id"]
    return {"dataset_id": ds, "job_id": job, "prompt_id": prompt, "session_id": sid}


def _fuzz(client: TestClient, key: str | None, strategy, where: str,
          failures: dict[str, str], examples: int = EXAMPLES) -> int:
    """Run ``strategy``'s cases (a fixed seed); the first failure per status goes into
    ``failures`` under ``where``. Returns the number of cases sent."""
    sent = 0

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case) -> None:
        nonlocal sent
        sent += 1
        response = _send(client, case, key)
        try:
            case.validate_response(response, checks=_checks())
        except BaseException as e:  # a FailureGroup
            failures.setdefault(f"{where} {response.status_code}", str(e)[:1500])

    try:
        run()
    except Unsatisfiable:  # nothing to negate (an operation without parameters)
        pass
    return sent


def test_the_app_conforms_to_its_openapi_document(tmp_path, tiny_bert):
    key = add_key(tmp_path, "ops", admin=True)
    app = make_app(tmp_path, tiny_bert, FakeRunner(), max_upload_bytes=20_000, max_seq_len=32,
                   max_queued_jobs=4, max_predict_rows=16)
    failures: dict[str, str] = {}
    cases = 0
    t0 = time.monotonic()
    with TestClient(app, raise_server_exceptions=False) as c:
        ids = _objects(c, key)
        schema = schemathesis.openapi.from_dict(c.get("/openapi.json").json())
        for result in schema.get_all_operations():
            op = result.ok()
            names = {p.name for p in op.path_parameters}
            real = {k: v for k, v in ids.items() if k in names}
            for mode in (schemathesis.GenerationMode.POSITIVE,
                         schemathesis.GenerationMode.NEGATIVE):
                strategy = op.as_strategy(generation_mode=mode)
                if real and mode.is_positive:
                    strategy = st.one_of(strategy, op.as_strategy(path_parameters=real))
                cases += _fuzz(c, key, strategy, f"{op.label} [{mode.value}]", failures)
            # Without a key: the routes that need one must document their 401.
            cases += _fuzz(c, None, op.as_strategy(), f"{op.label} [no key]", failures, 2)
    elapsed = time.monotonic() - t0
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    assert cases >= 150, cases  # the run did exercise the document
    assert elapsed < 60, elapsed
