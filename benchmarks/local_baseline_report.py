"""The user-side phase of benchmarks/local_baseline.py: the local TF-IDF model, fusion and the
denoiser's fusion on each remote cell, then ``local_baseline.{json,md,png}``.

    python -m benchmarks.local_baseline_report --cells benchmarks/results/local_baseline_cells
    python -m benchmarks.local_baseline_report      # the md again from local_baseline.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks._common import RESULTS, command, machine, save_png, write_json, write_md
from benchmarks.local_baseline import NAMES, sample

# What the table shows, in order; "oracle" is a reference (the clean query), not a method.
METHODS = ("local", "lora", "prefix", "lora_fuse", "fused", "denoised", "fused_denoised",
           "oracle")
LABELS = {"local": "local TF-IDF (clean)", "lora": "remote LoRA", "prefix": "remote prefix",
          "lora_fuse": "remote LoRA on 80 %", "fused": "fused (LoRA 80 % + local)",
          "denoised": "denoised (LoRA 80 %)", "fused_denoised": "denoised + fused",
          "oracle": "LoRA 80 % on clean queries (reference)"}
SHIPPED = ("fused", "denoised", "fused_denoised")  # the user-side remedies


def _acc(p: np.ndarray, y: np.ndarray) -> float:
    return float((np.asarray(p, float).argmax(-1) == y).mean())


def scorer_fingerprint() -> str:
    """sha256 of what decides a cell's scores: :func:`score_cell` and the local model's
    package (``rapt.local``). A cache line from another scorer is stale (scored again)."""
    import inspect

    import rapt.local

    parts = [inspect.getsource(score_cell), inspect.getsource(sample)]
    parts += [f.read_text() for f in sorted(Path(rapt.local.__file__).parent.glob("*.py"))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def score_cell(path: Path) -> dict:
    """Accuracy (0–1) of every method on one cell's evaluation rows, and its record."""
    from rapt.local import Fusion, LocalBaseline, fit_user_side

    z = np.load(path)
    rec = json.loads(str(z["record"]))
    label = path.stem.split("_")[1]  # the cell key's rows: a number or "all"
    rec["rows_label"] = label
    train, ev = sample(rec["task"], 0 if label == "all" else int(label), rec["seed"])
    texts, y, k = train.texts, np.array(train.labels), train.num_labels
    if len(y) != rec["rows"]:
        raise SystemExit(f"{path}: the sample has {len(y)} rows, the cell {rec['rows']}")
    ye = np.array([e.label for e in ev])
    qtexts = [e.text for e in ev]
    held = z["held"].astype(np.int64)  # the remote phase's slice (the split's code may change)
    if len(held) != rec["held"] or (len(held) and held.max() >= len(y)):
        raise SystemExit(f"{path}: the held-out slice does not fit the sample")
    t0 = time.perf_counter()
    local, fusion, _ = fit_user_side(texts, y, k, held, z["lora_fuse_held"].astype(float),
                                     seed=rec["seed"])
    rec["local_fit_s"] = time.perf_counter() - t0
    pl = local.predict_proba(qtexts)
    acc = {m: _acc(z[m], ye) for m in ("lora", "prefix", "lora_fuse", "oracle", "denoised")
           if m in z.files}
    acc["local"] = _acc(pl, ye)
    acc["local_cv"] = local.cv_accuracy
    if fusion is not None:
        acc["fused"] = _acc(fusion(z["lora_fuse"].astype(float), pl), ye)
        rec["fusion"] = {"remote": fusion.remote, "local": fusion.local}
    if "denoised" in z.files and len(held):
        keep = np.setdiff1d(np.arange(len(y)), held)
        part = LocalBaseline.fit([texts[i] for i in keep], y[keep], k, seed=rec["seed"])
        fd = Fusion.fit(z["denoised_held"].astype(float),
                        part.predict_proba([texts[i] for i in held]), y[held])
        acc["fused_denoised"] = _acc(fd(z["denoised"].astype(float), pl), ye)
    return {"record": rec, "accuracy": acc}


def _ci(xs: list[float]) -> tuple[float, float | None]:
    """(mean, 95 % Student-t half width; None for one value), in points."""
    from scipy import stats

    m = 100 * statistics.fmean(xs)
    if len(xs) < 2:
        return m, None
    return m, 100 * stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5


def _fmt(m: float, h: float | None) -> str:
    return f"{m:.1f}" if h is None else f"{m:.1f} ± {h:.1f}"


def _fmt_d(m: float, h: float | None) -> str:
    return f"{m:+.1f}" if h is None else f"{m:+.1f} ± {h:.1f}"


def group(scored: list[dict]) -> dict:
    """(task, rows, p) -> {seed: accuracy dict}."""
    out: dict = defaultdict(dict)
    for s in scored:
        r = s["record"]
        out[(r["task"], r["rows_label"], r["p"])][r["seed"]] = s["accuracy"]
    return out


def paired(a: dict, b: dict, ma: str, mb: str) -> list[float]:
    """Per-seed differences a[ma] − b[mb] over the seeds both have."""
    return [a[s][ma] - b[s][mb] for s in sorted(a) if s in b and ma in a[s] and mb in b[s]]


def summary_rows(g: dict) -> list[dict]:
    """One row per (task, rows, P): mean ± CI per method, best remedy vs local and vs LoRA."""
    rows = []
    for (task, n, p), seeds in sorted(g.items(), key=lambda kv: (kv[0][0], _n(kv[0][1]),
                                                                   kv[0][2] or 0)):
        row = {"task": task, "rows": n, "p": p, "seeds": sorted(seeds)}
        for m in (*METHODS, "local_cv"):
            xs = [seeds[s][m] for s in seeds if seeds[s].get(m) is not None]
            if xs:
                row[m] = _ci(xs)
        shipped = [m for m in SHIPPED if m in row]
        if shipped:
            best = max(shipped, key=lambda m: row[m][0])
            row["best"] = best
            row["best_vs_local"] = _ci(paired(seeds, seeds, best, "local"))
            row["best_vs_lora"] = _ci(paired(seeds, seeds, best, "lora"))
            clean = g.get((task, n, None))
            if p is not None and clean:
                gap = paired(clean, seeds, "lora", "lora")
                won = paired(seeds, seeds, best, "lora")
                row["gap"] = _ci(gap)
                row["won_back"] = (statistics.fmean(won) / statistics.fmean(gap)
                                   if gap and statistics.fmean(gap) > 0 else None)
        rows.append(row)
    return rows


def _n(label: str) -> float:
    return float("inf") if label == "all" else float(label)


def user_side_cost() -> dict:
    """CPU seconds and memory of each user-side part on this machine (one thread): the local
    model's fit on 2,000 SST-2 rows and its predictions for 1,000 queries; the denoiser's
    token features and forward pass for 1,000 queries (its weights at init: the cost does not
    depend on their values)."""
    import torch

    from rapt.local import LocalBaseline
    from rapt.local.denoise import OutputDenoiser, token_features
    from rapt.models import load_embeddings

    torch.set_num_threads(1)
    train, ev = sample("sst2", 2000, 0)
    t = time.process_time()
    m = LocalBaseline.fit(train.texts, train.labels, 2)
    fit_s = time.process_time() - t
    q = [e.text for e in ev] * 2
    t = time.process_time()
    m.predict_proba(q[:1000])
    pred_s = time.process_time() - t
    _, arrays = m.state()
    bb = load_embeddings("minilm")
    emb, tok = bb.embeddings.detach(), bb.tokenizer
    rows = [tok(x, truncation=True, max_length=128)["input_ids"] for x in q[:1000]]
    den = OutputDenoiser(emb.shape[1])
    t = time.process_time()
    f = token_features(emb, rows, rows, tok.all_special_ids)
    with torch.no_grad():
        den(torch.zeros(len(rows), emb.shape[1]), f)
    den_s = time.process_time() - t
    return {"local_fit_2000_rows_cpu_s": fit_s, "local_predict_1000_cpu_s": pred_s,
            "local_model_bytes": int(sum(a.nbytes for a in arrays.values())),
            "local_vocabulary_terms": len(m.state()[0]["vocabulary"]),
            "denoiser_parameters": sum(p.numel() for p in den.parameters()),
            "denoiser_1000_queries_cpu_s": den_s,
            "embedding_table_bytes": int(emb.numel() * emb.element_size())}


def _cell(row: dict, m: str) -> str:
    return _fmt(*row[m]) if m in row else "—"


def table(rows: list[dict]) -> list[str]:
    cols = ("local", "lora", "prefix", "fused", "denoised", "fused_denoised", "oracle")
    out = ["| task | rows | P | seeds | " + " | ".join(LABELS[c] for c in cols)
           + " | best remedy | − local | − LoRA | gap won back |",
           "|---" * (len(cols) + 8) + "|"]
    for r in rows:
        won = r.get("won_back")
        out.append(
            f"| {NAMES[r['task']]} | {r['rows']} | {'clean' if r['p'] is None else r['p']} | "
            f"{len(r['seeds'])} | " + " | ".join(_cell(r, c) for c in cols)
            + f" | {LABELS.get(r.get('best'), '—')} | "
            + (_fmt_d(*r["best_vs_local"]) if "best_vs_local" in r else "—") + " | "
            + (_fmt_d(*r["best_vs_lora"]) if "best_vs_lora" in r else "—") + " | "
            + ("—" if won is None else f"{100 * won:.0f} %") + " |")
    return out


def wins(rows: list[dict]) -> list[str]:
    """Per task and P: the row counts at which the hosted model alone (best of LoRA, prefix)
    and the best user-side remedy beat the local model, by mean accuracy."""
    out = ["| task | P | hosted model alone > local at rows | best remedy > local at rows |",
           "|---|---|---|---|"]
    by = defaultdict(list)
    for r in rows:
        by[(r["task"], r["p"])].append(r)
    for (task, p), rs in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        alone = [r["rows"] for r in rs if max(r["lora"][0], r["prefix"][0]) > r["local"][0]]
        best = [r["rows"] for r in rs if "best" in r and r[r["best"]][0] > r["local"][0]]
        out.append(f"| {NAMES[task]} | {'clean' if p is None else p} | "
                   f"{', '.join(alone) or 'none'} | {', '.join(best) or 'none'} |")
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in rows})
    ps = [None, 0.2, 0.4, 0.6]
    fig, axes = plt.subplots(len(tasks), len(ps), figsize=(16, 3.6 * len(tasks)), sharey="row")
    for i, task in enumerate(tasks):
        for j, p in enumerate(ps):
            ax = axes[i][j]
            rs = sorted((r for r in rows if r["task"] == task and r["p"] == p),
                        key=lambda r: _n(r["rows"]))
            xs = [r["rows"] for r in rs]
            for m in ("local", "lora", "prefix", "fused", "fused_denoised"):
                pts = [(x, r[m][0]) for x, r in zip(xs, rs, strict=True) if m in r]
                if pts:
                    ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", label=LABELS[m])
            ax.set_title(f"{NAMES[task]}, {'clean' if p is None else f'P {p}'}")
            ax.set_xlabel("training rows")
            if j == 0:
                ax.set_ylabel("accuracy (%)")
    handles = {}
    for ax in fig.axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles))
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save_png(fig, path)


def _grid_cell(path: Path) -> bool:
    """A cell of the uniform grid: clean or a number P, not a by-kind setting ("r0.7z": those
    are local_baseline_by_kind's). FP has 1,812 training rows: its "2000" cells are its "all"
    cells again; the table keeps all."""
    setting = path.stem.split("_")[2]
    return not path.name.startswith("fp_2000_") and (
        setting == "clean" or setting.replace(".", "", 1).isdigit())


def score_all(cells: Path, cache: Path, keep: Callable[[Path], bool] = _grid_cell
              ) -> list[dict]:
    """Every cell that ``keep`` takes, scored once; the scores go to ``cache`` (JSONL) as they
    come, and a cell found there with the same content (sha256 of its file) and the same
    scorer (:func:`scorer_fingerprint`) is not scored again: a cell run again under the same
    name, or any cell after the local model changed, is scored again (the last line wins)."""
    from rapt.progress import progress_bar

    scorer, stale = scorer_fingerprint(), False
    done = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            d = json.loads(line)
            done[d["key"]] = d
    paths = sorted(p for p in cells.glob("*.npz") if keep(p))
    with cache.open("a") as f, progress_bar(total=len(paths), desc="cells") as bar:
        for p in paths:
            sha = hashlib.sha256(p.read_bytes()).hexdigest()
            have = done.get(p.stem, {})
            if (have.get("sha256"), have.get("scorer")) != (sha, scorer):
                done[p.stem] = {"key": p.stem, "sha256": sha, "scorer": scorer, **score_cell(p)}
                f.write(json.dumps(done[p.stem]) + "\n")
                f.flush()
                stale = True
            bar.update(1)
    if stale:  # each line appended as it came (a crash loses nothing); now one line per cell
        tmp = cache.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(d) + "\n" for d in done.values()))
        tmp.replace(cache)
    return [done[p.stem] for p in paths]


def goal(rows: list[dict]) -> list[str]:
    """The goal at P 0.6 (the default) and 2,000 rows (FP: all 1,812). "local alone" applies the
    won-back formula to the local model, which uses no remote model at all: the share of the gap
    the fused model wins back beyond it is what fusion adds."""
    out = ["| task | rows | best remedy | vs local | vs LoRA alone | gap clean − P 0.6 LoRA "
           "| won back | local alone | met |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["p"] != 0.6 or r["rows"] != ("all" if r["task"] == "fp" else "2000"):
            continue
        vl, vr, won = r.get("best_vs_local"), r.get("best_vs_lora"), r.get("won_back")
        met = (vl and vr and vl[1] is not None and vr[1] is not None and vl[0] >= 2
               and vr[0] >= 2 and vl[0] - vl[1] > 0 and vr[0] - vr[1] > 0
               and won is not None and won >= 0.5)
        out.append(f"| {NAMES[r['task']]} | {r['rows']} | {LABELS.get(r.get('best'), '—')} | "
                   f"{_fmt_d(*vl) if vl else '—'} | {_fmt_d(*vr) if vr else '—'} | "
                   f"{_fmt_d(*r['gap']) if 'gap' in r else '—'} | {_share(won)} | "
                   f"{_share(local_won_back(r))} | {'yes' if met else 'no'} |")
    return out


def local_won_back(row: dict) -> float | None:
    """(local − LoRA at P) / (LoRA clean − LoRA at P), on the row's means: the won-back share of
    the local model alone."""
    gap = row.get("gap")
    if not gap or gap[0] <= 0 or "local" not in row or "lora" not in row:
        return None
    return (row["local"][0] - row["lora"][0]) / gap[0]


def _share(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f} %"


def report(cells: Path, name: str) -> None:
    scored = score_all(cells, RESULTS / f"{name}_scored.jsonl")
    rows = summary_rows(group(scored))
    meta = json.loads((cells / "meta.json").read_text()) if (cells / "meta.json").exists() \
        else {}
    doc = {"command": command(), "remote": meta, "user_side_machine": machine(),
           "cost": user_side_cost(), "summary": rows, "cells": scored}
    write_json(RESULTS / f"{name}.json", doc)
    plot(rows, RESULTS / f"{name}.png")
    write_md(RESULTS / f"{name}.md", markdown(doc))


def markdown(doc: dict) -> list[str]:
    """``local_baseline.md`` from its JSON alone (``python -m benchmarks.local_baseline_report
    --name NAME`` rewrites it without scoring anything again)."""
    meta, rows, cost, mach = doc["remote"], doc["summary"], doc["cost"], doc["user_side_machine"]
    return [
        "# Where the hosted model wins: local TF-IDF vs privatized remote models, fused and "
        "denoised on the user's side", "",
        f"Commands: remote phase `{meta.get('command', '?')}` on {meta.get('device', '?')}; "
        f"user side `{doc['command']}` on {mach['platform']}, {mach['cpu_count']} cores.", "",
        *meta.get("notes", []), "",
        "Accuracy (%) on the evaluation rows, mean ± 95 % CI over paired seeds (Student t; "
        "no CI for one seed). \"− local\" / \"− LoRA\": the best user-side remedy's paired "
        "difference, in points. \"gap won back\": (best remedy − LoRA at P) / (LoRA clean − "
        "LoRA at P), on the means of paired differences. \"best remedy\": the user-side "
        "remedy with the highest mean in that row, a post-hoc choice per row (at the goal's "
        "cells it is the fused model, which `rapt tune` and `rapt predict` use by default).",
        "", *table(rows), "",
        "## The goal at P 0.6 (the default) and 2,000 rows", "",
        "\"local alone\": the same won-back formula for the local model, which uses no remote "
        "model at all; the fused model's share beyond it is what fusion adds.", "",
        *goal(rows), "",
        "## Where the hosted model beats the local one (by mean accuracy)", "", *wins(rows),
        "", "## What the user side costs (one thread, CPU seconds)", "",
        "| part | figure |", "|---|---|",
        *[f"| {k} | {v:.3g} |" if isinstance(v, float) else f"| {k} | {v:,} |"
          for k, v in cost.items()]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", help="the remote phase's folder of .npz cells: score them and "
                    "write NAME.{json,md,png}; without it, only NAME.md again from NAME.json")
    ap.add_argument("--name", default="local_baseline", help="results/NAME.{json,md,png}")
    args = ap.parse_args()
    if args.cells:
        report(Path(args.cells), args.name)
    else:
        doc = json.loads((RESULTS / f"{args.name}.json").read_text())
        write_md(RESULTS / f"{args.name}.md", markdown(doc))


if __name__ == "__main__":
    main()
