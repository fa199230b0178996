"""SAP over HTTP: bytes on the wire and the cost of the round trip (issue 11).

1. **Bytes** per training example and per query, frozen vs unfrozen bottom, at every split
   position of MiniLM (n = 0..5), for SST-2 training rows (max_length 64, batch 32). Exact:
   every message is encoded with :func:`rapt.split.wire.encode` from its real shapes (zeros in
   place of values; safetensors' length depends only on shapes and dtypes), batches and
   release chunks formed as ``train_split`` / ``RemoteProvider`` form them. The bottom the
   customer downloads once is counted apart.
2. **Step latency** over loopback: a real `rapt serve` subprocess (uvicorn) holds the top; the
   client drives ``train_split`` through :class:`rapt.split.remote.RemoteProvider`. The same
   configuration runs in-process (``ProviderSession``) interleaved with it, in chunks of steps,
   so both see the same machine load. Goal: HTTP adds <= 25 % to a step (MiniLM, batch 32).
   The bodies the client really sent and received are compared with the computed sizes.

Both processes use one intra-op thread (OMP_NUM_THREADS=1). No privatization in the timed
steps (``no_privacy``): it is customer-side work that is the same in both loops, so leaving it
out makes the measured overhead a conservative (larger) ratio.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_sap_service            # MiniLM
    OMP_NUM_THREADS=1 python -m benchmarks.bench_sap_service --quick    # tiny BERT, seconds
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

from benchmarks._common import RESULTS, machine, write_json, write_md
from benchmarks.bench_service import Server, rapt_serve, tiny_backbone


def message_bytes(hidden: int, lengths: list[int], config, n_examples: int) -> dict:
    """Bytes per example of one training run's messages, from shapes only: the frozen
    release, then per epoch (every batch as train_split forms it)."""
    from rapt.split import (
        ActivationGrad,
        Activations,
        BatchRef,
        OutputGrad,
        Release,
        TopOutput,
    )
    from rapt.split.wire import encode, pad_rows

    def acts(cls, first, rows):
        return len(encode(cls(first, *pad_rows([torch.zeros(lengths[i], hidden)
                                                 for i in rows]))))

    # release chunks as RemoteProvider.upload_release cuts them (~8 MiB)
    per_chunk = max(1, (8 << 20) // (config.max_length * hidden * 4))
    release = 0
    for s in range(0, n_examples, per_chunk):
        n = lengths[s:s + per_chunk]
        release += len(encode(Release(s, torch.zeros(sum(n), hidden),
                                      torch.tensor(n, dtype=torch.int32))))
    g = torch.Generator().manual_seed(config.seed * 1_000_003)  # epoch 0's order
    frozen_up = frozen_down = unfrozen_up = unfrozen_down = 0
    ack = len(json.dumps({"step": 0, "last_step": 0, "replayed": False}, separators=(",", ":")))
    for k, idx in enumerate(torch.randperm(n_examples, generator=g).split(config.batch_size)):
        rows = idx.tolist()
        B = len(rows)
        top = len(encode(TopOutput(k, torch.zeros(B, hidden))))
        grad = len(encode(OutputGrad(k, torch.zeros(B, hidden))))
        frozen_up += len(encode(BatchRef(k, torch.tensor(rows, dtype=torch.int32)))) + grad
        frozen_down += top + ack
        a = acts(Activations, k, rows)
        n = max(lengths[i] for i in rows)
        unfrozen_up += a + grad
        lens = torch.tensor([lengths[i] for i in rows])
        unfrozen_down += top + len(encode(ActivationGrad(k, torch.zeros(B, n, hidden)),
                                          lengths=lens))
    N = n_examples
    return {"release_up": release / N,
            "frozen_epoch_up": frozen_up / N, "frozen_epoch_down": frozen_down / N,
            "unfrozen_epoch_up": unfrozen_up / N, "unfrozen_epoch_down": unfrozen_down / N}


def query_bytes(hidden: int, lengths: list[int], batch: int) -> dict:
    from rapt.split import Activations, TopOutput
    from rapt.split.wire import encode, pad_rows

    up = down = 0
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])  # as predict_split batches
    for s in range(0, len(order), batch):
        rows = order[s:s + batch]
        up += len(encode(Activations(0, *pad_rows([torch.zeros(lengths[i], hidden)
                                                   for i in rows]))))
        down += len(encode(TopOutput(0, torch.zeros(len(rows), hidden))))
    return {"up": up / len(lengths), "down": down / len(lengths)}


def timed(customer, provider, stop_at: int, times: list[float]) -> None:
    """Run train_split up to ``stop_at`` applied steps, appending each step's seconds."""
    from rapt.split import train_split

    last = [time.perf_counter()]

    def progress(_: dict) -> None:
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    train_split(customer, provider, progress=progress,
                should_stop=lambda: provider.step >= stop_at)


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny random BERT (plumbing check)")
    ap.add_argument("--steps", type=int, default=16, help="timed steps per path and mode")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=1, help="steps per interleaved chunk")
    ap.add_argument("--split", type=int, default=2, help="split position of the timed runs")
    ap.add_argument("--size-examples", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=64)
    return ap.parse_args()


def main() -> None:
    args = _parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    host = machine()
    from rapt.client.client import RaptClient
    from rapt.data import load_dataset
    from rapt.models import load_backbone
    from rapt.service import Limits, auth
    from rapt.service.split_sessions import SplitSessions
    from rapt.service.store import Store
    from rapt.split import SplitConfig, encode_texts

    tmp = Path(tempfile.mkdtemp(prefix="bench-sap-"))
    name = tiny_backbone(tmp / "tiny") if args.quick else "minilm"
    bb = load_backbone(name)
    layers = int(bb.model.config.num_hidden_layers)
    data = load_dataset("sst2", "train").subset(args.size_examples, seed=0)
    rows = encode_texts(bb.tokenizer, data.texts, args.max_length)
    lengths = [len(r) for r in rows]
    h = bb.hidden_size
    bottoms = SplitSessions(None, {name: bb}, Limits())  # the server's own bottom export
    sizes = []
    for n in range(layers):
        cfg = SplitConfig(split_layer=n, batch_size=args.batch_size, max_length=args.max_length)
        sizes.append({"split_layer": n, "bottom_bytes": len(bottoms.bottom(name, n)[0]),
                      **message_bytes(h, lengths, cfg, len(rows)),
                      "query_b64": query_bytes(h, lengths, 64),
                      "query_b1": query_bytes(h, lengths[:200], 1)})
        print(f"n={n}: bottom {sizes[-1]['bottom_bytes'] / 1e6:.1f} MB", flush=True)
    del bottoms

    # -- latency over loopback --------------------------------------------------------------
    n_timed = args.warmup + args.steps
    train = data.subset(args.batch_size * n_timed, seed=1)
    trows = encode_texts(bb.tokenizer, train.texts, args.max_length)
    labels = [i % 2 for i in range(len(trows))]  # timing only: labels do not change the cost
    db = tmp / "svc.db"
    key = auth.new_key()
    store = Store(db)
    store.add_key("bench", auth.hash_key(key))
    store.close()
    srv = Server(rapt_serve(db, name), tmp / "server.log")
    runs = {}
    try:
        c = RaptClient(srv.url, key, backbone=bb, remote_backbone=name, no_privacy=True,
                       timeout=600)
        for unfreeze in (False, True):
            mode = "unfrozen" if unfreeze else "frozen"
            runs[mode] = _time_mode(args, bb, c, trows, labels, tmp, unfreeze)
    finally:
        srv.stop()
    result = {
        "command": "OMP_NUM_THREADS=1 python -m benchmarks.bench_sap_service"
                   + (" --quick" if args.quick else ""),
        "backbone": name, "hidden_size": h, "batch_size": args.batch_size,
        "max_length": args.max_length, "size_examples": len(rows),
        "mean_tokens": statistics.mean(lengths), "sizes": sizes, "latency": runs,
        "goal_overhead": 0.25,
        "machine": {**host, "loadavg_end": list(os.getloadavg())}}
    stem = "sap_service_tiny" if args.quick else "sap_service"
    RESULTS.mkdir(exist_ok=True)
    write_json(RESULTS / f"{stem}.json", result, indent=1)
    write_md(RESULTS / f"{stem}.md", markdown(result))
    plot(result, RESULTS / f"{stem}.png")
    print(f"wrote {RESULTS / stem}.{{json,md,png}}")


def _time_mode(args, bb, c, trows: list, labels: list, tmp: Path, unfreeze: bool) -> dict:
    """One mode (frozen or unfrozen bottom) timed step by step, in-process and over HTTP on
    the same batches, interleaved in chunks; with the bytes measured and computed."""
    from rapt.split import SplitConfig, setup_split

    mode, h = "unfrozen" if unfreeze else "frozen", bb.hidden_size
    n_timed = args.warmup + args.steps
    cfg = SplitConfig(split_layer=args.split, batch_size=args.batch_size,
                      max_length=args.max_length, epochs=1, unfreeze_bottom=unfreeze)
    cl, pl = setup_split(bb, cfg, 2, len(trows))
    cl.load(trows, labels)
    cr = c.sap_customer(cfg, 2, cache_dir=tmp / "cache")
    cr.load(trows, labels)
    pr = c.sap_provider(c.sap_session(cfg, len(trows)), cr)
    t0 = time.perf_counter()
    if not unfreeze:
        pr.upload_release()
    upload_s = time.perf_counter() - t0
    local, remote = [], []
    for stop in range(args.chunk, n_timed + args.chunk, args.chunk):
        stop = min(stop, n_timed)
        timed(cl, pl, stop, local)
        timed(cr, pr, stop, remote)
    local, remote = local[args.warmup:], remote[args.warmup:]
    expect = message_bytes(h, [len(r) for r in trows], cfg, len(trows))
    N = len(trows)
    computed_up = N * (expect["unfrozen_epoch_up"] if unfreeze else
                       expect["release_up"] + expect["frozen_epoch_up"])
    computed_down = N * (expect["unfrozen_epoch_down"] if unfreeze else
                         expect["frozen_epoch_down"])
    med_l, med_r = statistics.median(local), statistics.median(remote)
    run = {
        "split_layer": args.split, "steps_timed": len(remote),
        "local_s": local, "remote_s": remote,
        "local_median_s": med_l, "remote_median_s": med_r,
        "local_mean_s": statistics.mean(local), "remote_mean_s": statistics.mean(remote),
        "overhead_median": med_r / med_l - 1,
        # step i is the same batch on both paths, run back to back: the paired ratio
        # cancels most of the load swings between steps
        "overhead_paired_median": statistics.median(
            a / b for a, b in zip(remote, local, strict=True)) - 1,
        "overhead_mean": statistics.mean(remote) / statistics.mean(local) - 1,
        "release_upload_s": upload_s,
        "measured_bytes_up": pr.bytes_sent, "measured_bytes_down": pr.bytes_received,
        "computed_bytes_up": computed_up, "computed_bytes_down": computed_down}
    print(f"{mode}: in-process {med_l * 1000:.0f} ms, HTTP {med_r * 1000:.0f} ms per "
          f"step (median), overhead {100 * run['overhead_median']:+.1f} %, "
          f"paired {100 * run['overhead_paired_median']:+.1f} %; "
          f"bytes sent {pr.bytes_sent} (computed {computed_up:.0f})", flush=True)
    return run


def markdown(r: dict) -> str:
    kb = lambda b: f"{b / 1024:.1f}"  # noqa: E731
    m = r["machine"]
    out = [f"# SAP over HTTP: bytes on the wire and step latency ({r['backbone']})", "",
           f"`{r['command']}` — {m['platform']}, {m['cpu_count']} cores (shared), torch "
           f"{m['torch']}, {m['threads']} thread per process; load average "
           f"{m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at the end.", "",
           f"## Bytes per example (KiB), SST-2 train, {r['size_examples']} rows, mean "
           f"{r['mean_tokens']:.1f} tokens, max_length {r['max_length']}, batch "
           f"{r['batch_size']}, hidden {r['hidden_size']} float32", "",
           "Exact (every message encoded from its shapes). A frozen bottom uploads its release "
           "once, then per epoch sends row indices and ∂l/∂g and receives g; an unfrozen one "
           "sends activations and receives ∂l/∂hidden every epoch. E epochs cost `release + E "
           "× epoch`. Queries: activations up, g down.", "",
           "| split n | bottom download (MB, once) | frozen: release up | frozen: per epoch "
           "up / down | frozen, 3 epochs | unfrozen: per epoch up / down | unfrozen, 3 epochs "
           "| query up / down (batch 64) | single query up / down |",
           "|---|---|---|---|---|---|---|---|---|"]
    for s in r["sizes"]:
        f3 = s["release_up"] + 3 * (s["frozen_epoch_up"] + s["frozen_epoch_down"])
        u3 = 3 * (s["unfrozen_epoch_up"] + s["unfrozen_epoch_down"])
        out.append(f"| {s['split_layer']} | {s['bottom_bytes'] / 1e6:.1f} | "
                   f"{kb(s['release_up'])} | {kb(s['frozen_epoch_up'])} / "
                   f"{kb(s['frozen_epoch_down'])} | {kb(f3)} | {kb(s['unfrozen_epoch_up'])} / "
                   f"{kb(s['unfrozen_epoch_down'])} | {kb(u3)} | {kb(s['query_b64']['up'])} / "
                   f"{kb(s['query_b64']['down'])} | {kb(s['query_b1']['up'])} / "
                   f"{kb(s['query_b1']['down'])} |")
    out += ["", "Every block outputs (tokens, hidden), so the messages do not depend on the "
            "split position; only the one-time bottom download grows with n.", "",
            f"## Step latency over loopback (split n = "
            f"{next(iter(r['latency'].values()))['split_layer']}, batch {r['batch_size']}), "
            "interleaved with the in-process loop", "",
            "| bottom | steps | in-process median (ms) | HTTP median (ms) | overhead: ratio of "
            "medians | overhead: median of paired ratios | overhead: ratio of means | goal ≤ 25 % "
            "(paired) | bytes sent: measured = computed? (sent / received) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for mode, x in r["latency"].items():
        ok = "met" if x["overhead_paired_median"] <= r["goal_overhead"] else "**not met**"
        same = x["measured_bytes_up"] == x["computed_bytes_up"]
        out.append(f"| {mode} | {x['steps_timed']} | {1000 * x['local_median_s']:.0f} | "
                   f"{1000 * x['remote_median_s']:.0f} | {100 * x['overhead_median']:+.1f} % | "
                   f"{100 * x['overhead_paired_median']:+.1f} % | "
                   f"{100 * x['overhead_mean']:+.1f} % | {ok} | "
                   f"{'yes' if same else 'no'} ({x['measured_bytes_up']} / "
                   f"{x['measured_bytes_down']} B) |")
    fr = r["latency"].get("frozen")
    if fr:
        out += ["", f"The frozen release upload took {fr['release_upload_s']:.2f} s once "
                f"(not in the step times)."]
    out += ["", "The machine is shared (2 cores; other benchmarks and another engineer's "
            "work ran at the same time, see the load averages): the two loops alternate step by "
            "step (the same batch on both paths, back to back), and the median of the per-step "
            "ratios is the figure compared with the goal.", ""]
    return "\n".join(out)


def plot(r: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    s = r["sizes"][0]
    labels = ["frozen\n1 epoch", "frozen\n3 epochs", "unfrozen\n1 epoch", "unfrozen\n3 epochs",
              "query\n(batch 64)"]
    fe = s["frozen_epoch_up"] + s["frozen_epoch_down"]
    ue = s["unfrozen_epoch_up"] + s["unfrozen_epoch_down"]
    vals = [s["release_up"] + fe, s["release_up"] + 3 * fe, ue, 3 * ue,
            s["query_b64"]["up"] + s["query_b64"]["down"]]
    fig, ax = plt.subplots(1, 2, figsize=(8, 3))
    ax[0].bar(labels, [v / 1024 for v in vals], color=["C0", "C0", "C1", "C1", "C2"])
    ax[0].set_ylabel("KiB per example")
    ax[0].set_title("bytes on the wire (any split n)", fontsize=9)
    ax[0].tick_params(labelsize=7)
    lat = r["latency"]
    x = range(len(lat))
    ax[1].bar([i - 0.2 for i in x], [1000 * v["local_median_s"] for v in lat.values()], 0.4,
              label="in-process")
    ax[1].bar([i + 0.2 for i in x], [1000 * v["remote_median_s"] for v in lat.values()], 0.4,
              label="HTTP loopback")
    ax[1].set_xticks(list(x), list(lat))
    ax[1].set_ylabel("ms per step (median)")
    ax[1].set_title(f"step latency, batch {r['batch_size']}", fontsize=9)
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
