"""Frozen-feature probe: how much task signal the released rows keep, per backbone and mechanism.

For each task and seed, a training sample and the evaluation rows are released by each
mechanism, the backbone's mean-pooled last hidden states of the released rows are the
features (the backbone frozen), and a logistic regression (C chosen by 5-fold CV on the
training rows only, features standardized on them) is scored on the released evaluation rows.
Mechanisms, all at the η ``calibrate_eta_public`` gives for the backbone:

* ``clean``: the rows as they are (no privacy; the ceiling);
* ``uniform``: every text token at the η of P ``--p`` (0.6);
* ``rare``: ``KindPolicy("rare")``: personal data and words outside the 1,000 most frequent
  public words at that η, the frequent words in clear;
* ``rare+weak``: the same, the frequent words at the weaker η of P ``--p-other`` (0.2).

Paired: one seed = one training sample and one noise seed for every mechanism and backbone;
the evaluation rows are the same for all. The difference by-kind − uniform gets a 95 % CI by a
paired bootstrap over the evaluation rows (resampled alike for both mechanisms and every seed,
the seeds' mean difference recomputed per resample): it covers which evaluation rows were drawn,
not the training sample or the noise, whose spread the per-seed differences show. P is measured
on all text tokens (non-special) of the released rows, training and evaluation together.

Personal data (Presidio, spaCy's English model) is found once per text, on this machine or read
from ``--spans FILE`` (written by ``--save-spans``), e.g. to run the probe on a machine without
Presidio.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_frozen_probe [--backbones minilm mpnet]
        [--tasks sst2 trec fp] [--train 2000] [--eval 0] [--seeds 0 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks._common import RESULTS, command, machine, save_png, write_json, write_md

# task -> (training set, evaluation sets): the issue's splits (FP's dev and test together)
TASKS = {"sst2": (("sst2-sentences", "train"), [("sst2-sentences", "dev")]),
         "trec": (("trec", "train"), [("trec", "test")]),
         "fp": (("financial_phrasebank", "train"),
                [("financial_phrasebank", "dev"), ("financial_phrasebank", "test")])}
MECHANISMS = ("clean", "uniform", "rare", "rare+weak")
CS = [0.001, 0.01, 0.1, 1.0, 10.0]
BOOT = 2000


def task_rows(task: str, n_train: int, n_eval: int, seed: int):
    """(train texts, train labels, eval texts, eval labels): a seeded training sample (all rows
    when ``n_train`` is 0 or more than there are) and the evaluation rows (a sample of
    ``n_eval`` drawn with seed 0, the same for every seed, when ``n_eval`` > 0)."""
    from rapt.data import load_dataset

    (name, split), evals = TASKS[task]
    train = load_dataset(name, split)
    train = train.subset(n_train, seed=seed) if n_train else train
    ev_texts, ev_labels = [], []
    for ename, esplit in evals:
        ds = load_dataset(ename, esplit)
        ev_texts += ds.texts
        ev_labels += ds.labels
    if 0 < n_eval < len(ev_texts):
        keep = sorted(np.random.default_rng(0).choice(len(ev_texts), n_eval, replace=False))
        ev_texts, ev_labels = [ev_texts[i] for i in keep], [ev_labels[i] for i in keep]
    return list(train.texts), list(train.labels), ev_texts, ev_labels


class Spans:
    """Personal-data spans per text: Presidio once per text, or read from a file."""

    def __init__(self, path: str | None):
        from rapt.privacy.personal_data import PersonalSpan

        self._span = PersonalSpan
        self.found: dict[str, list] = {}
        self._detector = None
        if path and Path(path).is_file():
            for text, spans in json.loads(Path(path).read_text()).items():
                self.found[text] = [PersonalSpan(*s) for s in spans]

    def of(self, texts: list[str]) -> dict[str, list]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.found]
        if missing:
            if self._detector is None:
                from rapt.privacy.personal_data import PersonalDataDetector

                self._detector = PersonalDataDetector()
            for t in missing:
                self.found[t] = self._detector.find(t)
        return {t: self.found[t] for t in texts}

    def save(self, path: str) -> None:
        doc = {t: [[s.start, s.end, s.entity, s.score, s.recognizer] for s in v]
               for t, v in self.found.items()}
        Path(path).write_text(json.dumps(doc))


@torch.no_grad()
def features(bb, rows: list[list[int]], batch: int = 64) -> np.ndarray:
    """Mean-pooled last hidden states (every non-padding position, specials included: how
    sentence-transformers pools both models), rows sorted by length to pad little."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out = np.zeros((len(rows), bb.hidden_size), dtype=np.float32)
    dev = bb.embeddings.device
    pad = bb.tokenizer.pad_token_id
    for s in range(0, len(rows), batch):
        idx = order[s:s + batch]
        width = max(len(rows[i]) for i in idx)
        ids = torch.tensor([rows[i] + [pad] * (width - len(rows[i])) for i in idx], device=dev)
        mask = torch.tensor([[1] * len(rows[i]) + [0] * (width - len(rows[i])) for i in idx],
                            device=dev)
        hidden = bb.model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(hidden.dtype)
        out[idx] = ((hidden * m).sum(1) / m.sum(1)).float().cpu().numpy()
    return out


def probe(x_train, y_train, x_eval, y_eval, seed: int) -> tuple[np.ndarray, float]:
    """Per evaluation row: right or not, and the C that 5-fold CV on the training rows chose."""
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.preprocessing import StandardScaler

    scale = StandardScaler().fit(x_train)
    lr = LogisticRegressionCV(Cs=CS, cv=5, scoring="accuracy", max_iter=3000, random_state=seed)
    lr.fit(scale.transform(x_train), y_train)
    right = lr.predict(scale.transform(x_eval)) == np.asarray(y_eval)
    return right, float(np.atleast_1d(lr.C_)[0])


def replaced_share(clean: list[list[int]], released: list[list[int]], special: set[int]
                   ) -> tuple[int, int]:
    """(changed, all) non-special tokens."""
    changed = total = 0
    for a, b in zip(clean, released, strict=True):
        for x, y in zip(a, b, strict=True):
            if x not in special:
                total += 1
                changed += x != y
    return changed, total


def release(bb, mech: str, etas: dict, seed: int, rows: dict, texts: dict, spans: Spans):
    """The mechanism's released (train, eval) rows: one privatizer (one noise stream) for both."""
    from rapt.pipeline import Customization
    from rapt.privacy.by_kind import KindPolicy

    if mech == "clean":
        return rows["train"], rows["eval"]
    policy = {"uniform": None, "rare": KindPolicy("rare"),
              "rare+weak": KindPolicy("rare", eta_other=etas["other"])}[mech]
    custom = Customization.create(bb, eta=etas["strong"], noise_seed=seed, kind_policy=policy,
                                  personal_spans=spans.of(texts["train"] + texts["eval"]))
    return tuple(custom.privatize(rows[s], texts=texts[s], measure=False)
                 for s in ("train", "eval"))


def run_backbone(name: str, args, spans: Spans) -> dict:
    """Every (task, seed, mechanism) cell of one backbone."""
    from rapt.models import load_backbone
    from rapt.pipeline import Customization
    from rapt.privacy.mechanism import calibrate_eta_public

    t0 = time.perf_counter()
    bb = load_backbone(name, device=args.device)
    etas = {"strong": calibrate_eta_public(bb, args.p),
            "other": calibrate_eta_public(bb, args.p_other)}
    special = set(bb.special_ids)
    cells = []
    for task in args.tasks:
        for seed in args.seeds:
            tr_x, tr_y, ev_x, ev_y = task_rows(task, args.train, args.eval, seed)
            enc = Customization.create(bb)  # the clean rows' layout, no privatizer
            texts = {"train": tr_x, "eval": ev_x}
            rows = {"train": enc.rows(tr_x), "eval": enc.rows(ev_x, queries=True)}
            for mech in args.mechanisms:
                t = time.perf_counter()
                rel_tr, rel_ev = release(bb, mech, etas, seed, rows, texts, spans)
                f_tr, f_ev = features(bb, rel_tr), features(bb, rel_ev)
                right, c = probe(f_tr, tr_y, f_ev, ev_y, seed)
                ch, tot = replaced_share(rows["train"] + rows["eval"], rel_tr + rel_ev, special)
                cells.append({"task": task, "seed": seed, "mechanism": mech,
                              "accuracy": float(right.mean()), "right": right.astype(int).tolist(),
                              "C": c, "p_all_tokens": ch / tot, "tokens": tot,
                              "n_train": len(tr_x), "n_eval": len(ev_x),
                              "seconds": round(time.perf_counter() - t, 1)})
                print(f"{name} {task} seed {seed} {mech}: acc {right.mean():.3f} "
                      f"P {ch / tot:.3f} C {c:g} ({cells[-1]['seconds']:.0f} s)", flush=True)
    return {"etas": {"strong_p": args.p, "strong": etas["strong"], "other_p": args.p_other,
                     "other": etas["other"]},
            "embeddings": list(bb.embeddings.shape), "cells": cells,
            "seconds": round(time.perf_counter() - t0, 1)}


def paired_diff(a: list[list[int]], b: list[list[int]], seed: int = 0) -> dict:
    """Mean over seeds of accuracy(a) − accuracy(b), with a 95 % CI by a paired bootstrap over
    the evaluation rows (one resample of rows serves every seed and both mechanisms)."""
    da = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)  # seeds x rows
    rng = np.random.default_rng(seed)
    n = da.shape[1]
    boot = np.array([da[:, rng.integers(0, n, n)].mean() for _ in range(BOOT)])
    lo, hi = np.quantile(boot, [0.025, 0.975])
    return {"diff": float(da.mean()), "ci95": [float(lo), float(hi)],
            "per_seed": [float(x) for x in da.mean(1)]}


def summarize(backbones: dict, seeds: list[int]) -> list[dict]:
    """Per (task, backbone): each mechanism's accuracy and P (means over seeds) and the paired
    differences of the by-kind mechanisms from uniform."""
    out = []
    for name, e in backbones.items():
        for task in dict.fromkeys(c["task"] for c in e["cells"]):
            by = {m: [c for c in e["cells"] if c["task"] == task and c["mechanism"] == m]
                  for m in MECHANISMS}
            by = {m: sorted(v, key=lambda c: seeds.index(c["seed"])) for m, v in by.items() if v}
            row = {"task": task, "backbone": name,
                   "accuracy": {m: float(np.mean([c["accuracy"] for c in v]))
                                for m, v in by.items()},
                   "p_all_tokens": {m: float(np.mean([c["p_all_tokens"] for c in v]))
                                    for m, v in by.items()},
                   "n_train": by[next(iter(by))][0]["n_train"],
                   "n_eval": by[next(iter(by))][0]["n_eval"], "diff_vs_uniform": {}}
            for m in ("rare", "rare+weak", "clean"):
                if m in by and "uniform" in by:
                    row["diff_vs_uniform"][m] = paired_diff([c["right"] for c in by[m]],
                                                            [c["right"] for c in by["uniform"]])
            out.append(row)
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _diff(d: dict | None) -> str:
    if d is None:
        return "–"
    return (f"{100 * d['diff']:+.1f} [{100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}]")


def markdown(doc: dict) -> list[str]:
    a = doc["args"]
    lines = ["# Frozen-feature probe: task signal left in released rows, per backbone and "
             "mechanism", "",
             f"`{doc['command']}`, {doc['date']}; {doc['machine']['platform']}, "
             f"{doc['machine']['threads']} thread(s), device {a['device']}, load "
             f"{doc['machine']['loadavg_start'][0]:.1f} at start; {doc['wall_s'] / 60:.1f} min "
             "wall.", "",
             "Accuracy (%) of a logistic regression on the frozen backbone's mean-pooled "
             "features of the released rows (C by 5-fold CV on the training rows), scored on "
             "the released evaluation rows; mean over seeds " + ", ".join(map(str, a["seeds"]))
             + f". Uniform: every text token at the η of P {a['p']} on rapt's public sample; "
             "rare: personal data and words outside the 1,000 most frequent public words at "
             "that η, frequent words in clear; rare+weak: frequent words at the η of P "
             f"{a['p_other']}. Δ = by-kind − uniform in accuracy points, paired, 95 % CI by a "
             f"bootstrap over the evaluation rows ({BOOT} resamples; it leaves out the spread "
             "over training samples and noise, see the per-seed differences in the json). "
             "P = share of all non-special tokens replaced (training and evaluation rows).", ""]
    etas = ", ".join(f"{n}: η {e['etas']['strong']:.2f} (P {e['etas']['strong_p']}), "
                     f"{e['etas']['other']:.2f} (P {e['etas']['other_p']})"
                     for n, e in doc["backbones"].items())
    lines += [f"η per backbone: {etas}.", "",
              "| task | backbone | train / eval | clean | uniform | rare | rare+weak | "
              "Δ rare − uniform | Δ rare+weak − uniform | P uniform / rare / rare+weak |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["summary"]:
        acc, pp, d = r["accuracy"], r["p_all_tokens"], r["diff_vs_uniform"]
        cells = [_pct(acc[m]) if m in acc else "–" for m in MECHANISMS]
        ps = " / ".join(f"{pp[m]:.2f}" if m in pp else "–" for m in MECHANISMS[1:])
        lines.append(f"| {r['task']} | {r['backbone']} | {r['n_train']} / {r['n_eval']} | "
                     + " | ".join(cells) + f" | {_diff(d.get('rare'))} | "
                     f"{_diff(d.get('rare+weak'))} | {ps} |")
    return lines


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["summary"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(rows)), 4.0))
    width = 0.8 / len(MECHANISMS)
    for j, m in enumerate(MECHANISMS):
        ax.bar([i + (j - 1.5) * width for i in range(len(rows))],
               [r["accuracy"].get(m, np.nan) for r in rows], width, label=m)
    ax.set_xticks(range(len(rows)), [f"{r['task']}\n{r['backbone']}" for r in rows])
    ax.set_ylabel("probe accuracy (released eval rows)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, ncol=4)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_png(fig, path)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbones", nargs="+", default=["minilm", "mpnet"])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=MECHANISMS)
    ap.add_argument("--train", type=int, default=2000, help="training rows per seed (0: all)")
    ap.add_argument("--eval", type=int, default=0,
                    help="evaluation rows (0: all; else a fixed sample, the same every seed)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--p", type=float, default=0.6, help="P of the strong η")
    ap.add_argument("--p-other", type=float, default=0.2, help="P of rare+weak's frequent words")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--spans", help="personal-data spans per text, read if the file exists")
    ap.add_argument("--save-spans", action="store_true", help="write --spans after the run")
    ap.add_argument("--out", default="frozen_probe", help="stem under benchmarks/results")
    ap.add_argument("--results", default=str(RESULTS), help="folder the results go to")
    return ap.parse_args()


def main() -> None:
    import datetime as dt

    args = parse_args()
    torch.set_num_threads(args.threads)  # the machine is shared
    host, t0 = machine(), time.perf_counter()
    spans = Spans(args.spans)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    backbones: dict[str, dict] = {}
    for b in args.backbones:  # written after each backbone: a long run keeps what it measured
        backbones[b] = run_backbone(b, args, spans)
        if args.save_spans and args.spans:
            spans.save(args.spans)
        doc = {"command": command(),
               "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": {**host, "loadavg_end": list(os.getloadavg())},
               "wall_s": round(time.perf_counter() - t0, 1),
               "args": {k: v for k, v in vars(args).items() if k not in ("results", "out")},
               "backbones": backbones, "summary": summarize(backbones, args.seeds)}
        write_json(out / f"{args.out}.json", doc)
        write_md(out / f"{args.out}.md", markdown(doc))
        plot(doc, out / f"{args.out}.png")
    print("\n".join(markdown(doc)))
    print(f"wrote {out / args.out}.json, .md, .png")


if __name__ == "__main__":
    main()
