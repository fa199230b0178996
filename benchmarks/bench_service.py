"""Inference throughput and latency of `rapt serve` on loopback, with and without micro-batching.

Starts the real server (uvicorn subprocess) on 127.0.0.1, tunes a few prompts through the
client on privatized SST-2 examples, then sends single-row privatized queries from several
threads, mixing the prompts (mixed-task batching). The same database is then served by a
second server with micro-batching off (``--max-batch-rows 1``) and measured the same way, so
the batched / unbatched ratio comes from one run. Writes benchmarks/results/service.{json,md}.

    python -m benchmarks.bench_service                  # MiniLM, 300 requests per setting
    python -m benchmarks.bench_service --quick          # tiny random BERT, seconds
    # issue 14: 16 customers' prefix prompts, mixed passes vs one pass per prompt ("before")
    python -m benchmarks.bench_service --method prefix --prompts 16 --threads 16 \
        --baseline per-prompt --out benchmarks/results/service_prefix16
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from benchmarks._common import RESULTS, command, machine, write_json, write_md

RAPT = [sys.executable, "-c", "import sys; from rapt.cli import main; sys.argv[0] = 'rapt'; main()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A service subprocess on a free loopback port: ``cmd`` gets ``--port PORT`` appended;
    waits (≤ 180 s) until /v1/health answers."""

    def __init__(self, cmd: list[str], log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # One intra-op thread by default: on a shared 2-core machine more threads make
        # OpenMP spin against other processes (10-100x slower single-row passes).
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen([*cmd, "--port", str(self.port)], env=env,
                                     stdout=log.open("ab"), stderr=subprocess.STDOUT)
        t0 = time.time()
        while time.time() - t0 < 180:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited; see {log}")
            try:
                if httpx.get(self.url + "/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.3)
        raise SystemExit(f"server did not start; see {log}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def rapt_serve(db: Path, backbone: str, *extra: str) -> list[str]:
    """The `rapt serve` command line of a benchmark server (port appended by Server)."""
    return RAPT + ["serve", "--host", "127.0.0.1", "--db", str(db), "--backbone", backbone,
                   *extra]


def tiny_backbone(folder: Path) -> str:
    from transformers import BertConfig, BertModel, BertTokenizer

    words = ("the a movie film good bad great awful boring fun plot actor story love hate is "
             "was not very it this that and but of to in with").split()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(vocab)})
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=64)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def load(url: str, key: str, prompts: list[str], rows: list[list[int]], n: int,
         threads: int) -> dict:
    """n single-row requests from ``threads`` threads (after a short warm-up); raw numbers."""
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120,
                        limits=httpx.Limits(max_connections=threads + 2))
    lat: list[float] = []
    errors = 0
    lock = threading.Lock()

    def one(i: int) -> None:
        nonlocal errors
        body = {"prompt_id": prompts[i % len(prompts)], "input_ids": [rows[i % len(rows)]]}
        t = time.perf_counter()
        r = http.post("/v1/predict", json=body)
        dt = time.perf_counter() - t
        with lock:
            lat.append(dt)
            errors += r.status_code != 200

    for i in range(min(4, n)):  # warm-up: prompt loading, first-call overheads
        one(i)
    lat.clear()
    stats0 = next(iter(http.get("/v1/stats").json().values()))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, range(n)))
    wall = time.perf_counter() - t0
    stats = next(iter(http.get("/v1/stats").json().values()))
    http.close()
    return {"lat": lat, "wall": wall, "errors": errors,
            "passes": stats["forward_passes"] - stats0["forward_passes"]}


def summarize(parts: list[dict], threads: int) -> dict:
    lat = sorted(x for p in parts for x in p["lat"])
    n, wall = len(lat), sum(p["wall"] for p in parts)
    return {"threads": threads, "requests": n, "errors": sum(p["errors"] for p in parts),
            "wall_s": round(wall, 3), "requests_per_s": round(n / wall, 1),
            "p50_ms": round(1000 * statistics.median(lat), 1),
            "p95_ms": round(1000 * lat[int(0.95 * (n - 1))], 1),
            "forward_passes": sum(p["passes"] for p in parts),
            "requests_per_pass": round(n / max(1, sum(p["passes"] for p in parts)), 2)}


def forward_bench(backbone_name: str, prompt_dirs: list[Path], rows: list[list[int]],
                  sizes: tuple[int, ...] = (3, 12, 48), reps: int = 9) -> list[dict]:
    """In-process: one mixed-task pass over rows of several prompts vs one pass per prompt."""
    from rapt.models import load_backbone
    from rapt.service import mixed
    from rapt.service.inference import per_prompt_forward
    from rapt.tuning.tune import TunedPrompt

    bb = load_backbone(backbone_name)
    prompts = [TunedPrompt.load(d) for d in prompt_dirs]
    out = []
    with torch.inference_mode():
        for n in sizes:
            items = [(prompts[i % len(prompts)], [rows[i % len(rows)]]) for i in range(n)]
            fns = {"mixed_ms": mixed.forward, "per_prompt_ms": per_prompt_forward}
            times: dict[str, list[float]] = {k: [] for k in fns}
            for f in fns.values():
                f(bb, items)  # warm-up
            for _ in range(reps):  # alternate, and take medians: the machine is shared
                for name, f in fns.items():
                    t = time.perf_counter()
                    f(bb, items)
                    times[name].append(1000 * (time.perf_counter() - t))
            row = {"rows": n, "prompts": len(prompts), "reps": reps,
                   **{k: round(statistics.median(v), 1) for k, v in times.items()}}
            row["ratio_per_prompt_over_mixed"] = round(row["per_prompt_ms"] / row["mixed_ms"], 2)
            out.append(row)
    return out


# The second server's extra flags and the two settings' names in the tables.
BASELINES = {"nobatch": (["--max-batch-rows", "1"], "micro-batching", "on", "off"),
             "per-prompt": (["--per-prompt-passes"], "passes", "mixed", "per prompt")}


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backbone", default="minilm")
    ap.add_argument("--quick", action="store_true", help="tiny random BERT, fewer requests")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--threads", default="1,4,16")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--eta", type=float, default=100.0)
    ap.add_argument("--train-examples", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5, help="alternations between the servers")
    ap.add_argument("--method", choices=("prompt", "prefix", "lora"), default="prompt")
    ap.add_argument("--baseline", choices=tuple(BASELINES), default="nobatch",
                    help="what the second server turns off: micro-batching, or mixed passes "
                         "(one pass per prompt within each micro-batch)")
    ap.add_argument("--out", default=str(RESULTS / "service"))
    return ap.parse_args()


def main() -> None:
    args = _parse_args()
    load_start = list(os.getloadavg())
    t_start = time.time()
    from rapt.client.client import RaptClient
    from rapt.data import load_dataset
    from rapt.service import auth
    from rapt.service.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="rapt-bench-"))
    backbone = tiny_backbone(tmp / "tiny") if args.quick else args.backbone
    n_req = 60 if args.quick else args.requests
    db = tmp / "svc.db"
    store = Store(db)
    key = auth.new_key()
    store.add_key("bench", auth.hash_key(key), admin=True)  # /v1/stats needs an admin key
    store.close()
    train = load_dataset("sst2", "train").subset(args.train_examples, seed=0)
    queries = load_dataset("sst2", "dev").subset(64, seed=1).texts

    srv = Server(rapt_serve(db, backbone), tmp / "server.log")
    try:
        c = RaptClient(srv.url, key, backbone=backbone, eta=args.eta, seed=0)
        ds = c.upload(train, max_length=64)
        t = time.perf_counter()
        jobs = [c.tune(ds, method=args.method, epochs=1, batch_size=16, seed=s, max_length=64,
                       num_virtual_tokens=20 if args.method == "prompt" else None,
                       lr=0.02 if args.method == "prompt" else None)
                for s in range(args.prompts)]
        prompts = []
        for j in jobs:
            st = c.wait(j, progress=False, timeout=600)
            if st["state"] != "succeeded":
                raise SystemExit(f"job failed: {st}")
            prompts.append(st["prompt_id"])
        tune_s = time.perf_counter() - t
        rows = c.encode(queries, max_length=64)
        p_repl = c.last_upload["replacement_probability"]
        threads = [int(x) for x in args.threads.split(",")]
        # Both servers stay up and take turns in short rounds, so a change in the machine's
        # load hits both settings alike.
        base_flags, what, on_name, off_name = BASELINES[args.baseline]
        off = Server(rapt_serve(db, backbone, *base_flags), tmp / "server-baseline.log")
        try:
            batched, unbatched = _alternate(args.rounds, (srv.url, off.url), key, prompts,
                                            rows, n_req, threads)
        finally:
            off.stop()
    finally:
        srv.stop()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    fwd = forward_bench(backbone, [db.with_name(db.name + ".files") / "prompts" / p
                                   for p in prompts], rows)
    shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "command": command(),
        "machine": machine(loadavg_start=load_start, loadavg_end=list(os.getloadavg()),
                           server_omp_threads=os.environ.get("OMP_NUM_THREADS", "1")),
        "settings": {"backbone": "tiny-random-bert" if args.quick else backbone,
                     "method": args.method, "baseline": args.baseline,
                     "eta": args.eta, "replacement_probability_train": round(p_repl, 4),
                     "prompts": len(prompts), "rows_per_request": 1,
                     "query_len_tokens_mean": round(sum(map(len, rows)) / len(rows), 1),
                     "tune_seconds_all_prompts": round(tune_s, 1), "batch_wait_ms": 0.0,
                     "max_batch_rows": 64, "rounds": args.rounds},
        "batched": batched,
        "unbatched": unbatched,
        "speedup_requests_per_s": [round(b["requests_per_s"] / u["requests_per_s"], 2)
                                   for b, u in zip(batched, unbatched, strict=True)],
        "mixed_task_forward": fwd,
        "note": f"{what} {on_name}/{off_name} = two servers on the same store, alternating in "
                "rounds",
        "seconds": round(time.time() - t_start, 1),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out.with_suffix(".json"), result, indent=1)
    lines = _report_lines(result, args, fwd, threads, p_repl)
    write_md(out.with_suffix(".md"), lines)
    print("\n".join(lines))


def _alternate(rounds: int, urls: tuple[str, str], key: str, prompts: list[str], rows: list,
               n_req: int, threads: list[int]) -> tuple[list[dict], list[dict]]:
    """Load both servers in turns, ``rounds`` times per thread count; their summaries."""
    batched, unbatched = [], []
    for k in threads:
        on_parts, off_parts = [], []
        for _ in range(rounds):
            on_parts.append(load(urls[0], key, prompts, rows, n_req // rounds, k))
            off_parts.append(load(urls[1], key, prompts, rows, n_req // rounds, k))
        batched.append(summarize(on_parts, k))
        unbatched.append(summarize(off_parts, k))
    return batched, unbatched


def _report_lines(result: dict, args, fwd: list[dict], threads: list[int],
                  p_repl: float) -> list[str]:
    """The markdown report: both servers per thread count, the speed-up, and the in-process
    mixed-task forward."""
    batched, unbatched = result["batched"], result["unbatched"]
    _, what, on_name, off_name = BASELINES[args.baseline]
    load_start, n_prompts = result["machine"]["loadavg_start"], result["settings"]["prompts"]
    lines = [
        f"# Service inference on loopback ({result['settings']['backbone']})", "",
        f"`{result['command']}` — {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average at start {load_start[0]:.1f}; "
        f"{n_prompts} {args.method} prompts mixed, 1 privatized row per request "
        f"(η={args.eta}, P={p_repl:.2f}).", "",
        f"| threads | {what} | requests/s | p50 ms | p95 ms | requests per forward pass "
        "| errors |", "|---|---|---|---|---|---|---|"]
    for b, u in zip(batched, unbatched, strict=True):
        for name, r in ((on_name, b), (off_name, u)):
            lines.append(f"| {r['threads']} | {name} | {r['requests_per_s']} | {r['p50_ms']} | "
                         f"{r['p95_ms']} | {r['requests_per_pass']} | {r['errors']} |")
    lines += ["", "With 1 thread both servers run the same path (no request has company), so "
              "their difference is the measurement noise of this shared machine."]
    lines += ["", f"Speed-up of requests/s, {what} {on_name} over {off_name}, per thread count: "
              + ", ".join(f"{k} threads ×{s}" for k, s in
                          zip(threads, result["speedup_requests_per_s"], strict=True)), ""]
    lines += ["In-process, one backbone pass for rows of several prompts (mixed-task) vs one pass "
              "per prompt:", "", "| rows | prompts | mixed ms | per-prompt ms | ratio |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['rows']} | {r['prompts']} | {r['mixed_ms']} | {r['per_prompt_ms']} | "
              f"{r['ratio_per_prompt_over_mixed']} |" for r in fwd]
    return lines


if __name__ == "__main__":
    main()
