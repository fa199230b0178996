"""The channel remedies over the whole grid (issue 27): one table from every bench_channel run.

Each ``benchmarks/bench_channel.py`` run covers one cell (task, P, tuning method) and writes its
own ``channel*.json``. This script gathers their raw rows into one document shaped as the issue
asks -- a ``runs`` list (``task``, ``method``, ``setting``, ``P``, ``seed``, ``accuracy``) and an
``attacks`` list (``task``, ``backbone``, ``P``, ``attacker``, ``recovery``) -- and recomputes,
per cell and remedy, the paired difference to +privatization with its 95 % CI, the share of the
gap won back, the goal (≥ half, CI above 0) and a Holm-adjusted p-value over every remedy
comparison in the grid (several remedies and cells are tested together).

Writes benchmarks/results/channel_grid.{json,md,png}.

    python -m benchmarks.channel_grid [--inputs benchmarks/results/channel.json ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks._common import RESULTS, command
from rapt.stats import gap_won_back, holm, mean_ci

DEFAULT_INPUTS = ("channel.json", "channel_lora.json", "channel_p0.2.json",
                  "channel_p0.2_lora.json", "channel_fp.json", "channel_fp_adapter_long.json",
                  "channel_fp_lora.json", "channel_fp_p0.2.json", "channel_fp_p0.2_lora.json",
                  "channel_attacks_p0.6.json", "channel_fp_attacks_p0.6.json")
REMEDIES = ("+channel adapter", "+denoise-then-tune", "+privatized-MLM backbone")
TASKS = {"sst2": "SST-2", "financial_phrasebank": "FP"}


def gather(paths: list[Path]) -> dict:
    """{"sources", "runs", "attacks"} from the bench_channel documents at ``paths``."""
    doc: dict = {"sources": [], "runs": [], "attacks": []}
    for p in paths:
        d = json.loads(p.read_text())
        doc["sources"].append({"file": p.name, "command": d.get("command"),
                               "machine": d.get("machine"), "history": d.get("history"),
                               "adapter": (d.get("adapter") or {}).get("folder"),
                               "denoiser": ((d.get("regime") or {}).get("denoiser") or {})
                               .get("folder")})
        doc["runs"] += [{k: r[k] for k in ("task", "method", "setting", "P", "seed",
                                           "accuracy")} | {"source": p.name}
                        for r in d["runs"]]
        doc["attacks"] += [a | {"source": p.name} for a in d.get("attacks", [])]
    return doc


def _acc(runs: list[dict], setting: str) -> dict[int, float]:
    return {r["seed"]: r["accuracy"] for r in runs if r["setting"] == setting}


def cells(doc: dict) -> list[dict]:
    """Per (task, P, method): each setting's mean ± CI and each remedy's paired comparison;
    Holm-adjusted p-values over all remedy comparisons of the grid."""
    order = {s["file"]: i for i, s in enumerate(doc["sources"])}
    keys = sorted({(r["task"], r["P"], r["method"], r["source"]) for r in doc["runs"]},
                  key=lambda k: (k[0] != "sst2", k[0], -k[1], k[2] != "prefix", order[k[3]]))
    out = []
    for task, P, method, source in keys:
        runs = [r for r in doc["runs"]
                if (r["task"], r["P"], r["method"], r["source"]) == (task, P, method, source)]
        cell: dict = {"task": task, "P": P, "method": method, "source": source,
                      "settings": {}, "remedies": {}}
        for s in dict.fromkeys(r["setting"] for r in runs):
            acc = _acc(runs, s)
            m, ci = mean_ci(list(acc.values()))
            cell["settings"][s] = {"mean": m, "ci95": ci, "n": len(acc)}
        non, pri = _acc(runs, "no privacy"), _acc(runs, "+privatization")
        for rem in REMEDIES:
            got = _acc(runs, rem)
            seeds = sorted(set(got) & set(non) & set(pri))
            if len(seeds) < 2:
                continue
            won = gap_won_back([got[s] for s in seeds], [pri[s] for s in seeds],
                               [non[s] for s in seeds])
            d = won["diff"]
            cell["remedies"][rem] = {"seeds": seeds, "diff": d, "gap": won["gap"],
                                     "share": won["share"],
                                     "goal_met": bool(won["share"] >= 0.5 and d["excludes_zero"]
                                                      and d["mean_diff"] > 0)}
        out.append(cell)
    tests = [(c, r) for c in out for r in c["remedies"]]
    adjusted = holm([c["remedies"][r]["diff"]["p_value"] for c, r in tests]) if tests else []
    for (c, r), p in zip(tests, adjusted, strict=True):
        c["remedies"][r]["p_holm"] = p
    return out


def markdown(doc: dict, grid: list[dict]) -> str:
    lines = ["# Channel remedies over the grid (issue 27)", "",
             "Every cell is one `benchmarks/bench_channel.py` run (MiniLM, `rapt demo`'s regime: "
             "800 training sentences, 2 epochs, frozen label-description head; 5 paired seeds: "
             "seed s has the same init, data order and privatized text in every setting). "
             "Paired differences to +privatization with 95 % CIs; Holm-adjusted p over every "
             "remedy comparison below. Goal: ≥ half of the gap won back with the CI above 0.",
             "", "| task | P | method | no privacy | +privatization | gap (points) | remedy | "
             "remedy − privatization (points) | share of gap | p (Holm) | goal | file |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in grid:
        s = c["settings"]
        if "no privacy" not in s or "+privatization" not in s:
            continue
        base = (f"| {TASKS.get(c['task'], c['task'])} | {c['P']} | {c['method']} | "
                f"{s['no privacy']['mean']:.3f} ± {s['no privacy']['ci95']:.3f} | "
                f"{s['+privatization']['mean']:.3f} ± {s['+privatization']['ci95']:.3f} | ")
        for rem, v in c["remedies"].items():
            d, g = v["diff"], v["gap"]
            lines.append(base + f"{100 * g['mean_diff']:.1f} ± {100 * g['ci95']:.1f} | {rem} | "
                         f"{100 * d['mean_diff']:+.1f} ± {100 * d['ci95']:.1f} | "
                         f"{v['share']:.0%} | {v['p_holm']:.3f} | "
                         f"{'met' if v['goal_met'] else 'not met'} | {c['source']} |")
    lines += ["", "Controls (no extra tuning; the named prompt re-scored):", "",
              "| task | P | method | control | accuracy |", "|---|---|---|---|---|"]
    for c in grid:
        for name, r in c["settings"].items():
            if name.startswith(("+privatization,", "no-privacy prompt")):
                lines.append(f"| {TASKS.get(c['task'], c['task'])} | {c['P']} | {c['method']} "
                             f"| {name} | {r['mean']:.3f} ± {r['ci95']:.3f} |")
    lines += ["", "Attackers on each cell's first seed's privatized test queries (text tokens):",
              "", "| task | P | attacker | recovery, all tokens | replaced tokens only |",
              "|---|---|---|---|---|"]
    seen = set()
    for a in doc["attacks"]:
        key = (a["task"], a["P"], a["attacker"])
        if key in seen:  # the LoRA cell attacks the same queries as the prefix cell
            continue
        seen.add(key)
        lines.append(f"| {TASKS.get(a['task'], a['task'])} | {a['P']} | {a['attacker']} | "
                     f"{a['recovery']:.1%} | {a['recovery_replaced']:.1%} |")
    if doc.get("notes"):
        lines += ["", "## Reading", "", doc["notes"]]
    lines += ["", "Sources:", ""]
    for src in doc["sources"]:
        m = src.get("machine") or {}
        runs = "; ".join(f"{h['started']}, {h['wall_s'] / 60:.0f} min, load "
                         f"{h['load_start'][0]:.1f}→{h['load_end'][0]:.1f}"
                         for h in src.get("history") or [])
        lines.append(f"- `{src['file']}`: `{src['command']}` (adapter `{src['adapter']}`, "
                     f"denoiser `{src['denoiser']}`); {m.get('platform')}, {m.get('cpus')} "
                     f"shared CPUs, {m.get('threads')} torch thread(s); sessions: {runs}")
    return "\n".join(lines) + "\n"


def plot(grid: list[dict], out: Path) -> None:
    """Per cell: no privacy, +privatization and each remedy (mean ± CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [c for c in grid if "no privacy" in c["settings"]]
    fig, ax = plt.subplots(figsize=(2.6 * max(1, len(cols)) + 2, 4.2))
    names = ("no privacy", "+privatization", *REMEDIES)
    colors = ("#999999", "#d62728", "#9467bd", "#2ca02c", "#1f77b4")
    width = 0.8 / len(names)
    for j, (name, color) in enumerate(zip(names, colors, strict=True)):
        xs, ys, es = [], [], []
        for i, c in enumerate(cols):
            if name in c["settings"]:
                xs.append(i + (j - len(names) / 2 + 0.5) * width)
                ys.append(c["settings"][name]["mean"])
                es.append(c["settings"][name]["ci95"])
        if xs:
            ax.bar(xs, ys, width, yerr=es, capsize=3, color=color, label=name)
    def label(c: dict) -> str:
        twin = sum((d["task"], d["P"], d["method"]) == (c["task"], c["P"], c["method"])
                   for d in cols) > 1  # two runs of one cell: name the file
        return (f"{TASKS.get(c['task'], c['task'])}, P {c['P']}, {c['method']}"
                + (f"\n({Path(c['source']).stem})" if twin else ""))

    ax.set_xticks(range(len(cols)), [label(c) for c in cols], fontsize=8)
    ax.set_ylim(0.4, 1.0)
    ax.set_ylabel("test accuracy (5 paired seeds, 95 % CI)")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Channel remedies vs +privatization (MiniLM)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", nargs="*", default=None,
                    help="bench_channel JSON files (default: the committed cells)")
    ap.add_argument("--notes", default=None,
                    help="file whose text goes into the JSON and the md as the reading of the "
                         "numbers (default: keep the reading already in channel_grid.json)")
    args = ap.parse_args()
    paths = [Path(p) for p in args.inputs] if args.inputs else [
        RESULTS / n for n in DEFAULT_INPUTS if (RESULTS / n).is_file()]
    if not paths:
        sys.exit("no bench_channel results found")
    doc = gather(paths)
    doc["command"] = command()
    old = RESULTS / "channel_grid.json"
    doc["notes"] = (Path(args.notes).read_text().strip() if args.notes else
                    json.loads(old.read_text()).get("notes") if old.is_file() else None)
    grid = cells(doc)
    doc["grid"] = grid
    (RESULTS / "channel_grid.json").write_text(json.dumps(doc, indent=2) + "\n")
    (RESULTS / "channel_grid.md").write_text(markdown(doc, grid))
    plot(grid, RESULTS / "channel_grid.png")
    print(markdown(doc, grid))


if __name__ == "__main__":
    main()
