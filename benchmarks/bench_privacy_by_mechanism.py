"""Empirical privacy per kind of token, uniform noise vs noise by kind, against every attacker
we have: nearest neighbour, the Bayes attacker (unigram public prior, and a prior over the
public text's protected-class tokens: an attacker who knows frequent words pass in clear) and
the domain denoiser trained per mechanism on the GPU (``benchmarks.bench_kind_attack``).

The releases are the GPU run's (SST-2 and FP dev, privatized once per mechanism with fixed
seeds; the denoiser's guesses ride along). A mechanism without a GPU file is released here with
the same seeds, and its denoiser is marked not run. Per kind (frequency band of the public word
list, personal data by Presidio: ``rapt.privacy.kind_recovery``), privacy = 1 − the best
recovery of the attackers run, chosen per kind (the attacker best on that kind: a stronger
figure than any one attacker's, and still an upper bound on privacy).

    python -m benchmarks.bench_privacy_by_mechanism --guesses benchmarks/results/kind_attack \\
        --etas .gpu-carry/etas.json --spans .gpu-carry/personal_spans.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import time
from pathlib import Path

import torch

from benchmarks._common import RESULTS, command, machine, save_png, write_json, write_md
from benchmarks.bench_kind_attack import DEV, DOMAIN, domain_texts, policy_for, release
from benchmarks.bench_privacy_by_kind import BAYES
from rapt.privacy.kind_recovery import best_by_kind, recovery_by_kind

# The goal's kinds: personal data and every band beyond the 1,000 most frequent public words.
GOAL_KINDS = ("personal data", "1k-10k", "rarer")
# Tasks the GPU call did not release or attack: privatized here, no denoiser run on them.
LOCAL_ONLY = {"trec": ("trec", "test")}
NAMES = {"nn": "nearest neighbour", "bayes": "Bayes, unigram public prior",
         "bayes_protected": "Bayes, prior over public protected-class tokens",
         "denoiser": "domain denoiser (trained per mechanism)",
         "context": "context guess (the original most often between the same two released "
                    "neighbours in the domain's public text released by the mechanism)"}
# The context attacker's public text per task: the domain denoiser's (SST-2 and FP splits that
# are not a dev split, dev texts dropped) and, for TREC, its training split.
CONTEXT_DOMAIN = {"sst2": DOMAIN, "financial_phrasebank": DOMAIN, "trec": (("trec", "train"),)}


def context_guesser(bb, task: str, eta, policy, spans, seed: int, dev_texts: set[str]):
    """A ContextGuesser fitted on the task's public domain text released by the mechanism."""
    from rapt.attacks.context import ContextGuesser

    texts = domain_texts(CONTEXT_DOMAIN[task], dev_texts)
    clean, private = release(bb, texts, eta, policy, spans, seed=seed)
    return ContextGuesser.fit(clean, private)


def kinds_for(bb, texts, spans, room: int):
    """TokenKinds of ``texts`` cut to ``room`` tokens per text; personal data as the mechanism
    classed it (each name found carried over the texts: ``rapt.privacy.by_kind.personal_spans``;
    results before 2026-11-29 counted each text's own findings)."""
    from rapt.privacy.by_kind import personal_spans
    from rapt.privacy.kinds import token_kinds

    k = token_kinds(texts, bb.tokenizer, spans=personal_spans(texts, spans=spans))
    cut = lambda rows: [r[:room] for r in rows]  # noqa: E731
    return cut(k.ids), cut(k.bands), cut(k.personal), cut(k.words)


def priors(bb, spans) -> dict:
    """Log priors of the two Bayes attackers, from rapt's public word-list texts."""
    from rapt.attacks.bayes import unigram_log_prior
    from rapt.privacy.by_kind import FREQUENT, KindPolicy, classes_of
    from rapt.privacy.kinds import public_word_texts, token_kinds
    from rapt.privacy.personal_data import PersonalDataDetector

    texts, _ = public_word_texts()
    texts = texts[:20000]
    V = bb.embeddings.shape[0]
    missing = [t for t in texts if t not in spans]  # rapt's public sample: found here
    found = dict(zip(missing, PersonalDataDetector().find_all(missing), strict=True)) \
        if missing else {}
    k = token_kinds(texts, bb.tokenizer, spans=[spans.get(t, found.get(t)) for t in texts])
    classes = classes_of(k, KindPolicy("rare").frequent_rank)
    protected = [[t for t, c in zip(r, cs, strict=True) if c != FREQUENT]
                 for r, cs in zip(k.ids, classes, strict=True)]
    return {"bayes": unigram_log_prior(k.ids, V, bb.special_ids),
            "bayes_protected": unigram_log_prior(protected, V, bb.special_ids)}


def score(kinds: tuple, clean, private, bayes: dict, den, context=None) -> tuple[dict, dict]:
    """Every attacker's recovery by kind on one release (``kinds``: :func:`kinds_for` of its
    texts), and per kind the best of them (``context``: a fitted
    :class:`rapt.attacks.context.ContextGuesser`, or None)."""
    _, bands, personal, words = kinds
    replaced = [[a != b for a, b in zip(o, p, strict=True)]
                for o, p in zip(clean, private, strict=True)]
    lengths = [len(r) for r in private]
    flat = torch.tensor([t for r in private for t in r], dtype=torch.long)
    guesses = {"nn": private}
    for b, att in bayes.items():
        guesses[b] = [x.tolist() for x in torch.split(att.guess(flat), lengths)]
    if den is not None:
        guesses["denoiser"] = den
    if context is not None:
        guesses["context"] = context.guess(private)
    rec = {a: recovery_by_kind(clean, gs, replaced, bands, personal, words)
           for a, gs in guesses.items()}
    return rec, best_by_kind(rec)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--guesses", default=str(RESULTS / "kind_attack"))
    ap.add_argument("--etas")
    ap.add_argument("--spans")
    ap.add_argument("--baseline", nargs="*", default=[],
                    help="earlier results JSON whose uniform cells (u0.6) the goal's table "
                         "compares with, for tasks this run has none of")
    ap.add_argument("--render", metavar="JSON",
                    help="only write the md and png of a results json again (with --baseline)")
    ap.add_argument("--mechs", nargs="+", default=["u0.6", "r0.6", "r0.7"])
    ap.add_argument("--context", action="store_true",
                    help="also run the context attacker (rapt.attacks.context), fitted per "
                         "mechanism and task on public domain text released here")
    ap.add_argument("--limit", type=int, default=0, help="first N dev texts (dry runs)")
    ap.add_argument("--tasks", nargs="+", default=list(DEV), choices=[*DEV, *LOCAL_ONLY],
                    help="trec: no GPU release or denoiser guesses exist for it; it is "
                         "privatized here and attacked by nearest neighbour and Bayes only")
    ap.add_argument("--out", default=str(RESULTS / "privacy_by_mechanism"))
    args = ap.parse_args()
    if not args.render and not (args.etas and args.spans):
        ap.error("--etas and --spans are required (unless --render)")
    return args


def main() -> None:
    from benchmarks.personal_spans import load_spans
    from rapt.attacks.bayes import BayesAttacker
    from rapt.models import load_backbone
    from rapt.privacy.mechanism import candidate_ids_from_tokenizer
    from rapt.privacy.nn_search import build_index

    args = parse_args()
    if args.render:
        doc = json.loads(Path(args.render).read_text())
        doc["goal"] = goal(doc["cells"], baseline_cells(args.baseline))
        write_all(Path(args.render).with_suffix(""), doc, json_too=False)
        return
    torch.set_num_threads(1)
    t0, c0 = time.perf_counter(), time.process_time()
    etas = json.loads(Path(args.etas).read_text())
    spans = load_spans(args.spans)
    bb = load_backbone("minilm")
    cand = candidate_ids_from_tokenizer(bb.tokenizer, bb.embeddings.shape[0])
    index = build_index(bb.embeddings[cand].float(), "exact")
    from rapt.data import load_dataset

    dev = {t: list(load_dataset(*{**DEV, **LOCAL_ONLY}[t]).texts) for t in args.tasks}
    if args.limit:
        dev = {t: x[:args.limit] for t, x in dev.items()}
    log_priors = priors(bb, spans)
    seen = {x.strip().lower() for t in DEV for x in load_dataset(*DEV[t]).texts} \
        | {x.strip().lower() for t in dev for x in dev[t]}
    cells, gpu = [], {}
    for name in args.mechs:
        eta, policy = policy_for(name, etas)
        f = Path(args.guesses) / f"kind_attack_{name}.json.gz"
        got = json.loads(gzip.decompress(f.read_bytes())) if f.exists() else None
        if got:
            gpu[name] = {k: v for k, v in got.items() if k != "tasks"}
        bayes = {b: BayesAttacker.build(bb.embeddings, eta, lp, k=BAYES["bayes_k"],
                                        samples=BAYES["bayes_samples"],
                                        confirm_samples=BAYES["bayes_confirm_samples"],
                                        max_confirm=BAYES["bayes_max_confirm"],
                                        z=BAYES["bayes_z"], special_ids=bb.special_ids,
                                        candidate_ids=cand, index=index, seed=500)
                 for b, lp in log_priors.items()}
        fitted: dict = {}
        for t_i, (task, texts) in enumerate(dev.items()):
            g = got["tasks"].get(task) if got else None
            if g:
                n = len(texts)
                clean, private, den = g["clean"][:n], g["private"][:n], g["guess"][:n]
            else:
                clean, private = release(bb, texts, eta, policy, spans, seed=100 + 10 * t_i)
                den = None
            kinds = kinds_for(bb, texts, spans, max(map(len, clean)))
            if kinds[0] != clean:
                raise SystemExit(f"{name} {task}: the release's rows are not the dev texts'")
            ctx = None
            if args.context:  # one fit per mechanism and public domain (SST-2 and FP share one)
                dom = CONTEXT_DOMAIN[task]
                if dom not in fitted:
                    fitted[dom] = context_guesser(bb, task, eta, policy, spans,
                                                  7 + len(fitted), seen)
                ctx = fitted[dom]
            rec, best = score(kinds, clean, private, bayes, den, ctx)
            cells.append({"mechanism": name, "task": task, "eta": eta,
                          "policy": policy.record(eta), "denoiser_run": den is not None,
                          "attackers": rec, "best": best})
            print(f"{name} {task}: " + "  ".join(
                f"{k} {100 * (best[k]['privacy'] or 0):.1f} ({best[k]['attacker']})"
                for k in ("all", *GOAL_KINDS)), flush=True)
    doc = {"command": command(), "machine": machine(), "etas": etas, "gpu_runs": gpu,
           "attackers": {k: v for k, v in NAMES.items()
                         if any(k in c["attackers"] for c in cells)},
           "bayes": BAYES, "cells": cells,
           "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
           "subsample": f"first {args.limit} dev texts" if args.limit else None}
    doc["machine"]["loadavg_end"] = list(os.getloadavg())
    doc["goal"] = goal(cells, baseline_cells(args.baseline))
    write_all(Path(args.out), doc)


def write_all(stem: Path, doc: dict, json_too: bool = True) -> None:
    if json_too:
        write_json(Path(f"{stem}.json"), doc)
    write_md(Path(f"{stem}.md"), markdown(doc))
    plot(doc, Path(f"{stem}.png"))


def baseline_cells(paths: list[str]) -> list[dict]:
    """The uniform P 0.6 cells of earlier results files, each marked with its file."""
    out = []
    for f in paths:
        for c in json.loads(Path(f).read_text())["cells"]:
            if c["mechanism"] == "u0.6":
                out.append({**c, "from": Path(f).name})
    return out


def goal(cells: list[dict], baseline: list[dict] = ()) -> list[dict]:
    """Per task and by-kind mechanism: is its privacy on each goal kind at least uniform
    P 0.6's (point estimates, each against its best attacker)? The uniform cell is this run's,
    else the first of ``baseline`` for the task (its file named in ``uniform_from``)."""
    out = []
    base = {c["task"]: c for c in reversed(list(baseline))}
    base.update({c["task"]: c for c in cells if c["mechanism"] == "u0.6"})
    for c in cells:
        if c["mechanism"].startswith("u") or c["task"] not in base:
            continue
        row = {"mechanism": c["mechanism"], "task": c["task"], "kinds": {},
               "uniform_from": base[c["task"]].get("from", "this run")}
        for k in GOAL_KINDS:
            a, b = c["best"][k]["privacy"], base[c["task"]]["best"][k]["privacy"]
            row["kinds"][k] = {"by_kind": a, "uniform": b,
                               "at_least": None if a is None or b is None else a >= b}
        row["met"] = all(v["at_least"] for v in row["kinds"].values())
        out.append(row)
    return out


def split_of(task: str) -> str:
    return {**DEV, **LOCAL_ONLY}[task][1]


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def markdown(doc: dict) -> str:
    from benchmarks.local_baseline import LABELS
    from rapt.privacy.kinds import BANDS

    label = {"u0.6": "uniform P 0.6", **{k: f"by kind: {v}" for k, v in LABELS.items()}}
    tasks = sorted({c["task"] for c in doc["cells"]})
    here = [f"{c['mechanism']} {c['task']}" for c in doc["cells"] if not c["denoiser_run"]]
    lines = ["# Privacy per kind of token: uniform noise vs noise by kind (MiniLM, "
             f"{', '.join(tasks)})", "", f"`{doc['command']}` ({doc['wall_s'] / 60:.1f} min wall "
             f"on {doc['machine']['platform']}); the releases and the domain denoiser's guesses "
             "from `benchmarks.bench_kind_attack` (where each denoiser line says)"
             + (f"; {', '.join(here)}: privatized here, no denoiser run (the other attackers "
                "only: upper bounds the denoiser would lower)"
                if here else "") + ".", "",
             doc["subsample"] and f"Subsample: {doc['subsample']}." or
             "Every text of " + ", ".join(f"{t} {split_of(t)}" for t in tasks)
             + " (cut to 46 tokens, as the domain attacker reads them).", "",
             "Privacy = 1 − the best recovery among the attackers run, chosen per kind (so the "
             "best attacker can differ between kinds); 95 % Wilson interval over tokens "
             "(too narrow for the contextual denoiser). An upper bound on privacy: a stronger "
             "attacker lowers it.", "",
             "Attackers: " + "; ".join(f"{k}: {v}" for k, v in doc["attackers"].items()) + ".",
             ""]
    for name, g in doc["gpu_runs"].items():
        # the GPU runs recorded neither (kind_grid.sh, float16 MiniLM); r0.7z's CPU run recorded
        # the device only (benchmarks/gpu/README.md has its command: --backbone minilm)
        where = (f"{g['device']}, backbone {g.get('backbone', 'minilm')}" if "device" in g
                 else "GPU, `benchmarks/gpu/kind_grid.sh`, float16 MiniLM")
        lines.append(f"- denoiser for {name} ({where}): {g['pairs']:,} training pairs "
                     f"({g['domain_texts']:,} domain texts × repeats), {g['steps']} steps in "
                     f"{g['train_s']:.0f} s; last curve point "
                     f"{json.dumps(g['curve'][-1]) if g['curve'] else '–'}")
    if here:
        lines.append(f"- denoiser not run for {', '.join(here)} (no guesses file): those rows "
                     "are against the other attackers only")
    kinds = ("all", *BANDS, "personal data")
    for task in dict.fromkeys(c["task"] for c in doc["cells"]):
        lines += ["", f"## {task} {split_of(task)}", "",
                  "| mechanism | " + " | ".join(kinds) + " |",
                  "|---|" + "---|" * len(kinds)]
        for c in (c for c in doc["cells"] if c["task"] == task):
            cols = []
            for k in kinds:
                b = c["best"][k]
                ci = b["privacy_ci95"]
                cols.append(f"{_pct(b['privacy'])}" + (
                    f" ({_pct(ci[0])}–{_pct(ci[1])}), {b['attacker']}" if ci else ""))
            lines.append(f"| {label.get(c['mechanism'], c['mechanism'])} | "
                         + " | ".join(cols) + " |")
        lines += ["", "Share of each kind's tokens replaced in the release:", "",
                  "| mechanism | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
        for c in (c for c in doc["cells"] if c["task"] == task):
            lines.append(f"| {c['mechanism']} | " + " | ".join(
                "–" if not c["best"][k]["count"] else
                f"{100 * c['best'][k]['replaced'] / c['best'][k]['count']:.0f} %"
                for k in kinds) + " |")
    lines += ["", "## The goal's privacy condition (point estimates, best attacker per kind)",
              "", "| task | mechanism | " + " | ".join(GOAL_KINDS) + " | at least uniform "
              "P 0.6 on all three | uniform from |",
              "|---|---|" + "---|" * (len(GOAL_KINDS) + 2)]
    for g in doc["goal"]:
        lines.append(f"| {g['task']} | {g['mechanism']} | " + " | ".join(
            f"{_pct(v['by_kind'])} vs {_pct(v['uniform'])}" for v in g["kinds"].values())
            + f" | {'yes' if g['met'] else 'no'} | {g.get('uniform_from', 'this run')} |")
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rapt.privacy.kinds import BANDS

    kinds = ("all", *BANDS, "personal data")
    tasks = list(dict.fromkeys(c["task"] for c in doc["cells"]))
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        cs = [c for c in doc["cells"] if c["task"] == task]
        w = 0.8 / len(cs)
        for j, c in enumerate(cs):
            ax.bar([i + (j - (len(cs) - 1) / 2) * w for i in range(len(kinds))],
                   [100 * (c["best"][k]["privacy"] or 0) for k in kinds], width=w,
                   label=c["mechanism"])
        ax.set_xticks(range(len(kinds)), kinds, rotation=25, ha="right", fontsize=8)
        ax.set_ylabel("empirical privacy, % of tokens (best attacker per kind)")
        ax.set_title(f"{task} {split_of(task)}")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


if __name__ == "__main__":
    main()
