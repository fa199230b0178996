"""Empirical privacy per kind of token: SST-2 and FP dev text privatized with MiniLM at P 0.2,
0.4 and 0.6, attacked by nearest neighbour and the mechanism-aware Bayes attacker.

Each dev set's tokens are sorted into kinds (:mod:`rapt.privacy.kinds`): the frequency band of
their word in rapt's public word list (counted on TREC, CB, TrustPilot and the bundled sample,
never SST-2 or FP) and personal data (spans Presidio finds, with spaCy's English model). The
whole dev set is privatized once per P, at the η that ``calibrate_eta_public`` gives for that
P, with a fixed seed; each attacker's guesses are scored per kind
(:func:`rapt.privacy.kind_recovery.recovery_by_kind`): recovery of all tokens of the kind, of
its replaced tokens, and empirical privacy = 1 − recovery, with 95 % Wilson intervals, per token
and per word. The Bayes attacker's prior is the same public text, tokenized.

Not run: the contextual (domain) denoiser, the strongest attacker measured so far
(``attackers.md``): its trained weights are not on the machine this was measured on, and
training them takes hours of CPU. Its per-kind figures are still to be measured.

Writes benchmarks/results/privacy_by_kind.{json,md,png} (``--out`` for another stem).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_privacy_by_kind
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from pathlib import Path

import torch

from benchmarks._common import RESULTS, command, machine, save_png, write_json, write_md
from rapt.privacy.kind_recovery import KINDS, best_by_kind, recovery_by_kind

TASKS = {"sst2": ("sst2", "dev"), "financial_phrasebank": ("financial_phrasebank", "dev")}
NAMES = {"nn": "nearest neighbour", "bayes": "mechanism-aware Bayes (unigram prior)"}
BAYES = {"bayes_k": 1000, "bayes_samples": 64, "bayes_confirm_samples": 1024,
         "bayes_max_confirm": 64, "bayes_z": 3.0}  # the shipped attack table's settings
NOT_RUN = [{"attacker": "domain denoiser (contextual, bench_channel_denoiser --corpus domain)",
            "why": "its trained weights are not on this machine (training takes hours of "
                   "CPU); it is the strongest attacker measured so far (attackers.md), so "
                   "these figures are upper bounds on privacy that it would lower, above all "
                   "for the frequent words"}]
EXAMPLES = 6


def kinds_of(task: str, bb, freq, detector, limit: int):
    """(texts, TokenKinds) of a task's dev set (its first ``limit`` texts when > 0)."""
    from rapt.data import load_dataset
    from rapt.privacy.kinds import token_kinds

    name, split = TASKS[task]
    texts = list(load_dataset(name, split).texts)
    texts = texts[:limit] if limit > 0 else texts
    return texts, token_kinds(texts, bb.tokenizer, freq, detector)


def describe(texts, kinds) -> dict:
    """What a task's text holds: spans per entity type, with the first few examples."""
    spans: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    for text, found in zip(texts, kinds.spans, strict=True):
        for s in found:
            spans[s.entity] += 1
            seen = examples.setdefault(s.entity, [])
            if len(seen) < EXAMPLES and text[s.start:s.end] not in seen:
                seen.append(text[s.start:s.end])
    return {"texts": len(texts), "spans": dict(spans.most_common()),
            "texts_with_spans": sum(bool(s) for s in kinds.spans), "examples": examples}


def bayes_for(bb, eta: float, prior, cand, index, seed: int):
    """The Bayes attacker at ``eta``: its screen is built once and attacks every task."""
    from rapt.attacks.bayes import BayesAttacker, unigram_log_prior

    log_prior = unigram_log_prior(prior, bb.embeddings.shape[0], bb.special_ids)
    return BayesAttacker.build(bb.embeddings, eta, log_prior, k=BAYES["bayes_k"],
                               samples=BAYES["bayes_samples"],
                               confirm_samples=BAYES["bayes_confirm_samples"],
                               max_confirm=BAYES["bayes_max_confirm"], z=BAYES["bayes_z"],
                               special_ids=bb.special_ids, candidate_ids=cand, index=index,
                               seed=seed)


def attack(bb, kinds, eta: float, seed: int, bayes, cand, index) -> dict:
    """One privatization of the task's rows at ``eta``; each attacker's recovery by kind."""
    from rapt.attacks.recovery import ReconstructionInput, nearest_neighbour_attack
    from rapt.privacy.mechanism import Privatizer, replacement_probability

    rows = kinds.ids
    priv = Privatizer(bb.embeddings, eta, special_ids=bb.special_ids, candidate_ids=cand,
                      index=index, seed=seed)
    flat = torch.tensor([i for r in rows for i in r], dtype=torch.long)
    released = priv.privatize_ids(flat).cpu()
    private = [r.tolist() for r in torch.split(released, [len(r) for r in rows])]
    replaced = [[a != b for a, b in zip(o, p, strict=True)] for o, p in zip(rows, private,
                                                                           strict=True)]
    inp = ReconstructionInput(private, bb.embeddings, eta, tuple(bb.special_ids), cand, index)
    attackers = {"nn": lambda: nearest_neighbour_attack(inp),
                 "bayes": lambda: [g.tolist() for g in torch.split(bayes.guess(released),
                                                                    [len(r) for r in rows])]}
    out = {"eta": eta, "P": replacement_probability(rows, private, bb.special_ids),
           "attackers": {}, "seconds": {}}
    for name, run in attackers.items():
        t0 = time.perf_counter()
        out["attackers"][name] = recovery_by_kind(rows, run(), replaced, kinds.bands,
                                                  kinds.personal, kinds.words)
        out["seconds"][name] = round(time.perf_counter() - t0, 1)
    out["best"] = best_by_kind(out["attackers"])
    return out


def measure(args) -> dict:
    from rapt.models import load_backbone
    from rapt.privacy.kinds import load_word_frequencies, public_word_texts
    from rapt.privacy.mechanism import (
        calibrate_eta_public,
        candidate_ids_from_tokenizer,
        tokenize_texts,
    )
    from rapt.privacy.nn_search import build_index
    from rapt.privacy.personal_data import PersonalDataDetector

    bb = load_backbone("minilm")
    freq = load_word_frequencies()
    detector = PersonalDataDetector()
    public, sources = public_word_texts()
    prior = tokenize_texts(public, bb.tokenizer)
    cand = candidate_ids_from_tokenizer(bb.tokenizer, bb.embeddings.shape[0])
    # Exact search: the nearest neighbour the calibration's certified-exact "fast" search also
    # finds, and on one thread here 5x quicker per token.
    index = build_index(bb.embeddings[cand].float(), "exact")
    etas = {p: calibrate_eta_public(bb, p) for p in args.target_p}
    tasks = {task: kinds_of(task, bb, freq, detector, args.limit) for task in args.tasks}
    cells, built = [], {}
    for p_i, (p, eta) in enumerate(etas.items()):
        t0 = time.perf_counter()
        bayes = bayes_for(bb, eta, prior, cand, index, 500 + p_i)
        built[str(p)] = round(time.perf_counter() - t0, 1)
        for t_i, (task, (_, kinds)) in enumerate(tasks.items()):
            cell = attack(bb, kinds, eta, 100 + 10 * t_i + p_i, bayes, cand, index)
            cells.append({"task": task, "target_p": p, **cell})
            print(f"{task} P {cell['P']:.3f}: " + "  ".join(
                f"{k} {cell['best'][k]['privacy']:.3f}" for k in KINDS
                if cell["best"][k]["privacy"] is not None), flush=True)
    cells.sort(key=lambda c: (args.tasks.index(c["task"]), c["target_p"]))
    return {"backbone": "minilm", "tokenizer": type(bb.tokenizer).__name__,
            "word_list": {"file": "src/rapt/resources/public_word_counts.txt",
                          "header": list(freq.header), "band_sizes": freq.band_sizes()},
            "detector": detector.record,
            "prior": {"sources": sources, "texts": len(prior),
                      "tokens": sum(map(len, prior))},
            "attackers": {"nn": {"name": NAMES["nn"]},
                          "bayes": {"name": NAMES["bayes"], **BAYES,
                                    "note": "one screen per η, shared by both tasks"}},
            "search": "exact", "bayes_screen_seconds": built,
            "not_run": NOT_RUN, "etas": {str(p): e for p, e in etas.items()},
            "tasks": {t: describe(*tk) for t, tk in tasks.items()}, "cells": cells}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _ci(ci: list[float] | None) -> str:
    return "" if ci is None else f" ({100 * ci[0]:.1f}–{100 * ci[1]:.1f})"


def task_table(doc: dict, task: str) -> list[str]:
    lines = ["| kind | P | tokens (words) | replaced | NN recovery | Bayes recovery | Bayes: "
             "replaced recovered | privacy, tokens (95 % CI) | privacy, words |",
             "|---|---|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        for c in (c for c in doc["cells"] if c["task"] == task):
            nn, by = c["attackers"]["nn"][kind], c["attackers"]["bayes"][kind]
            best = c["best"][kind]
            rep = "–" if not nn["count"] else f"{nn['replaced'] / nn['count']:.0%}"
            lines.append(
                f"| {kind} | {c['P']:.2f} | {nn['count']:,} ({nn['words']['count']:,}) | {rep} "
                f"| {_pct(nn['recovery'])} | {_pct(by['recovery'])} | "
                f"{_pct(by['replaced_recovery'])} | {_pct(best['privacy'])}"
                f"{_ci(best['privacy_ci95'])} | {_pct(best['word_privacy'])} |")
    return lines


def attackers_line(doc: dict) -> str:
    """The md's paragraph on the attackers run, their settings and their time."""
    screens = ", ".join(f"{v:.0f}" for v in doc["bayes_screen_seconds"].values())
    cells = "; ".join(f"{c['task']} P {c['P']:.2f}: " + ", ".join(
        f"{k} {v:.0f} s" for k, v in c["seconds"].items()) for c in doc["cells"])
    return ("**Attackers run:** nearest neighbour (the release itself: it recovers no "
            "replaced token) and the mechanism-aware Bayes attacker (unigram prior from the "
            "same public text; k {bayes_k}, {bayes_samples} screen and {bayes_confirm_samples} "
            "confirm draws, at most {bayes_max_confirm} changes per call, z {bayes_z}, the "
            "shipped attack table's settings)".format(**BAYES)
            + f"; one Bayes screen per η serves both tasks (built in {screens} s). Exact "
            f"nearest-neighbour search. Attacker seconds per cell: {cells}.")


def markdown(doc: dict) -> str:
    det, wl = doc["detector"], doc["word_list"]
    lines = [
        "# Privacy per kind of token (MiniLM, SST-2 and FP dev)", "",
        f"`OMP_NUM_THREADS=1 {doc['command']}` ({doc['wall_s'] / 60:.1f} min wall, "
        f"{doc['cpu_s'] / 60:.1f} CPU-min, {doc['machine']['threads']} thread).", "",
        (f"Subsample: {doc['subsample']}." if doc.get("subsample") else
         "Every dev text of each task (no subsample)."),
        "",
        "Each dev set is privatized once per P (η from `calibrate_eta_public`, fixed seed); "
        "every attacker guesses every token of the same release. Recovery = share of the "
        "kind's tokens guessed right (percent); privacy = 1 − the best recovery of the "
        "attackers run (an upper bound: a stronger attacker lowers it), with a 95 % Wilson "
        "interval that treats tokens as independent; per word, a word counts as recovered "
        "when all its word pieces are.", "",
        "**Kinds.** Frequency bands of the token's word in the public word list "
        f"(`{wl['file']}`: TREC, CB, TrustPilot and rapt's public sample, never SST-2 or FP; "
        "ties at an edge go to the rarer band, so the bands hold "
        + ", ".join(f"{v:,} ({k})" for k, v in wl["band_sizes"].items() if k != "rarer")
        + " listed words; every word counted once or never is rarer). Personal data: tokens "
        f"inside a span found by Presidio ({det['ner_model'] or 'no NER model'}; recognizers "
        f"{', '.join(det['recognizers'])}; score ≥ {det['score_threshold']}).", "",
        attackers_line(doc),
        "", "**Not run:** " + "; ".join(f"the {n['attacker']}: {n['why']}"
                                         for n in doc["not_run"]) + ".", ""]
    for task, t in doc["tasks"].items():
        lines += [f"## {task} dev ({t['texts']:,} texts)", "",
                  f"Presidio found {sum(t['spans'].values()):,} spans in "
                  f"{t['texts_with_spans']:,} of {t['texts']:,} texts: "
                  + ", ".join(f"{k} {v:,}" for k, v in t["spans"].items()) + ".", "",
                  "First examples (judge the detector's precision):", ""]
        lines += [f"- {k}: " + ", ".join(f"`{e}`" for e in ex)
                  for k, ex in t["examples"].items()]
        lines += [""] + task_table(doc, task) + [""]
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(doc["tasks"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        cs = [c for c in doc["cells"] if c["task"] == task]
        width = 0.8 / len(cs)
        for j, c in enumerate(cs):
            ys = [100 * (c["best"][k]["privacy"] or 0.0) for k in KINDS]
            err = [[100 * ((b["privacy"] or 0) - b["privacy_ci95"][0]) if b["privacy_ci95"]
                    else 0 for b in (c["best"][k] for k in KINDS)],
                   [100 * (b["privacy_ci95"][1] - (b["privacy"] or 0)) if b["privacy_ci95"]
                    else 0 for b in (c["best"][k] for k in KINDS)]]
            ax.bar([i + (j - (len(cs) - 1) / 2) * width for i in range(len(KINDS))], ys,
                   width=width, yerr=err, capsize=2, label=f"P {c['P']:.2f}")
        ax.set_xticks(range(len(KINDS)), KINDS, rotation=25, ha="right", fontsize=8)
        ax.set_ylabel("empirical privacy, % of tokens")
        ax.set_title(f"{task} dev")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Privacy per kind of token against the best of nearest neighbour and Bayes "
                 "(the domain denoiser not run)", fontsize=10)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-p", type=float, nargs="+", default=[0.2, 0.4, 0.6])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--limit", type=int, default=0, help="first N dev texts per task (0: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS / "privacy_by_kind"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0, c0 = time.perf_counter(), time.process_time()
    doc = {"command": command(), "machine": machine(), **measure(args)}
    doc.update(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0,
               subsample=None if args.limit <= 0 else f"first {args.limit} texts per task")
    doc["machine"]["loadavg_end"] = list(os.getloadavg())
    stem = Path(args.out)
    write_json(Path(f"{stem}.json"), doc)
    write_md(Path(f"{stem}.md"), markdown(doc))
    plot(doc, Path(f"{stem}.png"))
    print(markdown(doc))


if __name__ == "__main__":
    main()
