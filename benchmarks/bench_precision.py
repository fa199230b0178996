"""bf16 autocast against fp32 (issue 31 item 1): step time and accuracy on MiniLM, CPU.

Three parts, written to ``benchmarks/results/precision.{json,md}``:

* ``norms``: per-example gradient norms (what DP clipping reads) of the prompt/prefix and the
  label-description head's task loss on 32 SST-2 rows, bf16 against fp32 on MiniLM: the
  largest relative difference (the unit tests bound it on a tiny model).
* ``step``: seconds per optimizer step of the trainer (``rapt.tuning.tune.tune``: the backbone pass
  under ``TuneConfig.precision``, heads/loss/clipping in fp32) at batch B = 32, rows of L = 64
  SST-2 tokens, for prompt (150 virtual tokens, the RAPT paper's) and prefix (10) tuning,
  without and with PromptDPSGD (sample rate 1: every step holds the same B rows); plus
  prediction rows/s. fp32 and bf16 interleaved, median of ``--repeats``.
* ``accuracy``: the RAPT benchmark setting (``rapt.demo.DemoConfig.benchmark()``: prefix
  tuning, frozen label-description head, SST-2, 1,000 training / 400 test rows, 4 epochs at
  batch 8 = 500 steps, P ≈ 0.4), the +privatization setting, fp32 and bf16 on the same
  privatized rows, init and data order per seed (paired), with privatized test queries. The
  verdict is the paired difference bf16 − fp32 with its 95 % CI (rapt.stats).

    OMP_NUM_THREADS=2 python -m benchmarks.bench_precision --threads 2 --seeds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from benchmarks._common import command, machine, machine_of
from rapt.config import default_lr
from rapt.data import label_descriptions_for, load_dataset
from rapt.demo import DemoConfig
from rapt.dp import DPConfig
from rapt.models import load_backbone
from rapt.pipeline import Customization, Encoding
from rapt.precision import cpu_has_native_bf16
from rapt.stats import effect_word, mean_ci, paired_difference
from rapt.tuning.reconstruction import text_length_for
from rapt.tuning.tune import TuneConfig, tune

OUT = Path(__file__).resolve().parent / "results"
PRECISIONS = ("fp32", "bf16")


def step_rows(bb, n: int, length: int) -> list[list[int]]:
    """``n`` rows of exactly ``length`` tokens: consecutive SST-2 training text, [CLS] ... [SEP]."""
    words = " ".join(load_dataset("sst2-sentences", "train").texts[:2000]).split()
    tok, rows = bb.tokenizer, []
    for i in range(n):
        ids = tok(" ".join(words[i * length:(i + 1) * length]))["input_ids"]
        rows.append(ids[:length - 1] + [tok.sep_token_id])
    if any(len(r) != length for r in rows):
        raise RuntimeError("a row came out shorter than --length")
    return rows


def step_seconds(bb, rows, method: str, dp: bool, precision: str, steps: int) -> float:
    """Seconds per optimizer step of ``tune`` on ``rows`` (one batch per step)."""
    n = len(rows)
    cfg = TuneConfig(method=method, epochs=steps, batch_size=n, max_length=len(rows[0]),
                     head="linear", precision=precision,
                     dp=DPConfig(noise_multiplier=1.0, sample_rate=1.0, physical_batch_size=n,
                                 noise_seed=0) if dp else None)
    t = tune(bb, rows, [i % 2 for i in range(n)], 2, cfg)
    return t.meta["train_seconds"] / t.meta["steps"]


def predict_rows_per_s(bb, tuned, rows) -> float:
    t = time.perf_counter()
    tuned.predict_proba(bb, rows, batch_size=len(rows))
    return len(rows) / (time.perf_counter() - t)


def part_step(bb, args) -> list[dict]:
    rows = step_rows(bb, args.batch, args.length)
    out = []
    for method in ("prompt", "prefix"):
        for dp in (False, True):
            times: dict[str, list[float]] = {p: [] for p in PRECISIONS}
            for p in PRECISIONS:  # warm-up: oneDNN builds its bf16 kernels on first use
                step_seconds(bb, rows, method, dp, p, 1)
            for r in range(args.repeats):
                for p in (PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]):
                    times[p].append(step_seconds(bb, rows, method, dp, p, args.steps))
            med = {p: statistics.median(v) for p, v in times.items()}
            rec = {"method": method, "dp": dp, "batch": args.batch, "length": args.length,
                   "median_s": med, "all_s": times, "speedup": med["fp32"] / med["bf16"]}
            out.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "all_s"}), flush=True)
    tuned = {p: tune(bb, rows, [i % 2 for i in range(len(rows))], 2,
                     TuneConfig(method="prefix", epochs=1, batch_size=len(rows), head="linear",
                                precision=p)) for p in PRECISIONS}
    rates: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    for _ in range(args.repeats + 1):
        for p in PRECISIONS:
            rates[p].append(predict_rows_per_s(bb, tuned[p], rows))
    med = {p: statistics.median(v[1:]) for p, v in rates.items()}
    out.append({"method": "prefix", "predict": True, "batch": args.batch, "length": args.length,
                "rows_per_s": med, "speedup": med["bf16"] / med["fp32"]})
    print(json.dumps(out[-1]), flush=True)
    return out


def part_norms(bb, args) -> list[dict]:
    from torch.nn import functional as F

    from rapt.dp import DPSGD
    from rapt.tuning.tune import RaptModel, pad_batch

    ds = load_dataset("sst2-sentences", "train").subset(args.batch, seed=0)
    ids, mask = pad_batch([bb.tokenizer(t)["input_ids"][:args.length] for t in ds.texts],
                          bb.tokenizer.pad_token_id)
    out = []
    for method in ("prompt", "prefix"):
        norms = {}
        for p in PRECISIONS:
            cfg = TuneConfig(method=method, head="label-description", precision=p,
                             label_descriptions=label_descriptions_for("sst2-sentences"))
            model = RaptModel(bb, cfg, 2)
            eng = DPSGD(model, DPConfig(noise_multiplier=1.0), len(ds), 1,
                        batch_size=len(ds), seed=0)  # norms only: no step, no noise
            logits, _, _ = model(ids, mask)
            F.cross_entropy(logits, torch.tensor(ds.labels), reduction="none").sum().backward()
            eng.accumulate()
            norms[p] = eng.last_norms.clone()
            eng.close()
        rel = ((norms["bf16"] - norms["fp32"]).abs() / norms["fp32"])
        out.append({"method": method, "rows": len(ds), "max_rel_diff": rel.max().item(),
                    "median_rel_diff": rel.median().item(),
                    "clip_at_1_same": bool(((norms["bf16"] > 1) == (norms["fp32"] > 1)).all())})
        print(json.dumps(out[-1]), flush=True)
    return out


def part_accuracy(bb, args) -> dict:
    over = {k: v for k, v in (("train_size", args.train_size), ("test_size", args.test_size),
                               ("epochs", args.epochs)) if v is not None}
    cfg = DemoConfig.benchmark(target_p=args.target_p, **over)
    train = load_dataset(cfg.dataset, "train").subset(cfg.train_size, seed=cfg.seed)
    test = load_dataset(cfg.dataset, "dev").subset(cfg.test_size, seed=cfg.seed)
    n_text, _ = text_length_for(bb.tokenizer, train.texts, cfg.whole_fraction)
    base = dict(method=cfg.method, num_virtual_tokens=cfg.num_virtual_tokens,
                lr=default_lr(cfg.method), epochs=cfg.epochs, batch_size=cfg.batch_size,
                max_length=n_text, head="label-description",
                label_descriptions=label_descriptions_for(cfg.dataset))
    runs: list[dict] = []
    for seed in range(args.seeds):
        custom = Customization.create(bb, Encoding(n_text), target_p=cfg.target_p,
                                      noise_seed=1000 + seed)
        rows = custom.privatize(custom.rows(train.texts), measure=False)
        queries = custom.privatize(custom.rows(test.texts, queries=True), measure=False)
        for p in (PRECISIONS if seed % 2 == 0 else PRECISIONS[::-1]):
            run = Customization(bb, custom.encoding, TuneConfig(**base, seed=seed, precision=p))
            t = time.perf_counter()
            tuned = run.tune(rows, train.labels, len(train.label_names))
            pred = run.predict(queries)
            acc = sum(int(a == b) for a, b in zip(pred, test.labels, strict=True)) / len(pred)
            runs.append({"seed": seed, "precision": p, "accuracy": acc,
                         "train_seconds": tuned.meta["train_seconds"],
                         "steps": tuned.meta["steps"], "seconds": time.perf_counter() - t,
                         "loadavg": list(os.getloadavg())})
            print(json.dumps(runs[-1]), flush=True)
    return summarize(runs, {"config": "DemoConfig.benchmark(), +privatization",
                            "target_p": cfg.target_p, "train": len(train), "test": len(test),
                            "text_length": n_text, **base})


def summarize(runs: list[dict], settings: dict) -> dict:
    by = {p: sorted((r for r in runs if r["precision"] == p), key=lambda r: r["seed"])
          for p in PRECISIONS}
    acc = {p: [r["accuracy"] for r in by[p]] for p in PRECISIONS}
    d = paired_difference(acc["bf16"], acc["fp32"])
    sec = {p: statistics.median(r["train_seconds"] / r["steps"] for r in by[p])
           for p in PRECISIONS}
    return {"settings": settings, "runs": runs,
            "accuracy": {p: dict(zip(("mean", "ci95"), mean_ci(acc[p]), strict=True))
                         for p in PRECISIONS},
            "paired_bf16_minus_fp32": d, "verdict": f"bf16 {effect_word(d)} to accuracy",
            "step_seconds_median": sec, "speedup": sec["fp32"] / sec["bf16"]}


def markdown(res: dict) -> str:
    m = machine_of(res)
    lines = ["# bf16 autocast vs fp32 (MiniLM, CPU)", "", f"Command: `{res['command']}`  ",
             f"Machine: {m['platform']}, {m['cpu_count']} CPUs, torch {m['torch']}, "
             f"{m['threads']} threads, native bf16: {m['native_bf16']}; load average "
             f"{m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end.", ""]
    if res.get("norms"):
        lines += ["## Per-example gradient norms (DP clipping's input)", "",
                  "| method | rows | max relative difference | median | same side of C = 1 |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['method']} | {r['rows']} | {r['max_rel_diff']:.2e} | "
                  f"{r['median_rel_diff']:.2e} | {'yes' if r['clip_at_1_same'] else 'no'} |"
                  for r in res["norms"]]
        lines.append("")
    if res.get("step"):
        lines += ["## Optimizer step and prediction", "",
                  "| method | DP | B × L | fp32 | bf16 | speed-up |", "|---|---|---|---|---|---|"]
        for r in res["step"]:
            if r.get("predict"):
                lines.append(f"| {r['method']} predict | | {r['batch']} × {r['length']} | "
                             f"{r['rows_per_s']['fp32']:.0f} rows/s | "
                             f"{r['rows_per_s']['bf16']:.0f} rows/s | {r['speedup']:.2f}× |")
            else:
                lines.append(f"| {r['method']} | {'yes' if r['dp'] else 'no'} | {r['batch']} × "
                             f"{r['length']} | {r['median_s']['fp32']:.3f} s | "
                             f"{r['median_s']['bf16']:.3f} s | {r['speedup']:.2f}× |")
        lines.append("")
    if res.get("accuracy"):
        a = res["accuracy"]
        d = a["paired_bf16_minus_fp32"]
        lines += ["## Accuracy: RAPT benchmark setting (+privatization)", "",
                  f"prefix tuning, SST-2, {a['settings']['train']} training / "
                  f"{a['settings']['test']} test rows, P ≈ {a['settings']['target_p']}, "
                  f"{d['n']} paired seeds.", "",
                  "| precision | accuracy (mean ± 95 % CI) | per seed | s / step (median) |",
                  "|---|---|---|---|"]
        for p in PRECISIONS:
            seeds = ", ".join(f"{r['accuracy']:.3f}" for r in a["runs"] if r["precision"] == p)
            lines.append(f"| {p} | {a['accuracy'][p]['mean']:.3f} ± "
                         f"{a['accuracy'][p]['ci95']:.3f} | {seeds} | "
                         f"{a['step_seconds_median'][p]:.3f} |")
        loads = {p: [r["loadavg"][0] for r in a["runs"] if r["precision"] == p]
                 for p in PRECISIONS}
        lines += ["", f"bf16 − fp32 = {100 * d['mean_diff']:+.1f} ± {100 * d['ci95']:.1f} "
                  f"points (95 % CI, {d['n']} paired seeds): {a['verdict']}; training "
                  f"{a['speedup']:.2f}× faster per step (medians over the seeds; load average "
                  "at the end of each run: " + "; ".join(
                      f"{p} {min(v):.1f}–{max(v):.1f}" for p, v in loads.items())
                  + ": the step table above, interleaved, is the cleaner speed figure)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="norms,step,accuracy")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--target-p", type=float, default=0.4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="steps per timed run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--train-size", type=int, help="smoke runs only (default: the benchmark's)")
    ap.add_argument("--test-size", type=int, help="smoke runs only")
    ap.add_argument("--epochs", type=int, help="smoke runs only")
    ap.add_argument("--out", type=Path, default=OUT / "precision")
    ap.add_argument("--render", action="store_true",
                    help="only rewrite the .md from the existing .json")
    args = ap.parse_args()
    if args.render:
        res = json.loads(args.out.with_suffix(".json").read_text())
        args.out.with_suffix(".md").write_text(markdown(res))
        return
    torch.set_num_threads(args.threads)
    res: dict = {"command": command(), "machine": machine(native_bf16=cpu_has_native_bf16())}
    bb = load_backbone("minilm")
    t0 = time.perf_counter()
    parts = args.parts.split(",")
    if "norms" in parts:
        res["norms"] = part_norms(bb, args)
    if "step" in parts:
        res["step"] = part_step(bb, args)
    if "accuracy" in parts:
        res["accuracy"] = part_accuracy(bb, args)
    res["machine"]["loadavg_end"] = list(os.getloadavg())
    res["wall_seconds"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
