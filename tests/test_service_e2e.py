"""End to end on loopback: `rapt serve` in a subprocess (uvicorn, real trainer, a tiny BERT
saved to disk), the client tunes and predicts, a burst of concurrent inference requests, then a
server restart keeps the prompt."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
from _service import (
    LABELS,
    TEXTS,
    add_key,
    free_port,
    make_app,
    service_bert,
    upload_body,
    write_csv,
)

from rapt.client.client import RaptClient
from rapt.tuning.tune import TunedPrompt


def test_tune_predict_load_restart(server, tmp_path):
    srv, key, folder = server
    c = RaptClient(srv.url, key, backbone=str(folder), eta=20.0, seed=0, plain_tokens=4)
    ds = c.upload(write_csv(tmp_path / "private.csv", TEXTS * 2, LABELS * 2),
                  reconstruction=True, max_length=32)
    jobs = [c.tune(ds, epochs=2, batch_size=8, num_virtual_tokens=4, lr=0.05, seed=s,
                   rec_vocab_size=20) for s in (0, 1)]
    sts = [c.wait(j, progress=True, poll_s=0.1, timeout=120) for j in jobs]
    assert [s["state"] for s in sts] == ["succeeded"] * 2, sts
    assert sts[0]["step"] == sts[0]["total_steps"] == 4 and sts[0]["loss"] is not None
    pids = [s["prompt_id"] for s in sts]
    pred = c.predict(pids[0], TEXTS)
    assert len(pred.labels) == len(TEXTS)

    # Load: concurrent requests for two prompts on one backbone, checked against the prompts
    # evaluated locally from their saved files.
    rows = c.encode(TEXTS, plain_ids=c.plain_ids(), max_length=32)
    local = service_bert()
    refs = {p: TunedPrompt.load(Path(str(srv.db) + ".files") / "prompts" / p)
            .predict_proba(local, rows) for p in pids}
    http = httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {key}"},
                        timeout=60)
    ops = {"Authorization": f"Bearer {srv.admin_key}"}
    assert http.get("/v1/stats").status_code == 403  # counters over all tenants: operators only
    stats0 = http.get("/v1/stats", headers=ops).json()[str(folder)]

    def one(i: int) -> tuple[str, list[list[float]]]:
        p, r = pids[i % 2], rows[i % len(rows)]
        resp = http.post("/v1/predict", json={"prompt_id": p, "input_ids": [r]})
        assert resp.status_code == 200, resp.text
        return p, i % len(rows), resp.json()["probabilities"][0]

    n = 240
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, range(n)))
    dt = time.perf_counter() - t0
    for p, i, probs in results:
        assert torch.allclose(torch.tensor(probs), refs[p][i], atol=1e-5)
    stats = http.get("/v1/stats", headers=ops).json()[str(folder)]
    assert stats["requests"] - stats0["requests"] == n
    assert stats["forward_passes"] - stats0["forward_passes"] < n  # requests shared passes
    print(f"{n} requests in {dt:.2f} s ({n / dt:.0f}/s); "
          f"{stats['forward_passes'] - stats0['forward_passes']} forward passes")

    # The same through the command line (URL and key from the environment).
    from typer.testing import CliRunner

    from rapt.cli import app

    cli = CliRunner(env={"RAPT_URL": srv.url, "RAPT_API_KEY": key})
    csv = str(write_csv(tmp_path / "cli.csv"))
    out = cli.invoke(app, ["client", "upload", csv, "--backbone", str(folder), "--eta", "20"])
    assert out.exit_code == 0, out.output
    ds_cli = out.stdout.strip()
    out = cli.invoke(app, ["client", "tune", ds_cli, "--epochs", "1", "--batch-size", "8",
                           "--num-virtual-tokens", "4", "--lr", "0.05", "--wait"])
    assert out.exit_code == 0, out.output
    job_cli = out.stdout.split()[0]
    out = cli.invoke(app, ["client", "status", job_cli])
    st = json.loads(out.stdout)
    assert st["state"] == "succeeded"
    out = cli.invoke(app, ["client", "predict", st["prompt_id"], "a good movie", "a bad plot",
                           "--backbone", str(folder), "--eta", "20"])
    assert out.exit_code == 0, out.output
    printed = [line.split("\t") for line in out.stdout.splitlines() if "\t" in line]
    assert [p[1] for p in printed] == ["a good movie", "a bad plot"], out.stdout
    assert out.stdout.startswith("2 predictions: ")

    # Restart: the prompts, jobs and key survive; predictions are unchanged.
    srv.stop()
    srv.start()
    c2 = RaptClient(srv.url, key, backbone=str(folder), eta=20.0)
    assert c2.status(jobs[0])["prompt_id"] == pids[0]
    http2 = httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {key}"})
    resp = http2.post("/v1/predict", json={"prompt_id": pids[1], "input_ids": rows})
    assert torch.allclose(torch.tensor(resp.json()["probabilities"]), refs[pids[1]], atol=1e-5)


def test_internal_error_keeps_the_connection_and_logs_one_traceback(tmp_path, caplog):
    """Old behaviour, against a real uvicorn server: after a 500 the exception reached uvicorn,
    which logged a second long traceback ("Exception in ASGI application") and closed the
    keep-alive connection; the body named the exception and its message."""
    import http.client
    import logging
    import re
    import threading

    import uvicorn

    def boom(backbone, items):
        raise RuntimeError("/srv/rapt/secret.py: expanded size (513)")

    key = add_key(tmp_path)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(tmp_path, service_bert(), forward=boom),
                                           host="127.0.0.1", port=port, log_level="info"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        t0 = time.time()
        while not server.started and time.time() - t0 < 30:
            time.sleep(0.05)
        auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth) as c:
            ds = c.post("/v1/datasets", json=upload_body()).json()["id"]
            jid = c.post("/v1/jobs", json={"dataset_id": ds}).json()["id"]
            while (st := c.get(f"/v1/jobs/{jid}").json())["state"] not in ("succeeded",
                                                                           "failed"):
                time.sleep(0.05)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        body = json.dumps({"prompt_id": st["prompt_id"], "input_ids": [[2, 7, 3]]})
        caplog.clear()
        with caplog.at_level(logging.INFO):
            conn.request("POST", "/v1/predict", body=body, headers=auth)
            resp = conn.getresponse()
            text = resp.read().decode()
            assert resp.status == 500 and "RuntimeError" not in text and "/srv" not in text
            eid = re.search(r"id ([0-9a-f]{16})", text).group(1)
            conn.request("GET", "/v1/health")  # same connection: it was kept open
            assert conn.getresponse().status == 200
        conn.close()
        tracebacks = [r for r in caplog.records if r.exc_info]
        assert len(tracebacks) == 1 and eid in tracebacks[0].getMessage(), \
            [r.getMessage() for r in tracebacks]
    finally:
        server.should_exit = True
        thread.join(30)
