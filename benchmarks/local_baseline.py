"""Where does the hosted model win? The local baseline, remote LoRA / prefix, user-side fusion and
the user-side output denoiser over rows x privacy x seeds.

Two phases, because the remote cells want a GPU and the user-side ones only a CPU:

    # 1. remote (GPU, W parallel workers; each finished cell is one .npz, a rerun skips them)
    python -m benchmarks.local_baseline remote --etas ETAS.json --out /tmp/res --workers 8
    # 2. user side and the report (CPU): the local model, fusion, the table, the plot
    python -m benchmarks.local_baseline_report --cells /tmp/res

A cell is (task, rows, P, seed). Its training rows are a seeded random sample of the built-in
training split (``Dataset.subset``: FP's file is in label order, so the first N would be one
class). Per cell, the remote phase tunes on the privatized rows:
- ``lora``: LoRA on every row (the privatized model alone, as ``rapt tune --no-local``);
- ``lora_fuse``: LoRA on the rows outside the held-out slice (``rapt.local.holdout_split``),
  scored on the slice's rows privatized as queries: what ``rapt tune`` does by default;
- ``prefix``: prefix tuning on every row;
- for the denoiser cells, ``lora_fuse``'s pooled states on public sentences (clean and
  privatized twice) fit a :class:`rapt.local.denoise.OutputDenoiser`, applied to the slice and
  the evaluation queries; and ``oracle``: the same prompt on the *clean* evaluation queries
  (what the privatized query costs: an upper bound, not a method).
Every model reads the same privatized evaluation queries (paired). The report phase fits the local
TF-IDF model on the clean rows, fuses on the slice, and writes ``local_baseline.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

TASKS = {"sst2": ("sst2-sentences", "train", ("dev",)),
         "fp": ("financial_phrasebank", "train", ("dev", "test")),
         "trec": ("trec", "train", ("test",))}
NAMES = {"sst2": "SST-2", "fp": "FP", "trec": "TREC"}
ROWS = (100, 250, 500, 1000, 2000, 0)  # 0 = every training row
PS = (None, 0.2, 0.4, 0.6)
SEEDS = (0, 1, 2)
MIN_STEPS = 100  # optimizer steps at least: 3 epochs of 100 rows are 12 steps, not a budget
DENOISE_ROWS = (500, 2000)
PUBLIC_ROWS = 3000  # public sentences the denoiser is fitted on (each privatized twice)
# Noise by kind of token (rapt.privacy.by_kind): name -> (protect, P of the protected classes'
# η, P of the other classes' η or None = in clear, personal data's η or None = the protected
# one[, personal_rank: rare words beyond it get personal data's η]). Frequent = the 1,000 most
# frequent public words; the protected classes are personal data and every rarer word.
MECHS = {"r0.6": ("rare", 0.6, None, None), "r0.6f0.2": ("rare", 0.6, 0.2, None),
         "r0.7": ("rare", 0.7, None, None), "p0.6": ("personal", 0.6, None, None),
         "r0.7z": ("rare", 0.7, None, 0.0), "r0.7z10k": ("rare", 0.7, None, 0.0, 10_000)}
LABELS = {"r0.6": "rare + personal at P 0.6's η, frequent in clear",
          "r0.6f0.2": "rare + personal at P 0.6's η, frequent at P 0.2's",
          "r0.7": "rare + personal at P 0.7's η, frequent in clear",
          "p0.6": "personal only at P 0.6's η, the rest in clear",
          "r0.7z": "rare at P 0.7's η, personal data at η 0, frequent in clear",
          "r0.7z10k": "rare at P 0.7's η, personal data and words beyond 10k at η 0, "
                      "frequent in clear"}


def cell_key(task: str, rows: int, p: float | str | None, seed: int) -> str:
    """``p``: a P (uniform noise), None (clean) or a :data:`MECHS` name."""
    return f"{task}_{rows or 'all'}_{'clean' if p is None else p}_{seed}"


def mechanism(p: float | str | None, etas: dict, spans) -> dict:
    """Customization.create's privacy arguments for a cell's ``p`` (see :func:`cell_key`)."""
    if p is None:
        return {}
    if not isinstance(p, str):
        return {"eta": etas[str(p)]}
    eta, policy = kind_policy(p, etas)
    return {"eta": eta, "personal_spans": spans, "kind_policy": policy}


def kind_policy(name: str, etas: dict):
    """(protected η, KindPolicy) of a :data:`MECHS` name; ``etas``: {P: η}."""
    from rapt.privacy.by_kind import KindPolicy

    protect, strong, other, personal, *rank = MECHS[name]
    return etas[str(strong)], KindPolicy(protect, eta_other=None if other is None
                                         else etas[str(other)], eta_personal=personal,
                                         personal_rank=rank[0] if rank else None)


def class_p(custom, clean, private, texts) -> dict:
    """Measured P per token class (rapt.privacy.by_kind.CLASSES) of a release, and each
    class's share of the tokens."""
    from rapt.privacy.by_kind import CLASSES

    _, _, classes = custom.kind_noise(clean, texts)
    special = set(custom._special_ids())
    n, changed = np.zeros(len(CLASSES)), np.zeros(len(CLASSES))
    for c_row, p_row, k_row in zip(clean, private, classes, strict=True):
        for a, b, k in zip(c_row, p_row, k_row, strict=True):
            if a not in special:
                n[k] += 1
                changed[k] += a != b
    return {name: {"share": n[i] / n.sum(), "p": changed[i] / n[i] if n[i] else None}
            for i, name in enumerate(CLASSES)}


def cells(tasks=tuple(TASKS), rows=ROWS, ps=PS, seeds=SEEDS) -> list[tuple]:
    """Seed-major: a run cut short still leaves whole seeds."""
    return [(t, n, p, s) for s in seeds for p in ps for t in tasks for n in rows]


def sample(task: str, rows: int, seed: int):
    """(training Dataset sample, evaluation Dataset) of a cell."""
    from rapt.data import load_dataset

    name, split, evals = TASKS[task]
    train = load_dataset(name, split)
    train = train.subset(rows, seed=seed) if rows else train
    ev = [e for s in evals for e in load_dataset(name, s).examples]
    return train, ev


def epochs_for(n: int, batch: int = 32) -> int:
    return max(3, math.ceil(MIN_STEPS / math.ceil(n / batch)))


def _config(method: str, n: int, seed: int, train, task: str, bb):
    from rapt.config import tune_config

    return tune_config({"method": method, "seed": seed, "epochs": epochs_for(n)}, kind=bb.kind,
                       label_names=train.label_names, dataset=TASKS[task][0])


def _tune(custom, method, rows, labels, k, task, train, seed):
    from dataclasses import replace

    c = replace(custom, config=_config(method, len(rows), seed, train, task, custom.backbone))
    return c.tune(rows, labels, k)


def _denoise(custom, tuned, task, seed, queries_clean, queries_priv, held_clean, held_priv):
    """Fit the output denoiser on public sentences with ``tuned``
    (:func:`rapt.pipeline.fit_output_denoiser`); -> (eval probs, held probs, fit record)."""
    from rapt.channel.corpus import public_corpus_for
    from rapt.pipeline import denoised_proba, fit_output_denoiser

    den, rec = fit_output_denoiser(custom, tuned, public_corpus_for(TASKS[task][0]), seed=seed,
                                   rows=PUBLIC_ROWS)

    def run(c_rows, p_rows):
        return denoised_proba(custom, tuned, den, c_rows, p_rows).numpy()

    return run(queries_clean, queries_priv), run(held_clean, held_priv), rec


def run_cell(bb, etas: dict, task: str, rows: int, p, seed: int, spans=None) -> dict:
    """Every remote model of one cell -> arrays (float16 probabilities) and a record.
    ``spans``: the personal-data lookup the by-kind cells read (benchmarks.personal_spans)."""
    from rapt.local import holdout_split
    from rapt.pipeline import Customization, Encoding

    t0 = time.perf_counter()
    train, ev = sample(task, rows, seed)
    texts, y, k = train.texts, np.array(train.labels), train.num_labels
    _, held = holdout_split(y, seed)
    fit_idx = np.setdiff1d(np.arange(len(y)), held)
    custom = Customization.create(bb, Encoding(), noise_seed=1000 + seed,
                                  **mechanism(p, etas, spans))
    eta = custom.eta
    rows_c = custom.rows(texts)
    rows_p = custom.privatize(rows_c, measure=False, texts=texts)
    qtexts = [e.text for e in ev]
    q_clean = custom.rows(qtexts, queries=True)
    q_priv = custom.privatize(q_clean, measure=False, texts=qtexts)
    h_clean = [rows_c[i] for i in held]
    # the slice, privatized as queries are
    h_priv = custom.privatize(h_clean, measure=False, texts=[texts[i] for i in held])
    changed = [a != b for r, s in zip(rows_c, rows_p, strict=True) for a, b in zip(r, s,
                                                                                strict=True)]
    out, rec = {}, {"task": task, "rows": len(y), "p": p, "eta": eta, "seed": seed,
                    "p_measured": float(np.mean(changed)),  # specials included: a lower bound
                    "held": len(held), "epochs": epochs_for(len(y)), "eval_rows": len(ev),
                    "by_kind": custom.kind_record()}
    if isinstance(p, str):
        rec["class_p"] = class_p(custom, rows_c, rows_p, texts)
    for method in ("lora", "prefix"):
        tuned = _tune(custom, method, rows_p, y.tolist(), k, task, train, seed)
        out[method] = custom.for_artifact(tuned).predict_proba(q_priv).numpy()
        rec[f"{method}_head"] = tuned.meta.get("head")
    tuned = _tune(custom, "lora", [rows_p[i] for i in fit_idx], y[fit_idx].tolist(), k, task,
                  train, seed)
    q = custom.for_artifact(tuned)
    out["lora_fuse"] = q.predict_proba(q_priv).numpy()
    out["lora_fuse_held"] = q.predict_proba(h_priv).numpy() if len(held) else np.zeros((0, k))
    if p is not None and (rows in DENOISE_ROWS or (not rows and task == "fp")):
        out["oracle"] = q.predict_proba(q_clean).numpy()
        out["denoised"], out["denoised_held"], rec["denoiser"] = _denoise(
            custom, tuned, task, seed, q_clean, q_priv, h_clean, h_priv)
    rec["seconds"] = time.perf_counter() - t0
    arrays = {n: a.astype(np.float16) for n, a in out.items()}
    return {"arrays": {**arrays, "held": held.astype(np.int32)}, "record": rec}


def remote(args) -> None:
    """Worker ``args.worker`` of ``args.workers`` runs its share of the cells."""
    import torch

    from rapt.models import load_backbone

    global MIN_STEPS, PUBLIC_ROWS
    MIN_STEPS, PUBLIC_ROWS = args.min_steps, args.public_rows  # smaller only for a dry run
    etas = json.loads(Path(args.etas).read_text())
    spans = None
    if args.spans:
        from benchmarks.personal_spans import load_spans

        spans = load_spans(args.spans)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    bb = load_backbone(args.backbone, device=dev)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    todo = cells(tuple(args.tasks), tuple(args.rows), tuple(args.ps), tuple(args.seeds))
    for i, (task, rows, p, seed) in enumerate(todo):
        key = cell_key(task, rows, p, seed)
        if i % args.workers != args.worker or (out / f"{key}.npz").exists():
            continue
        got = run_cell(bb, etas, task, rows, p, seed, spans)
        np.savez_compressed(out / f"{key}.tmp.npz", **got["arrays"],
                            record=json.dumps(got["record"]))
        (out / f"{key}.tmp.npz").rename(out / f"{key}.npz")
        print(f"[w{args.worker}] {key} {got['record']['seconds']:.1f}s", flush=True)


def _parse_p(s: str):
    if s in MECHS:
        return s
    return None if s == "clean" else float(s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    r = sub.add_parser("remote")
    r.add_argument("--etas", required=True, help="JSON {P: η} calibrated on the public sample")
    r.add_argument("--backbone", default="minilm")
    r.add_argument("--out", required=True)
    r.add_argument("--worker", type=int, default=0)
    r.add_argument("--workers", type=int, default=1)
    r.add_argument("--tasks", nargs="+", default=list(TASKS))
    r.add_argument("--rows", nargs="+", type=int, default=list(ROWS))
    r.add_argument("--ps", nargs="+", type=_parse_p, default=list(PS),
                   help=f"P levels (uniform noise), clean, or by-kind settings: {', '.join(MECHS)}")
    r.add_argument("--spans", help="personal-data lookup (benchmarks.personal_spans); the "
                   "by-kind cells run Presidio here without it")
    r.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    r.add_argument("--min-steps", type=int, default=MIN_STEPS)
    r.add_argument("--public-rows", type=int, default=PUBLIC_ROWS)
    args = ap.parse_args()
    remote(args)

if __name__ == "__main__":
    main()
