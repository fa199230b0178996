"""The user-side phase for the by-kind cells of benchmarks/local_baseline.py: uniform noise at
P 0.6 beside noise by kind of token, with the local model, fusion and the output denoiser, on
paired seeds (same training sample, same noise seed), then ``local_baseline_by_kind.{json,md,
png}``.

    python -m benchmarks.local_baseline_by_kind --cells benchmarks/results/local_baseline_cells \\
        --privacy benchmarks/results/privacy_by_mechanism.json

The uniform and clean cells are the grid's (``local_baseline.md``); a cell is scored once by
``local_baseline_report.score_cell`` (the scores of cells scored before are read from
``local_baseline_scored.jsonl``). "rapt's user-side result" is the fused model (LoRA on 80 %
+ the local model, what ``rapt tune`` uses by default); the best remedy per row is a post-hoc
choice, shown apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from benchmarks._common import RESULTS, command, machine, save_png, write_json, write_md
from benchmarks.local_baseline import LABELS, MECHS, NAMES
from benchmarks.local_baseline_report import SHIPPED, _ci, _fmt, _fmt_d, paired, score_all

UNIFORM = 0.6
SETTINGS = ("0.6", *MECHS)  # the uniform default first
LABEL = {"0.6": "uniform P 0.6", **LABELS}
GOAL_ROWS = {"sst2": "2000", "fp": "2000", "trec": "2000"}  # FP's 2,000 sample is all 1,812


def _key_parts(key: str) -> tuple[str, str, str, int]:
    task, rows, p, seed = key.split("_")
    return task, rows, p, int(seed)


def scored_cells(cells: Path, cache: Path, rows: tuple[str, ...]) -> dict:
    """(task, rows, setting) -> {seed: accuracy dict and record}, for the uniform P 0.6 and
    by-kind cells (scored now unless ``cache`` holds them)."""
    def keep(p: Path) -> bool:
        _, n, setting, _ = _key_parts(p.stem)
        return n in rows and setting in SETTINGS

    out: dict = defaultdict(dict)
    for d in score_all(cells, cache, keep):
        task, n, setting, seed = _key_parts(d["key"])
        out[(task, n, setting)][seed] = {**d["accuracy"], "record": d["record"]}
    return out


def summary(g: dict) -> list[dict]:
    rows = []
    for (task, n, setting), seeds in sorted(g.items(), key=lambda kv: (
            kv[0][0], int(kv[0][1]), SETTINGS.index(kv[0][2]))):
        uni = g.get((task, n, "0.6"), {})
        row: dict = {"task": task, "rows": n, "setting": setting, "seeds": sorted(seeds)}
        for m in ("local", "lora", "fused", "denoised", "fused_denoised", "oracle"):
            xs = [seeds[s][m] for s in seeds if seeds[s].get(m) is not None]
            if xs:
                row[m] = _ci(xs)
        row["fused_vs_local"] = _ci(paired(seeds, seeds, "fused", "local"))
        paired_uni = paired(seeds, uni, "fused", "lora")
        if paired_uni:
            row["fused_vs_uniform_lora"] = _ci(paired_uni)
            row["paired_uniform_seeds"] = len(paired_uni)
        shipped = [m for m in SHIPPED if m in row]
        if shipped:
            row["best"] = max(shipped, key=lambda m: row[m][0])
        cp = [seeds[s]["record"].get("class_p") for s in seeds]
        if cp and cp[0]:
            row["class_p"] = {k: {"share": statistics.fmean(c[k]["share"] for c in cp),
                                  "p": statistics.fmean(c[k]["p"] or 0 for c in cp)}
                              for k in cp[0]}
        row["p_measured_all"] = statistics.fmean(seeds[s]["record"]["p_measured"]
                                                 for s in seeds)
        rows.append(row)
    return rows


def goal_met(row: dict) -> bool | None:
    vl, vu = row.get("fused_vs_local"), row.get("fused_vs_uniform_lora")
    if not vl or not vu or vl[1] is None or vu[1] is None:
        return None
    return vl[0] >= 2 and vl[0] - vl[1] > 0 and vu[0] >= 5


def table(rows: list[dict]) -> list[str]:
    out = ["| task | rows | setting | seeds | P all tokens | local TF-IDF | remote LoRA | fused | "
           "denoised + fused | fused − local | fused − uniform LoRA | utility goal |",
           "|---" * 12 + "|"]
    for r in rows:
        g = goal_met(r)
        out.append(
            f"| {NAMES[r['task']]} | {r['rows']} | {LABEL[r['setting']]} | {len(r['seeds'])} | "
            f"{r['p_measured_all']:.2f} | "
            + " | ".join(_fmt(*r[m]) if m in r else "—"
                         for m in ("local", "lora", "fused", "fused_denoised"))
            + f" | {_fmt_d(*r['fused_vs_local'])} | "
            + (_fmt_d(*r["fused_vs_uniform_lora"]) if "fused_vs_uniform_lora" in r else "—")
            + f" | {'—' if g is None else ('met' if g else 'not met')} |")
    return out


def privacy_table(privacy: dict | None) -> list[str]:
    if not privacy:
        return ["(no privacy_by_mechanism.json given)"]
    name = {"u0.6": "0.6"}
    kinds = ("all", "top 100", "100-1k", "1k-10k", "rarer", "personal data")
    out = ["| task | setting | attackers run | " + " | ".join(kinds) + " |",
           "|---|---|---|" + "---|" * len(kinds)]
    for c in privacy["cells"]:
        s = name.get(c["mechanism"], c["mechanism"])
        ran = ", ".join(c["attackers"])
        out.append(f"| {c['task']} | {LABEL.get(s, s)} | {ran} | " + " | ".join(
            "–" if c["best"][k]["privacy"] is None else
            f"{100 * c['best'][k]['privacy']:.1f} ({c['best'][k]['attacker']})"
            for k in kinds) + " |")
    return out


# The privacy files, newest run first (its cells win): η 0 against its own denoiser (SST-2,
# FP); the context attacker on uniform, rare P 0.7 and η 0; then the GPU grid (its other
# settings) and the files that added cells to it. render_docs merges the same list.
PRIVACY_FILES = ("privacy_by_mechanism_denoiser", "privacy_by_mechanism_context",
                 "privacy_by_mechanism", "privacy_by_mechanism_trec",
                 "privacy_by_mechanism_personal_eta0", "privacy_by_mechanism_beyond10k")

# rapt's default (rapt.privacy.by_kind.default_policy: --protect rare at P 0.7, personal data
# and words beyond the 10,000 most frequent at η 0), chosen from this grid; "0.6" the former
# default
DEFAULT_SETTING = "r0.7z10k"
_PRIVACY_TASK = {"sst2": "sst2", "fp": "financial_phrasebank", "trec": "trec"}
_PRIVACY_KINDS = ("personal data", "1k-10k", "rarer", "all")


def default_table(rows: list[dict], privacy: dict | None) -> list[str]:
    """The former default (uniform P 0.6) and rapt's default side by side at the goal's rows:
    accuracy (fused, paired differences) and privacy per kind against the best attacker run
    (1 − its recovery, an upper bound; "–": not measured)."""
    got = {(r["task"], r["rows"], r["setting"]): r for r in rows}
    cells = {(c["task"], c["mechanism"]): c for c in (privacy or {}).get("cells", [])}
    out = ["| task | setting | fused | fused − local | fused − uniform LoRA | "
           + " | ".join(f"privacy: {k}" for k in _PRIVACY_KINDS) + " |",
           "|---" * (5 + len(_PRIVACY_KINDS)) + "|"]
    for task, n in GOAL_ROWS.items():
        for setting in ("0.6", DEFAULT_SETTING):
            r = got.get((task, n, setting))
            if r is None:
                continue
            c = cells.get((_PRIVACY_TASK[task], "u0.6" if setting == "0.6" else setting))
            priv = ["–" if c is None or c["best"][k]["privacy"] is None else
                    f"{100 * c['best'][k]['privacy']:.1f} ({c['best'][k]['attacker']})"
                    for k in _PRIVACY_KINDS]
            name = ("uniform P 0.6 (`--protect all`, the former default)" if setting == "0.6"
                    else f"{LABEL[setting]} (the default)")
            out.append(f"| {NAMES[task]} | {name} | {_fmt(*r['fused'])} | "
                       f"{_fmt_d(*r['fused_vs_local'])} | "
                       + (_fmt_d(*r["fused_vs_uniform_lora"]) if "fused_vs_uniform_lora" in r
                          else "—") + " | " + " | ".join(priv) + " |")
    return out


def merged_privacy(paths: list[Path]) -> dict | None:
    """The first privacy_by_mechanism file, with the (mechanism, task) cells of each later one
    that the earlier ones lack (None: no file found)."""
    docs = [json.loads(p.read_text()) for p in paths if p.exists()]
    if not docs:
        return None
    out = {**docs[0], "cells": list(docs[0]["cells"])}
    seen = {(c["mechanism"], c["task"]) for c in out["cells"]}
    for d in docs[1:]:
        new = [c for c in d["cells"] if (c["mechanism"], c["task"]) not in seen]
        out["cells"] += new
        seen |= {(c["mechanism"], c["task"]) for c in new}
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    ns = sorted({r["rows"] for r in rows}, key=int)
    fig, axes = plt.subplots(len(ns), len(tasks), figsize=(5 * len(tasks), 3.8 * len(ns)),
                             squeeze=False)
    for i, n in enumerate(ns):
        for j, task in enumerate(tasks):
            ax = axes[i][j]
            rs = [r for r in rows if r["task"] == task and r["rows"] == n]
            ms = ("local", "lora", "fused", "fused_denoised")
            w = 0.8 / len(ms)
            for k, m in enumerate(ms):
                ax.bar([x + (k - 1.5) * w for x in range(len(rs))],
                       [r[m][0] if m in r else 0 for r in rs], width=w,
                       yerr=[(r[m][1] or 0) if m in r else 0 for r in rs], capsize=2,
                       label=m)
            ax.set_xticks(range(len(rs)), [r["setting"] for r in rs], fontsize=8)
            ax.set_ylim(40, 100)
            ax.set_title(f"{NAMES[task]}, {n} rows")
            ax.set_ylabel("accuracy (%)")
            ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default=str(RESULTS / "local_baseline_cells"))
    ap.add_argument("--privacy", nargs="+",
                    default=[str(RESULTS / f"{n}.json") for n in PRIVACY_FILES],
                    help="privacy_by_mechanism JSON files; a later file adds the settings the "
                    "earlier ones lack")
    ap.add_argument("--rows", nargs="+", default=["500", "2000"])
    ap.add_argument("--name", default="local_baseline_by_kind")
    args = ap.parse_args()
    g = scored_cells(Path(args.cells), RESULTS / "local_baseline_scored.jsonl",
                     tuple(args.rows))
    rows = summary(g)
    privacy = merged_privacy([Path(f) for f in args.privacy])
    write_json(RESULTS / f"{args.name}.json", {"command": command(), "machine": machine(),
                                               "summary": rows})
    plot(rows, RESULTS / f"{args.name}.png")
    md = ["# Noise by kind of token: accuracy beside the local model (uniform P 0.6 vs by kind)",
          "", f"`{command()}` on this machine ({machine()['platform']}); remote cells from "
          "`benchmarks/gpu/kind_grid.sh` (by kind) and the grid's earlier GPU runs (uniform: "
          "`local_baseline.md`), the same training sample and noise seed per seed"
          + ("; the r0.7z and r0.7z10k cells (personal data, and for r0.7z10k the words "
             "beyond the 10,000 most frequent, at η 0) on a 2-core CPU, `python -m "
             "benchmarks.local_baseline remote --backbone .gpu-carry/minilm --spans "
             ".gpu-carry/personal_spans.json.gz --ps r0.7z r0.7z10k ...`, with the GPU runs' "
             "float16 MiniLM weights and personal data found by Presidio with spaCy's model "
             "and the Census name lists (`rapt.privacy.name_list`, rapt's detector since; the "
             "other by-kind cells and the privacy table below ran without the lists, except "
             "r0.7z10k's row, `privacy_by_mechanism_beyond10k.md`)" if any(
                 r["setting"] == "r0.7z" for r in rows) else "") + ".", "",
          "Accuracy (%), mean ± 95 % CI over paired seeds (Student t). \"fused − local\": "
          "paired difference, in points; \"fused − uniform LoRA\": this setting's fused model "
          "minus the uniform P 0.6 remote LoRA of the same seed. Utility goal (issue 52): "
          "fused − local ≥ 2 with its CI above 0, and fused − uniform LoRA ≥ 5. \"P all tokens\": "
          "share of the training rows' tokens replaced (special tokens counted: a lower bound).",
          "", *table(rows), "",
          "## Privacy per kind of token at each setting (dev or test texts; best attacker per "
          "kind, 1 − its recovery: an upper bound)", "", *privacy_table(privacy), ""]
    write_md(RESULTS / f"{args.name}.md", md)


if __name__ == "__main__":
    main()
