"""`rapt demo`'s setting (SST-2, 400 training rows, 300 test queries, 3 seeds) with and without
``--personal-rank 10000``, paired: the same data, seeds and noise seed, so the two by-kind arms
differ only in the words beyond the 10,000 most frequent public words (P 0.7's η, or η 0).
The demo runs with OS noise, so two demo runs differ by their noise too; this one does not.

    python -m benchmarks.bench_demo_personal_rank --noise-seed 0

Writes benchmarks/results/demo_personal_rank.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks._common import RESULTS, command, machine, save_png, write_json, write_md

RANKS = {"r0.7z (--personal-rank 0)": None, "r0.7z10k (the default)": 10_000}


def run(noise_seed: int) -> dict:
    from rapt.demo_choice import ChoiceConfig, run_choice
    from rapt.models import load_backbone

    bb = load_backbone("minilm")
    out = {}
    for name, rank in RANKS.items():
        res = run_choice(ChoiceConfig(personal_rank=rank, noise_seed=noise_seed),
                         log=lambda s: print(s, flush=True), backbone=bb)
        out[name] = {"rows": res.rows, "arms": {a: {k: v for k, v in r.items() if k != "report"}
                                                for a, r in res.arms.items()},
                     "seconds": res.seconds}
    return out


def paired(doc: dict) -> dict:
    """default − previous, per setting row, over the paired seeds."""
    from rapt.stats import paired_difference

    a, b = (doc["runs"][n] for n in RANKS)
    rows_a = {r["setting"]: r["accuracies"] for r in a["rows"]}
    return {r["setting"]: paired_difference([100 * x for x in r["accuracies"]],
                                            [100 * x for x in rows_a[r["setting"]]])
            for r in b["rows"] if "by kind" in r["setting"]}


def markdown(doc: dict) -> list[str]:
    lines = ["# `rapt demo` with and without --personal-rank 10000, paired", "",
             f"`{doc['command']}` on {doc['machine']['platform']} "
             f"({doc['machine']['cpu_count']} CPUs), {doc['wall_s'] / 60:.1f} min. SST-2, 400 "
             "training rows, 300 test queries, 3 seeds, the same noise seed for both.", "",
             "| setting | " + " | ".join(RANKS) + " | default − previous (points) |",
             "|---|---|---|---|"]
    runs = [{r["setting"]: r for r in doc["runs"][n]["rows"]} for n in RANKS]
    for setting in runs[0]:
        cells = [f"{100 * r[setting]['accuracy']:.1f} ± {100 * r[setting]['ci95']:.1f}"
                 for r in runs]
        d = doc["paired"].get(setting)
        diff = "—" if d is None else f"{d['mean_diff']:+.1f} ± {d['ci95']:.1f}"
        lines.append(f"| {setting} | " + " | ".join(cells) + f" | {diff} |")
    return lines


def plot(doc: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i, name in enumerate(RANKS):
        rows = doc["runs"][name]["rows"]
        ax.errorbar([100 * r["accuracy"] for r in rows],
                    [j + 0.15 * i for j in range(len(rows))],
                    xerr=[100 * r["ci95"] for r in rows], fmt="o", label=name)
    ax.set_yticks(range(len(rows)), [r["setting"] for r in rows])
    ax.set_xlabel("accuracy (%), 300 SST-2 test queries")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--noise-seed", type=int, default=0)
    ap.add_argument("--render", action="store_true", help="only write the md, png and paired "
                    "differences again from the results json")
    args = ap.parse_args()
    stem = RESULTS / "demo_personal_rank"
    if args.render:
        doc = json.loads(stem.with_suffix(".json").read_text())
    else:
        t0 = time.perf_counter()
        doc = {"command": command(), "machine": machine(), "runs": run(args.noise_seed)}
        doc["wall_s"] = time.perf_counter() - t0
    doc["paired"] = paired(doc)
    write_json(stem.with_suffix(".json"), doc)
    write_md(stem.with_suffix(".md"), markdown(doc))
    plot(doc, stem.with_suffix(".png"))
    print("\n".join(markdown(doc)))


if __name__ == "__main__":
    main()
