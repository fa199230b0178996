"""Membership inference on prompted LLMs (Flocks §3, Figure 2) with SmolLM2-135M.

    python -m benchmarks.bench_mia                    # CPU profile: 8 prompts x (1 + 25)
    python -m benchmarks.bench_mia --profile cpu-50 --out benchmarks/results/mia_50 \
        --pate-json benchmarks/results/pate_large.json      # 50 prompts x (1 + 50)
    python -m benchmarks.bench_mia --profile paper    # 100 prompts x (1 + 50)

Writes benchmarks/results/mia.{json,md,png}. The table also lists the attack against the
PromptPATE student prompts when benchmarks/results/pate.json exists (bench_pate.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks._common import RESULTS, command, machine
from rapt.attacks.mia import mean_roc, prompt_mia
from rapt.data import load_dataset
from rapt.models import load_backbone
from rapt.pate.pate import as_demos, get_template
from rapt.pate.scorer import HFLabelScorer
from rapt.stats import mean_ci

PROFILES = {"cpu": dict(prompts=8, nonmembers=25), "cpu-large": dict(prompts=20, nonmembers=50),
            # issue 15: enough prompts per task for a readable AUC spread (~5 min a task)
            "cpu-50": dict(prompts=50, nonmembers=50),
            "paper": dict(prompts=100, nonmembers=50),
            "smoke": dict(prompts=2, nonmembers=3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", choices=list(PROFILES), default="cpu")
    ap.add_argument("--tasks", default="sst2-sentences,trec")
    ap.add_argument("--shots", type=int, default=1)
    ap.add_argument("--backbone", default="smollm2-135m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "mia"))
    ap.add_argument("--pate-json", default=str(RESULTS / "pate.json"),
                    help="bench_pate.py output with the student-prompt attack results")
    args = ap.parse_args()
    prof = PROFILES[args.profile]
    report: dict = {
        "command": command(), "profile": args.profile,
        "backbone": args.backbone, "shots": args.shots, **prof,
        "machine": machine(),
        "tasks": {}}
    bb = load_backbone(args.backbone, device="cuda" if torch.cuda.is_available() else "cpu")
    results = {}
    for task in args.tasks.split(","):
        t = get_template(task)
        scorer = HFLabelScorer(bb, t.label_words)
        private = as_demos(load_dataset(task, "train").examples)
        t0 = time.perf_counter()
        res = prompt_mia(scorer, t, private, n_prompts=prof["prompts"], shots=args.shots,
                         n_nonmembers=prof["nonmembers"], seed=args.seed)
        secs = time.perf_counter() - t0
        results[task] = res
        fpr, tpr = mean_roc(res.curves())
        report["tasks"][task] = {**res.summary(), "seconds": secs,
                                 "votes_per_s": scorer.n_votes / secs,
                                 "member_scores": [m.tolist() for m in res.member_scores],
                                 "nonmember_scores": [n.tolist() for n in res.nonmember_scores],
                                 "mean_roc": {"fpr": fpr.tolist(), "tpr": tpr.tolist()}}
        print(task, res.mean_auc, file=sys.stderr)
    pate_json = Path(args.pate_json)
    student = {}
    if pate_json.exists():
        pate = json.loads(pate_json.read_text())
        for task, r in pate.get("tasks", {}).items():
            for name, row in r.get("diagnostics_not_private", r)["runs"].items():
                if "student_mia_auc" in row:
                    student[f"{task} / {name}"] = row["student_mia_auc"]
    report["student_prompt_auc"] = student
    report["machine"]["loadavg_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    md = [f"# Membership inference on {args.shots}-shot prompts ({args.backbone})", "",
          f"Profile `{args.profile}`: {prof['prompts']} prompts, each scored on its "
          f"{args.shots} member(s) and {prof['nonmembers']} random other training examples "
          "(Flocks: 100 prompts, 1 vs 50). Score = P(true label word) as the next token. "
          f"Command `{report['command']}`; load average at start "
          f"{report['machine']['loadavg_start'][0]:.1f}.", "",
          "| attacked prompt | prompts | mean AUC ± 95 % CI | std | AUC quartiles (25/50/75 %) "
          "| mean P(true) members | non-members |",
          "|---|---|---|---|---|---|---|"]
    for task, r in report["tasks"].items():
        _, ci = mean_ci(r["aucs"])
        q = np.percentile(r["aucs"], [25, 50, 75])
        md.append(f"| {task}, private {args.shots}-shot | {r['prompts']} | {r['mean_auc']:.3f} "
                  f"± {ci:.3f} | {r['std_auc']:.3f} | {q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f} | "
                  f"{r['mean_member_score']:.3f} | {r['mean_nonmember_score']:.3f} |")
    for name, auc in student.items():
        md.append(f"| PromptPATE student, {name} | 1 | {auc:.3f} | - | - | - | - |")
    md += ["", "Student rows: members = private examples inside teacher prompts, non-members = "
           "other private examples, scored under the released student prompt (from "
           "bench_pate.py). Flocks reports AUC 0.84 on dbpedia with GPT-3 Babbage.", ""]
    out.with_suffix(".md").write_text("\n".join(md))
    plot(results, out.with_suffix(".png"), args)
    print("\n".join(md))


def plot(results: dict, path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(4.2 * len(results), 7.5), squeeze=False)
    for j, (task, res) in enumerate(results.items()):
        m = np.concatenate(res.member_scores)
        n = np.concatenate(res.nonmember_scores)
        bins = np.linspace(0, max(m.max(), n.max()), 25)
        ax = axes[0, j]
        ax.hist(n, bins=bins, alpha=0.6, density=True, label="non-members")
        ax.hist(m, bins=bins, alpha=0.6, density=True, label="members")
        ax.set_xlabel("P(true label)")
        ax.set_title(f"{task}: probability distribution")
        ax.legend(fontsize=8)
        ax = axes[1, j]
        for f, t in res.curves():
            ax.plot(f, t, color="gray", alpha=0.4, lw=0.8)
        fpr, tpr = mean_roc(res.curves())
        ax.plot(fpr, tpr, color="tab:blue", lw=2, label=f"mean (AUC {res.mean_auc:.2f})")
        ax.plot([0, 1], [0, 1], "r--", lw=1, label="random guess")
        ax.set_xlabel("FPR")
        ax.set_ylabel("TPR")
        ax.set_title(f"{task}: ROC of {len(res.aucs)} prompts")
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"MIA on {args.shots}-shot prompts, {args.backbone}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
