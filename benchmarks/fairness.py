"""Fairness between keys: how long a 1-step job of one key waits behind a 100,000-step job of
another key, with one job worker.

The service runs in process (FastAPI TestClient, SQLite store, the real trainer) on a tiny
random BERT built in code (2 layers, hidden 32), so a 100,000-step job is one the service
accepts (``max_steps_per_job``) and schedules like any other. Key A submits the long job
(1,000 rows × 100 epochs at batch size 1); as soon as it runs, key B submits a 1-step job
(2 rows, batch size 2), at the start of A's slice: the worst case for B. The wait is B's
submit to B's ``succeeded``; then A is cancelled. For each time slice (``job_slice_s``) the
run repeats; with slicing off (0, what the service did before) B would wait for all of A, so
that row waits a few seconds to show B still queued and reports A's remaining time at its
measured step rate as the estimate.

Bound stated: ``wait <= job_slice_s + 2 × heartbeat_s + the 1-step job's own run (start-up,
one step, saving its prompt) + one step and checkpoint of A``; the last two are taken as 5 s
here (they are ~0.1-1 s on the tiny model; a larger backbone costs more).

    OMP_NUM_THREADS=1 python -m benchmarks.fairness           # slices 2, 5 and 30 s (~1.5 min)
    OMP_NUM_THREADS=1 python -m benchmarks.fairness --slices 5 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks._common import RESULTS, machine

LONG_ROWS, LONG_EPOCHS = 1000, 100  # 100,000 steps at batch size 1
HEARTBEAT_S = 1.0  # ServiceConfig's default
OWN_RUN_S = 5.0  # allowance for the short job's own run and one step + checkpoint of A

WORDS = ("the a movie film good bad great awful boring fun plot actor story love hate is was "
         "not very it this that and but of to in with").split()


def tiny_backbone():
    """A random 2-layer, hidden-32 BERT with a ~35-word tokenizer, as a rapt Backbone."""
    from transformers import BertConfig, BertModel, BertTokenizer

    from rapt.models import from_model

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(vocab)})
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=64,
                                 max_position_embeddings=64)).eval()
    return from_model(model, tok, name="tiny", kind="encoder")


def dataset(n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    V = len(WORDS) + 5
    ids = [[2] + torch.randint(5, V, (8,), generator=g).tolist() + [3] for _ in range(n)]
    return {"backbone": "tiny", "input_ids": ids, "labels": [i % 2 for i in range(n)],
            "num_labels": 2, "privacy": {"mechanism": "dchi-text2text", "eta": 10.0}}


class Bench:
    """One in-process service (fresh store) with keys A and B and their datasets."""

    def __init__(self, folder: Path, slice_s: float):
        from fastapi.testclient import TestClient

        from rapt.service import ServiceConfig, auth, create_app
        from rapt.service.store import Store

        db = folder / f"slice{slice_s:g}.db"
        store = Store(db)
        self.keys = {}
        for name in ("A", "B"):
            self.keys[name] = auth.new_key()
            store.add_key(name, auth.hash_key(self.keys[name]))
        store.close()
        cfg = ServiceConfig(db_path=db, backbones=["tiny"], job_slice_s=slice_s,
                            heartbeat_s=HEARTBEAT_S, progress_interval_s=0.2)
        self.client = TestClient(create_app(cfg, backbones={"tiny": tiny_backbone()}))
        self.client.__enter__()
        self.ds = {k: self.post(k, "/v1/datasets", dataset(n, i))["id"]
                   for i, (k, n) in enumerate((("A", LONG_ROWS), ("B", 2)))}

    def post(self, key: str, path: str, body: dict | None = None) -> dict:
        r = self.client.post(path, json=body, headers={"Authorization": f"Bearer "
                                                                        f"{self.keys[key]}"})
        assert r.status_code < 300, r.text
        return r.json()

    def job(self, key: str, jid: str) -> dict:
        return self.client.get(f"/v1/jobs/{jid}", headers={
            "Authorization": f"Bearer {self.keys[key]}"}).json()

    def submit(self, key: str, epochs: int, batch_size: int) -> str:
        return self.post(key, "/v1/jobs", {"dataset_id": self.ds[key], "epochs": epochs,
                                           "batch_size": batch_size, "seed": 0})["id"]

    def close(self) -> None:
        self.client.__exit__(None, None, None)


def wait_for(pred, timeout: float, poll: float = 0.02):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        out = pred()
        if out:
            return out
        time.sleep(poll)
    return None


def one_run(folder: Path, slice_s: float, observe_s: float) -> dict:
    """A's long job running, B's 1-step job submitted: B's wait (or, with slicing off, B
    still queued after ``observe_s`` and A's remaining time at its step rate)."""
    b = Bench(folder, slice_s)
    try:
        long = b.submit("A", LONG_EPOCHS, 1)
        st = wait_for(lambda: (s := b.job("A", long))["state"] == "running" and s, 60)
        assert st, "the long job did not start"
        t0 = time.monotonic()
        short = b.submit("B", 1, 2)
        timeout = observe_s if slice_s == 0 else slice_s + 60
        done = wait_for(lambda: (s := b.job("B", short))["state"] in
                        ("succeeded", "failed") and s, timeout)
        waited = time.monotonic() - t0
        a = b.job("A", long)
        rate = a["step"] / a["elapsed_s"] if a["elapsed_s"] else None
        out = {"slice_s": slice_s, "long_total_steps": a["total_steps"],
               "long_step_at_b_done": a["step"], "long_state_at_b_done": a["state"],
               "long_steps_per_s": rate}
        if done:
            assert done["state"] == "succeeded", done
            out["wait_s"] = waited
        else:  # slicing off: B is still queued behind all of A
            out["b_state_after_observe"] = b.job("B", short)["state"]
            out["observed_s"] = waited
            out["estimated_wait_s"] = ((a["total_steps"] - a["step"]) / rate
                                       if rate else None)
        b.post("A", f"/v1/jobs/{long}/cancel")
        end = wait_for(lambda: (s := b.job("A", long))["state"] != "running" and s, 60)
        out["long_final_state"] = end and end["state"]
        if not done:
            wait_for(lambda: b.job("B", short)["state"] == "succeeded", 60)
        return out
    finally:
        b.close()


def markdown(r: dict) -> str:
    m = r["machine"]
    out = ["# Fairness: a 1-step job of key B behind a 100,000-step job of key A", "",
           f"`{r['command']}` — {m['platform']}, {m['cpu_count']} cores, torch {m['torch']}, "
           f"{m['threads']} thread; load average {m['loadavg_start'][0]:.2f} at start, "
           f"{m['loadavg_end'][0]:.2f} at the end (about 1 is this benchmark alone on its "
           "thread; more means other jobs shared the cores, and the waits grow with them).", "",
           "One job worker, in-process service, SQLite store, the real trainer on a tiny "
           "random BERT (2 layers, hidden 32). A's job: 1,000 rows × 100 epochs at batch 1 = "
           "100,000 steps. B's job: 1 step, submitted as soon as A's job runs (the start of "
           "A's slice: B's worst case). Wait = B's submit to B succeeded. A is cancelled "
           "afterwards.", "",
           f"Bound: wait ≤ job_slice_s + 2 × heartbeat_s ({r['heartbeat_s']:g} s) + "
           f"{r['own_run_allowance_s']:g} s (B's own run, one step and checkpoint of A).", "",
           "| job_slice_s | runs | B's wait, median (s) | max (s) | bound (s) | within | A's "
           "steps/s | A's state when B done |", "|---|---|---|---|---|---|---|---|"]
    for row in r["summary"]:
        if row["slice_s"] == 0:
            out.append(f"| 0 (off: before) | {row['runs']} | still queued after "
                       f"{row['observed_s']:.0f} s; estimated {row['estimated_wait_s']:.0f} s "
                       f"(A's remaining steps at its rate) | — | — | — | "
                       f"{row['long_steps_per_s']:.0f} | running |")
            continue
        out.append(f"| {row['slice_s']:g} | {row['runs']} | {row['wait_median_s']:.1f} | "
                   f"{row['wait_max_s']:.1f} | {row['bound_s']:.0f} | "
                   f"{'yes' if row['within_bound'] else '**no**'} | "
                   f"{row['long_steps_per_s']:.0f} | {row['long_states']} |")
    out += ["", "With slicing off, B's wait is A's whole remaining run (the estimate above; at "
            "the 100,000-step limit on a real backbone, hours). With slices, A's job stops at "
            "its next step once it has had its slice and B has waited two heartbeats, "
            "checkpoints, and goes to the back of the queue; B's key is served next (round "
            "robin across keys); A resumes from its checkpoint, every step once. The default "
            "`job_slice_s` is 30 s (`rapt serve --job-slice-s`).", ""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slices", type=float, nargs="+", default=[2.0, 5.0, 30.0])
    ap.add_argument("--repeats", type=int, default=2, help="runs per slice under 30 s")
    ap.add_argument("--observe-s", type=float, default=8.0,
                    help="how long the slicing-off run watches B stay queued")
    args = ap.parse_args()
    torch.set_num_threads(1)
    host = machine()
    runs = []
    with tempfile.TemporaryDirectory(prefix="rapt-fair-") as tmp:
        for s in [0.0, *args.slices]:
            for i in range(1 if s == 0 or s >= 30 else args.repeats):
                folder = Path(tmp) / f"{s:g}-{i}"
                folder.mkdir()
                r = one_run(folder, s, args.observe_s)
                print(json.dumps(r), flush=True)
                runs.append(r)
    summary = []
    for s in [0.0, *args.slices]:
        rs = [r for r in runs if r["slice_s"] == s]
        row = {"slice_s": s, "runs": len(rs),
               "long_steps_per_s": statistics.median(r["long_steps_per_s"] for r in rs)}
        if s == 0:
            row.update(observed_s=rs[0]["observed_s"],
                       estimated_wait_s=rs[0]["estimated_wait_s"])
        else:
            waits = [r["wait_s"] for r in rs]
            bound = s + 2 * HEARTBEAT_S + OWN_RUN_S
            row.update(wait_median_s=statistics.median(waits), wait_max_s=max(waits),
                       bound_s=bound, within_bound=max(waits) <= bound,
                       long_states=", ".join(sorted({r["long_state_at_b_done"] for r in rs})))
        summary.append(row)
    cmd = "OMP_NUM_THREADS=1 python -m benchmarks.fairness"
    if args.slices != [2.0, 5.0, 30.0] or args.repeats != 2:
        cmd += f" --slices {' '.join(f'{s:g}' for s in args.slices)} --repeats {args.repeats}"
    result = {"command": cmd, "heartbeat_s": HEARTBEAT_S, "own_run_allowance_s": OWN_RUN_S,
              "long_job_steps": LONG_ROWS * LONG_EPOCHS, "runs": runs, "summary": summary,
              "machine": {**host, "loadavg_end": list(os.getloadavg())}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fairness.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "fairness.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {RESULTS / 'fairness'}.{{json,md}}")


if __name__ == "__main__":
    main()
