"""Mixed-task passes vs one pass per prompt (issue 14), soft prompts, prefixes and LoRA.

In-process: rows/s for one batch of 64 rows spread over 1, 4, 16 and 64 distinct prompts of one
method, through the mixed path (``rapt.service.mixed.forward``) and the per-prompt path
(``rapt.service.inference.per_prompt_forward``), measured in alternation in one run so the
machine's load hits both alike; each setting also records the largest difference between the
two paths' probabilities. Then, unless ``--no-service``, the service on loopback: two servers
on one store with 16 prefix prompts, one with the per-prompt forward (before issue 14) and one
with the default mixed forward (after), taking turns under 16 concurrent clients sending
one-row requests. Prompts carry random weights: the speed of a pass does not depend on them.

    python -m benchmarks.bench_mixed                 # MiniLM, a few minutes on 2 busy cores
    python -m benchmarks.bench_mixed --quick         # tiny random BERT, seconds

Writes benchmarks/results/mixed.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from benchmarks._common import (
    RESULTS,
    command,
    machine,
    machine_of,
    save_png,
    write_json,
    write_md,
)
from benchmarks.bench_service import Server, load, summarize, tiny_backbone

METHODS = {"prompt": {"num_virtual_tokens": 20}, "prefix": {"num_virtual_tokens": 10},
           "lora": {"lora_r": 8}}  # rapt's defaults; prefix length 10 as in RAPT


def synthetic_prompts(bb, method: str, n: int, seed: int = 0, **config) -> list:
    """``n`` TunedPrompts of ``method`` with random weights, built from one model's tensor
    layout (for LoRA: one private copy of the backbone, not n)."""
    from rapt.tuning.tune import RaptModel, TuneConfig, TunedPrompt

    cfg = TuneConfig(method=method, **{**METHODS[method], **config})
    layout = {k: v.shape for k, v in RaptModel(bb, cfg, 2).trainable_tensors().items()}
    meta = {"backbone": bb.name, "hidden_size": bb.hidden_size, "num_labels": 2}
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(seed * 100_003 + i)
        out.append(TunedPrompt(cfg, {k: 0.05 * torch.randn(s, generator=g)
                                     for k, s in layout.items()}, dict(meta)))
    return out


def synthetic_runner(backbone, data, params, *, progress, should_stop, checkpoint, resume):
    """Service job runner for the loopback part: a random prompt of the job's method, no
    training (the benchmark measures inference)."""
    method = params.get("method", "prompt")
    p = synthetic_prompts(backbone, method, 1, seed=int(params.get("seed", 0)),
                          num_virtual_tokens=int(params.get("num_virtual_tokens", 10)))[0]
    p.meta["num_labels"] = data.num_labels
    progress({"step": 1, "total_steps": 1, "loss": 0.0, "epoch": 0})
    return p


def make_rows(bb, n: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    """``n`` rows of lo..hi random ordinary tokens between [CLS] and [SEP]."""
    g = torch.Generator().manual_seed(seed)
    special = set(bb.special_ids)
    pool = torch.tensor([i for i in range(bb.embeddings.shape[0]) if i not in special])
    tok = bb.tokenizer
    rows = []
    for _ in range(n):
        k = int(torch.randint(lo, hi + 1, (1,), generator=g))
        body = pool[torch.randint(len(pool), (k,), generator=g)].tolist()
        rows.append([tok.cls_token_id, *body, tok.sep_token_id])
    return rows


def forward_bench(bb, rows: list[list[int]], counts: list[int], rounds: int) -> list[dict]:
    """Rows/s of the mixed and per-prompt paths per method and number of distinct prompts."""
    from rapt.service import mixed
    from rapt.service.inference import per_prompt_forward
    from rapt.tuning.tuners import base_model

    paths = {"mixed": mixed.forward, "per_prompt": per_prompt_forward}
    passes: list[int] = []
    hook = base_model(bb.model).register_forward_hook(lambda *a: passes.append(1))
    settings = []
    for method in METHODS:
        prompts = synthetic_prompts(bb, method, max(counts), seed=1)
        for k in counts:
            items = [(prompts[i], rows[i::k]) for i in range(k)]
            s = {"method": method, "prompts": k, "rows": len(rows), "items": items,
                 "seconds": {p: [] for p in paths}, "passes": {}}
            with torch.inference_mode():
                outs = {}
                for name, f in paths.items():  # warm-up: builds per-prompt models, caches
                    passes.clear()
                    outs[name] = f(bb, items)
                    s["passes"][name] = len(passes) if name == "mixed" else k
                s["max_abs_diff"] = max(float((a - b).abs().max()) for a, b in
                                        zip(outs["mixed"], outs["per_prompt"], strict=True))
            settings.append(s)
    hook.remove()
    for r in range(rounds):  # interleaved: every setting and path once per round
        for s in settings:
            order = list(paths) if r % 2 == 0 else list(paths)[::-1]
            for name in order:
                with torch.inference_mode():
                    t = time.perf_counter()
                    paths[name](bb, s["items"])
                    s["seconds"][name].append(time.perf_counter() - t)
    def paired(num: list[float], den: list[float]) -> float:
        """Median over rounds of a throughput ratio (time num / time den) measured seconds
        apart: far steadier under a changing load than a ratio of medians."""
        return round(statistics.median(n / d for n, d in zip(num, den, strict=True)), 2)

    out = []
    for s in settings:
        one = next(o for o in settings if o["method"] == s["method"] and o["prompts"] == 1)
        mixed_t, pp_t = s["seconds"]["mixed"], s["seconds"]["per_prompt"]
        rec = {k: s[k] for k in ("method", "prompts", "rows", "passes")}
        for name, ts in s["seconds"].items():
            rec[f"{name}_rows_per_s"] = round(s["rows"] / statistics.median(ts), 1)
            rec[f"{name}_seconds"] = [round(t, 4) for t in ts]
        rec["mixed_over_per_prompt"] = paired(pp_t, mixed_t)
        # against one prompt's throughput, on either path
        rec["mixed_over_single_mixed"] = paired(one["seconds"]["mixed"], mixed_t)
        rec["mixed_over_single_per_prompt"] = paired(one["seconds"]["per_prompt"], mixed_t)
        rec["max_abs_diff"] = s["max_abs_diff"]
        out.append(rec)
    return out


# ------------------------------------------------------------------ loopback service


def serve(args: argparse.Namespace) -> None:
    """Server mode (a subprocess of the benchmark): the service with the synthetic runner and
    the chosen forward."""
    import uvicorn

    from rapt.models import load_backbone
    from rapt.service import ServiceConfig, create_app
    from rapt.service.inference import default_forward, per_prompt_forward

    torch.set_num_threads(1)
    bb = load_backbone(args.backbone)
    cfg = ServiceConfig(db_path=Path(args.db), backbones=["bench"], progress_interval_s=0.0)
    forward = per_prompt_forward if args.serve == "per-prompt" else default_forward
    app = create_app(cfg, backbones={"bench": bb}, runner=synthetic_runner, forward=forward)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


def mixed_serve(forward: str, db: Path, backbone: str) -> list[str]:
    """This module in server mode (port appended by bench_service.Server)."""
    return [sys.executable, "-m", "benchmarks.bench_mixed", "--serve", forward, "--db", str(db),
            "--backbone", backbone]


def service_bench(backbone: str, rows: list[list[int]], n_prompts: int, threads: int,
                  requests: int, rounds: int, tmp: Path) -> dict:
    """16 prefix prompts, ``threads`` clients: per-prompt forward vs mixed forward."""
    from rapt.service import auth
    from rapt.service.store import Store

    db = tmp / "svc.db"
    store = Store(db)
    key = auth.new_key()
    store.add_key("bench", auth.hash_key(key), admin=True)  # /v1/stats needs an admin key
    store.close()
    before = Server(mixed_serve("per-prompt", db, backbone), tmp / "before.log")
    try:
        http = httpx.Client(base_url=before.url, headers={"Authorization": f"Bearer {key}"},
                            timeout=120)
        ds = http.post("/v1/datasets", json={
            "backbone": "bench", "input_ids": rows[:8], "labels": [i % 2 for i in range(8)],
            "num_labels": 2, "privacy": {"mechanism": "dchi-text2text", "eta": 100.0}}).json()
        prompts = []
        for s in range(n_prompts):
            jid = http.post("/v1/jobs", json={"dataset_id": ds["id"], "method": "prefix",
                                              "num_virtual_tokens": 10, "seed": s}).json()["id"]
            while (st := http.get(f"/v1/jobs/{jid}").json())["state"] in ("queued", "running"):
                time.sleep(0.05)
            if st["state"] != "succeeded":
                raise SystemExit(f"job failed: {st}")
            prompts.append(st["prompt_id"])
        http.close()
        after = Server(mixed_serve("mixed", db, backbone), tmp / "after.log")
        try:
            parts: dict[str, list[dict]] = {"before": [], "after": []}
            for r in range(rounds):  # the two servers take turns
                for name, srv in ((("before", before), ("after", after)) if r % 2 == 0
                                  else (("after", after), ("before", before))):
                    parts[name].append(load(srv.url, key, prompts, rows, requests // rounds,
                                            threads))
        finally:
            after.stop()
    finally:
        before.stop()
    out = {name: summarize(p, threads) for name, p in parts.items()}
    out["speedup_requests_per_s"] = round(out["after"]["requests_per_s"]
                                          / out["before"]["requests_per_s"], 2)
    out["prompts"] = n_prompts
    return out


# ------------------------------------------------------------------ report


def write_report(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out.with_suffix(".json"), result, indent=1)
    m, s = machine_of(result), result["settings"]
    rows = result["forward"]
    lines = [
        f"# Mixed-task passes vs one pass per prompt ({s['backbone']})", "",
        f"`{result['command']}` — {m['platform']}, {m['cpu_count']} CPUs, torch {m['torch']}, "
        f"{m['threads']} intra-op thread(s); load average (1, 5, 15 min) at start "
        f"{', '.join(f'{x:.1f}' for x in m['loadavg_start'])}, at end "
        f"{', '.join(f'{x:.1f}' for x in m['loadavg_end'])}.", "",
        f"On {s.get('device', 'cpu')}"
        f"{' (' + m['gpu'] + ')' if m.get('gpu') else ''}; absolute rows/s move with the load "
        "above. Every setting and path was "
        f"measured once per round, {s['rounds']} rounds; rows/s are medians, ratios are medians "
        "of per-round ratios (measurements seconds apart), the comparable numbers.", "",
        f"One batch of {s['rows']} rows ({s['row_tokens']} tokens with [CLS]/[SEP]) spread "
        "evenly over k distinct prompts; prompt tuning 20 virtual tokens, prefix tuning 10, "
        "LoRA r = 8 on query/value; linear head, 2 labels, random weights. *single* = the "
        "same method with k = 1.", "",
        "| method | k prompts | mixed rows/s | per-prompt rows/s | mixed / per-prompt "
        "| mixed / single (mixed) | mixed / single (per-prompt) | passes mixed | max abs diff |",
        "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['prompts']} | {r['mixed_rows_per_s']} | "
            f"{r['per_prompt_rows_per_s']} | {r['mixed_over_per_prompt']} | "
            f"{r['mixed_over_single_mixed']} | {r['mixed_over_single_per_prompt']} | "
            f"{r['passes']['mixed']} | {r['max_abs_diff']:.1e} |")
    lines += ["", "Goals:", ""]
    for g in result["goals"]:
        lines.append(f"- {g}")
    if (any("NOT met" in g for g in result["goals"]) and s.get("device", "cpu") == "cpu"
            and not s["backbone"].startswith("tiny")):
        lines += ["", "On a CPU a pass costs about the same per token whatever the batch, so 64 "
                  "one-row passes cost one 64-row pass plus 63 per-pass overheads; a speed-up "
                  "of 4x from sharing passes needs hardware on which one row costs about as "
                  "much as a full batch (a GPU: none in this session). The tiny random BERT "
                  "run (`--quick`, `mixed_tiny.md`), where per-pass overhead dominates, shows "
                  "that regime. Beside speed, the per-prompt path built one private copy of "
                  f"the backbone per LoRA prompt ({s['backbone_mb']} MB each, "
                  f"{max(s['counts'])} at k = {max(s['counts'])}); the mixed path builds none."]
    lines += _service_lines(result.get("service"))
    write_md(out.with_suffix(".md"), lines)
    _plot(rows, s, out)


def _service_lines(svc: dict | None) -> list[str]:
    """The report's section on the two servers, when the service part ran."""
    if not svc:
        return []
    lines = ["", f"## Service on loopback: {svc['prompts']} prefix prompts, "
             f"{svc['before']['threads']} concurrent clients, 1 row per request", "",
             "Two servers on one store take turns in rounds: *before* serves with the "
             "per-prompt forward (a pass per distinct prompt in a micro-batch, as before "
             "issue 14), *after* with the default mixed forward.", "",
             "| server | requests/s | p50 ms | p95 ms | requests per forward pass "
             "| errors |", "|---|---|---|---|---|---|"]
    for name in ("before", "after"):
        r = svc[name]
        lines.append(f"| {name} | {r['requests_per_s']} | {r['p50_ms']} | {r['p95_ms']} | "
                     f"{r['requests_per_pass']} | {r['errors']} |")
    return lines + ["", f"requests/s after / before: {svc['speedup_requests_per_s']}"]


def _plot(rows: list[dict], s: dict, out: Path) -> None:
    """rows/s against the number of distinct prompts, one panel per method (needs
    matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(METHODS), figsize=(4 * len(METHODS), 3.4), sharey=True)
    for ax, method in zip(axes, METHODS, strict=True):
        rs = [r for r in rows if r["method"] == method]
        ks = [r["prompts"] for r in rs]
        for name, style in (("mixed", "o-"), ("per_prompt", "s--")):
            ax.plot(ks, [r[f"{name}_rows_per_s"] for r in rs], style,
                    label=name.replace("_", "-"))
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_title(method)
        ax.set_xlabel("distinct prompts in the batch")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"rows/s (batch of {s['rows']}, under load)")
    axes[0].legend()
    fig.suptitle(f"{s['backbone']}: mixed pass vs one pass per prompt")
    fig.tight_layout()
    save_png(fig, out.with_suffix(".png"))


def goals(rows: list[dict]) -> list[str]:
    out = []
    for method in METHODS:
        r16 = next(r for r in rows if r["method"] == method and r["prompts"] == 16)
        r64 = next(r for r in rows if r["method"] == method and r["prompts"] == 64)
        keep = min(r16["mixed_over_single_mixed"], r16["mixed_over_single_per_prompt"])
        out.append(f"{method}: 16 prompts keep {r16['mixed_over_single_mixed']}x (vs mixed k=1) "
                   f"/ {r16['mixed_over_single_per_prompt']}x (vs per-prompt k=1) of the "
                   f"single-prompt throughput (goal >= 0.85: {'met' if keep >= 0.85 else 'NOT met'}"
                   f"); at 64 prompts mixed / per-prompt = {r64['mixed_over_per_prompt']}x "
                   f"(goal >= 4: {'met' if r64['mixed_over_per_prompt'] >= 4 else 'NOT met'})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backbone", default="minilm")
    ap.add_argument("--device", default="cpu", help="forward part only (the service runs on "
                    "the CPU: use --no-service elsewhere)")
    ap.add_argument("--quick", action="store_true", help="tiny random BERT, seconds")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--row-tokens", default="12,30", help="min,max tokens between the specials")
    ap.add_argument("--counts", default="1,4,16,64")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--no-service", action="store_true", help="skip the loopback part")
    ap.add_argument("--service-prompts", type=int, default=16)
    ap.add_argument("--service-clients", type=int, default=16)
    ap.add_argument("--service-requests", type=int, default=320)
    ap.add_argument("--out", default=str(RESULTS / "mixed"))
    ap.add_argument("--from-json", help="only rewrite the .md and .png from this result")
    ap.add_argument("--serve", choices=["per-prompt", "mixed"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args)
    if args.from_json:
        return write_report(json.loads(Path(args.from_json).read_text()), Path(args.out))
    load_start = os.getloadavg()
    t_start = time.time()
    torch.set_num_threads(args.threads)
    from rapt.models import load_backbone

    tmp = Path(tempfile.mkdtemp(prefix="rapt-bench-mixed-"))
    backbone = tiny_backbone(tmp / "tiny") if args.quick else args.backbone
    if args.device != "cpu" and not args.no_service:
        raise SystemExit("--device: the loopback service part runs on the CPU; add --no-service")
    bb = load_backbone(backbone, device=args.device)
    lo, hi = (int(x) for x in args.row_tokens.split(","))
    rows = make_rows(bb, args.rows, lo, hi)
    counts = [int(x) for x in args.counts.split(",")]
    fwd = forward_bench(bb, rows, counts, args.rounds)
    service = None
    if not args.no_service:
        service = service_bench(backbone, rows, args.service_prompts, args.service_clients,
                                60 if args.quick else args.service_requests,
                                2 if args.quick else 4, tmp)
    result = {
        "command": command(),
        "machine": machine(gpu=(torch.cuda.get_device_name(args.device)
                                if args.device.startswith("cuda") else None),
                           loadavg_start=list(load_start), loadavg_end=list(os.getloadavg())),
        "settings": {"backbone": "tiny-random-bert" if args.quick else backbone,
                     "rows": len(rows), "row_tokens": f"{lo + 2}-{hi + 2}", "device": args.device,
                     "backbone_mb": round(sum(p.numel() * p.element_size()
                                              for p in bb.model.parameters()) / 2**20, 1),
                     "counts": counts, "rounds": args.rounds, "methods": METHODS},
        "forward": fwd,
        "goals": goals(fwd) if {16, 64} <= set(counts) and 1 in counts else [],
        "service": service,
        "seconds": round(time.time() - t_start, 1),
    }
    write_report(result, Path(args.out))
    print(Path(args.out).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
