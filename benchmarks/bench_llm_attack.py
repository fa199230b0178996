"""The LLM reconstruction attacker on MiniLM, few-shot and fine-tuned, against nearest neighbour
and the mechanism-aware Bayes attacker, at one or more P levels on SST-2 and / or FP dev.

Dev sentences (the first ``--n`` of each ``--tasks`` task) are tokenized with MiniLM's tokenizer
and privatized at the η that ``calibrate_eta_public`` gives for each ``--target-p``. Each
attacker sees the release, the mechanism and public text only (``public_corpus_for`` of the
first task, less every other evaluated task's family: for SST-2 and FP together, TREC, CB and
TrustPilot): nearest neighbour, Bayes (public unigram prior × Monte-Carlo likelihood), the
few-shot LLM attacker (:mod:`rapt.attacks.llm_recovery`: SmolLM2-135M-Instruct, examples of
public sentences privatized at the same η, greedy decoding) and, with ``--tune`` or
``--adapter``, the same LLM fine-tuned with LoRA (:mod:`rapt.attacks.llm_tuning`) on public
sentences privatized ``--repeats`` times at each ``--tune-p`` level's η, zero-shot.

Each LLM's reply filter (``llm_max_change``) is chosen on held-out public rows (never the
attacker's public text, never the evaluated rows): per P for the few-shot LLM, once over every
P for the tuned one (the adapter carries one cap). Reports token recovery over all tokens, over
replaced tokens only, over replaced tokens outside the public corpus's 100 most frequent, the
share of unreplaced tokens each attacker changed, and wall times. Writes
benchmarks/results/``--out``.{json,md} (default llm_attack).

    python -m benchmarks.bench_llm_attack [--n 100] [--threads 1] [--shots 4] [--chat]
    python -m benchmarks.bench_llm_attack --tune --tasks sst2 financial_phrasebank \\
        --target-p 0.4 0.6 [--save-adapter DIR] [--device cuda]
    python -m benchmarks.bench_llm_attack --quick --tune --tasks sst2 financial_phrasebank \\
        --target-p 0.4 0.6 --out /tmp/llm_quick    # a dry run of the code paths, no result

On a lent GPU: benchmarks/gpu/llm_attack.sh (benchmarks/gpu/README.md says how it travels).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

import torch

from benchmarks._common import RESULTS, command, machine
from benchmarks.bench_channel_denoiser import EVAL_SET, privatize, public_texts, recovery
from benchmarks.bench_gpu import environment
from rapt.attacks import ATTACKERS, ReconstructionInput
from rapt.attacks.llm_recovery import DEFAULT_MAX_CHANGE, changed_share
from rapt.attacks.llm_tuning import LLMTuningConfig, TunedLLM, train_llm_attacker
from rapt.channel.corpus import privatize_channel, task_family
from rapt.data import load_dataset
from rapt.models import load_backbone
from rapt.privacy.mechanism import (
    Privatizer,
    calibrate_eta_public,
    candidate_ids_from_tokenizer,
    replacement_probability,
    tokenize_texts,
)
from rapt.privacy.nn_search import build_index

T = TypeVar("T")
GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
TUNE_MAX_LEN = 64  # public rows up to SST-2's lengths, for the cap and the fine-tuning pairs


def filtered(private: list[list[int]], guess: list[list[int]], max_change: float,
             enc) -> list[list[int]]:
    """The LLM's guesses with llm_max_change applied afterwards (what the attacker returns at
    that setting: a row changed more than max_change is kept as received)."""
    return [g if changed_share(p, g, enc.special_ids) <= max_change else p
            for p, g in zip(private, guess, strict=True)]


NAMES = {"nn": "nearest neighbour", "bayes": "bayes", "llm": "llm (SmolLM2-135M, few-shot)",
         "tuned": "llm (SmolLM2-135M, LoRA-tuned)"}


def args_() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="dev sentences attacked per task")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--backbone", default="minilm",
                    help="encoder name or folder (the device machine's float16 copy)")
    ap.add_argument("--tasks", nargs="+", default=["sst2"], choices=sorted(EVAL_SET),
                    help="dev sets attacked; the public corpus leaves out every one's family")
    ap.add_argument("--target-p", type=float, nargs="+", default=[0.4])
    ap.add_argument("--llm", default="smollm2-135m", help="name, folder or .gguf file")
    ap.add_argument("--shots", type=int, default=4)
    ap.add_argument("--chat", action="store_true", help="frame the prompt with the chat template")
    ap.add_argument("--no-fewshot", action="store_true", help="leave the few-shot LLM out")
    ap.add_argument("--batch", type=int, default=8, help="generation batch")
    ap.add_argument("--per-source", type=int, default=3000, help="public rows per source")
    ap.add_argument("--bayes-k", type=int, default=2000)
    ap.add_argument("--bayes-samples", type=int, default=64)
    ap.add_argument("--tune-n", type=int, default=48,
                    help="held-out public rows that choose llm_max_change")
    t = ap.add_argument_group("fine-tuning (--tune, or a saved --adapter)")
    t.add_argument("--tune", action="store_true", help="fine-tune the LLM on public pairs first")
    t.add_argument("--adapter", default=None, help="a saved adapter folder instead of --tune")
    t.add_argument("--save-adapter", default=None, help="folder to save the tuned adapter in")
    t.add_argument("--tune-p", type=float, nargs="+", default=[0.4, 0.6],
                   help="P levels whose η the training pairs are privatized at (an η band)")
    t.add_argument("--repeats", type=int, default=2, help="privatizations per sentence and P")
    t.add_argument("--tune-rows", type=int, default=0,
                   help="public sentences privatized for training (0: all that fit)")
    t.add_argument("--epochs", type=int, default=1)
    t.add_argument("--lr", type=float, default=2e-4)
    t.add_argument("--lora-r", type=int, default=16)
    t.add_argument("--tune-batch", type=int, default=16)
    t.add_argument("--max-tokens", type=int, default=256, help="LLM tokens per training pair")
    t.add_argument("--budget-min", type=float, default=None, help="wall cap on training")
    ap.add_argument("--quick", action="store_true",
                    help="a few rows and steps: checks the script end to end, no result")
    ap.add_argument("--out", default="llm_attack",
                    help="results stem in benchmarks/results, or a path stem (with a '/')")
    a = ap.parse_args()
    if a.quick:
        a.n, a.tune_n, a.per_source, a.bayes_k, a.bayes_samples = 4, 6, 40, 200, 8
        a.tune_rows, a.repeats = a.tune_rows or 24, 1
    return a


@dataclass
class Ctx:
    """What every cell shares: the encoder, its candidates and index, the public rows (the
    attacker's; the held-out ones choose the caps), their frequent tokens, the LLM."""

    a: argparse.Namespace
    enc: object
    cand: torch.Tensor
    index: object
    public: list[list[int]]
    held: list[list[int]]
    frequent: set[int]
    llm: object
    corpus: dict
    llm_load_s: float
    etas: dict[float, float] = field(default_factory=dict)

    def privatizer(self, eta: float, seed: int) -> Privatizer:
        return Privatizer(self.enc.embeddings.detach(), eta, special_ids=self.enc.special_ids,
                          candidate_ids=self.cand, index=self.index, seed=seed)

    def eta(self, p: float) -> float:
        if p not in self.etas:
            self.etas[p] = float(calibrate_eta_public(self.enc, p))
        return self.etas[p]

    def decode(self, ids: list[int]) -> str:  # as the attacker turns a row into text
        return self.enc.tokenizer.decode(ids, skip_special_tokens=False).strip()

    def input(self, private: list[list[int]], eta: float, **options) -> ReconstructionInput:
        a = self.a
        return ReconstructionInput(
            private, self.enc.embeddings.detach(), float(eta), tuple(self.enc.special_ids),
            self.cand, self.index, self.public, self.enc, seed=3,
            options={"bayes_k": a.bayes_k, "bayes_samples": a.bayes_samples,
                     "llm_backbone": self.llm, "llm_shots": a.shots, "llm_chat": a.chat,
                     "llm_batch_size": a.batch, "llm_progress": False, **options})


def setup(a: argparse.Namespace) -> Ctx:
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here (use --device cpu --quick for a dry run)")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 weights, TF32 matmuls
    enc = load_backbone(a.backbone, device=device)  # float32, also from a float16 copy
    cand = candidate_ids_from_tokenizer(enc.tokenizer, enc.embeddings.shape[0])
    index = build_index(enc.embeddings.detach()[cand].float(), "fast")
    texts, corpus = public_texts(a.per_source, seed=0, task=a.tasks[0], also=tuple(a.tasks[1:]))
    rows = [list(r) for r in tokenize_texts(texts, enc.tokenizer) if r]
    corpus.update(n_tokens=sum(map(len, rows)), tokenizer=a.backbone,
                  also_disjoint_from=[task_family(t) for t in a.tasks[1:]])
    # held-out public rows choose the LLMs' reply filters; no attacker sees them
    held = [r for r in rows[:a.tune_n] if len(r) <= TUNE_MAX_LEN]
    public = rows[a.tune_n:]
    frequent = {t for t, _ in Counter(t for r in public for t in r).most_common(100)}
    t0 = time.perf_counter()
    llm = load_backbone(a.llm, kind="causal", device=device)
    return Ctx(a, enc, cand, index, public, held, frequent, llm, corpus,
               time.perf_counter() - t0)


# --------------------------------------------------------------------------- fine-tuning


def training_curve(hist: list[dict], points: int = 20) -> list[dict]:
    """Mean loss and answer accuracy over ``points`` consecutive windows of the steps."""
    size = max(1, -(-len(hist) // points))
    out = []
    for s in range(0, len(hist), size):
        w = hist[s:s + size]
        out.append({"step": w[-1]["step"], "loss": sum(h["loss"] for h in w) / len(w),
                    "answer_acc": sum(h.get("answer_acc", 0.0) for h in w) / len(w)})
    return out


def fine_tune(ctx: Ctx) -> tuple[TunedLLM, dict]:
    """LoRA-tune the LLM on public rows privatized ``--repeats`` times at each ``--tune-p``
    level's η, decoded as the attacker decodes a row; -> (adapter, facts about the run)."""
    from benchmarks.bench_attack_table import public_split

    a = ctx.a
    # Never the texts the shipped attack table attacks (its default sample), so that this
    # adapter may join that table.
    attacked, _, _ = public_split(ctx.enc, 1000, 250, 48, 0)
    table = {tuple(r) for r in attacked}
    fits = [r for r in ctx.public if len(r) <= TUNE_MAX_LEN]
    rows = [r for r in fits if tuple(r[:48]) not in table]
    left_out = len(fits) - len(rows)
    rows = rows[:a.tune_rows] if a.tune_rows > 0 else rows
    etas = [ctx.eta(p) for p in a.tune_p]
    pairs = privatize_channel(rows, ctx.privatizer(etas[0], 11), etas, repeats=a.repeats)
    texts = [(ctx.decode(p), ctx.decode(c))
             for c, p in zip(pairs.clean, pairs.private, strict=True)]
    cfg = LLMTuningConfig(lr=a.lr, epochs=a.epochs, batch_size=a.tune_batch, lora_r=a.lora_r,
                          max_tokens=a.max_tokens, seed=0)
    meta = {"corpus": ctx.corpus, "encoder": a.backbone, "eta_band": [min(etas), max(etas)],
            "etas": etas, "tune_p": a.tune_p, "repeats": a.repeats, "noise_seed": 11,
            "P_train": replacement_probability(pairs.clean, pairs.private,
                                               ctx.enc.special_ids),
            "held_out": f"{len(ctx.held)} public rows, not trained on",
            "left_out": f"{left_out} rows the shipped attack table attacks (its default "
                        "sample)"}
    hist: list[dict] = []
    cap = None if a.budget_min is None else time.perf_counter() + 60 * a.budget_min

    def progress(rec: dict) -> None:
        hist.append(rec)
        if rec["step"] % 50 == 0 or rec["step"] == rec["total_steps"]:
            print(f"tune step {rec['step']}/{rec['total_steps']}: loss {rec['loss']:.3f} "
                  f"answer acc {rec.get('answer_acc', float('nan')):.3f}", flush=True)

    t0 = time.perf_counter()
    tuned = train_llm_attacker(ctx.llm, texts, cfg, meta=meta, progress=progress,
                               should_stop=None if cap is None
                               else (lambda: time.perf_counter() > cap))
    wall = time.perf_counter() - t0
    return tuned, {"pairs": len(texts), "sentences": len(rows), "train_wall_s": wall,
                   "s_per_step": wall / max(1, len(hist)), "curve": training_curve(hist)}


# --------------------------------------------------------------------------- reply caps


def held_releases(ctx: Ctx) -> dict[float, list[list[int]]]:
    """The held-out public rows privatized at each evaluated P's η (seed 4)."""
    return {p: privatize(ctx.privatizer(ctx.eta(p), 4), ctx.held) for p in ctx.a.target_p}


def cap_grid(ctx: Ctx, releases: dict[float, list[list[int]]],
             raws: dict[float, list[list[int]]]) -> dict[float, dict]:
    """Recovery of the held-out rows at every cap of :data:`GRID`, pooled over ``releases``."""
    clean = [r for _ in releases for r in ctx.held]
    private = [r for p in releases for r in releases[p]]
    raw = [r for p in releases for r in raws[p]]
    return {t: recovery(clean, private, filtered(private, raw, t, ctx.enc), ctx.frequent)
            for t in GRID}


def best_cap(grid: dict[float, dict]) -> float:
    return max(grid, key=lambda t: (grid[t]["all"], -t))


def guarded(what: str, fn: Callable[[], T]) -> T | str:
    """``fn()``, or the error's text: on a lent GPU one attacker's failure must not cost the
    others' results (the traceback goes to the log)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        print(f"{what} failed:", file=sys.stderr)
        traceback.print_exc()
        return f"{type(e).__name__}: {e}"


def pick_caps(ctx: Ctx, tuned: TunedLLM | None) -> dict:
    """Each LLM's reply filter, chosen on the held-out public rows: per P for the few-shot LLM,
    one over every P for the adapter (stored in it)."""
    releases, out = held_releases(ctx), {"fewshot": {}, "tuned": None}
    if not ctx.a.no_fewshot:
        for p, private in releases.items():
            raw = guarded(f"few-shot cap at P {p}", lambda p=p, private=private: ATTACKERS[
                "llm"](ctx.input(private, ctx.eta(p), llm_max_change=1.0)))
            if not isinstance(raw, str):
                grid = cap_grid(ctx, {p: private}, {p: raw})
                out["fewshot"][p] = {"chosen": best_cap(grid), "grid": grid}
    if tuned is not None:
        raws = guarded("tuned cap", lambda: {
            p: ATTACKERS["llm"](ctx.input(private, ctx.eta(p), **tuned_options(tuned, 1.0)))
            for p, private in releases.items()})
        if not isinstance(raws, str):
            grid = cap_grid(ctx, releases, raws)
            tuned.config.max_change = best_cap(grid)
            out["tuned"] = {"chosen": tuned.config.max_change, "grid": grid}
    return out


def tuned_options(tuned: TunedLLM, max_change: float | None = None) -> dict:
    """The attacker's options with the adapter: zero-shot, plain prompt, its own cap."""
    opts = {"llm_adapter": tuned, "llm_shots": 0, "llm_chat": False}
    return opts if max_change is None else {**opts, "llm_max_change": max_change}


# --------------------------------------------------------------------------- cells


def cell(ctx: Ctx, task: str, p: float, tuned: TunedLLM | None, caps: dict) -> dict:
    """Every attacker on ``task``'s first ``--n`` dev sentences privatized at P ``p`` (seed 2)."""
    a, enc = ctx.a, ctx.enc
    name, split = EVAL_SET[task]
    texts = list(load_dataset(name, split).texts)[:a.n]
    clean = [r for r in tokenize_texts(texts, enc.tokenizer) if r]
    eta = ctx.eta(p)
    private = privatize(ctx.privatizer(eta, 2), clean)
    inp = ctx.input(private, eta)
    res, wall, guesses = {}, {}, {}
    runs = [("nn", {}), ("bayes", {})]
    if not a.no_fewshot:
        runs.append(("llm", {"llm_max_change": caps["fewshot"].get(p, {}).get(
            "chosen", DEFAULT_MAX_CHANGE)}))
    if tuned is not None:
        runs.append(("tuned", tuned_options(tuned)))
    for key, opts in runs:
        t0 = time.perf_counter()
        attack = ATTACKERS["llm" if key == "tuned" else key]
        got = guarded(f"{key} on {task} at P {p}",
                      partial(attack, replace(inp, options={**inp.options, **opts})))
        wall[NAMES[key]] = time.perf_counter() - t0
        if isinstance(got, str):
            res[NAMES[key]] = {"error": got}
            continue
        guesses[key] = got
        res[NAMES[key]] = recovery(clean, private, got, ctx.frequent)
    examples = [{"private": ctx.decode(private[i]), "original": ctx.decode(clean[i]),
                 **{NAMES[k]: ctx.decode(g[i]) for k, g in guesses.items() if k != "nn"}}
                for i in range(min(3, len(clean)))]
    return {"task": task, "target_p": p, "eta": eta,
            "set": f"{task} {split}, first {len(clean)} sentences",
            "P": replacement_probability(clean, private, enc.special_ids), "results": res,
            "wall_s": wall, "examples": examples}


def document(ctx: Ctx, host: dict, t_start: float, tuned: TunedLLM | None, run: dict | None,
             caps: dict, cells: list[dict]) -> dict:
    """The results file's contents so far."""
    a = ctx.a
    return {"command": command(), "quick": a.quick,
            "machine": {**host, "loadavg_end": list(os.getloadavg())},
            "environment": environment(torch.device(a.device)),
            "backbone": a.backbone, "llm": a.llm, "etas": ctx.etas, "tasks": a.tasks,
            "target_p": a.target_p, "public_corpus": ctx.corpus,
            "held_out": f"{len(ctx.held)} public rows (not in the attackers' public text, not "
                        "trained on), privatized with seed 4 at each P",
            "llm_options": {"shots": a.shots, "chat": a.chat, "batch_size": a.batch,
                            "greedy": True, "max_new_tokens": "1.5 × the row's LLM tokens",
                            "max_change_default": DEFAULT_MAX_CHANGE},
            "caps": {"fewshot": {str(p): c for p, c in caps["fewshot"].items()},
                     "tuned": caps["tuned"]},
            "tuning": None if tuned is None else {"run": run, "config": tuned.config.__dict__,
                                                  "meta": tuned.meta,
                                                  "loaded_from": a.adapter},
            "llm_load_s": ctx.llm_load_s, "cells": cells,
            "total_wall_s": time.perf_counter() - t_start,
            "attacks": [{"task": c["task"], "backbone": "minilm", "P": c["target_p"],
                         "attacker": k, "recovery": v["all"]}
                        for c in cells for k, v in c["results"].items() if "error" not in v]}


def write(out_arg: str, doc: dict) -> str:
    """``doc`` as STEM.json and its report as STEM.md; -> the report."""
    stem = Path(out_arg) if "/" in out_arg else RESULTS / out_arg
    stem.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n"
    Path(f"{stem}.json").write_text(text)
    report = markdown(json.loads(text))  # from the file's own contents (string keys)
    Path(f"{stem}.md").write_text(report)
    return report


def main() -> None:
    a = args_()
    torch.set_num_threads(a.threads)  # the machine is shared
    host, t_start = machine(), time.perf_counter()
    ctx = setup(a)
    tuned, run = None, None
    if a.adapter:
        tuned = TunedLLM.load(a.adapter, ctx.llm)
    elif a.tune:
        tuned, run = fine_tune(ctx)
    caps = pick_caps(ctx, tuned)
    if tuned is not None and a.save_adapter:
        tuned.save(a.save_adapter)  # with the cap chosen on held-out public rows
    cells: list[dict] = []
    # written after every step: a run cut by a wall cap keeps what it measured
    report = write(a.out, document(ctx, host, t_start, tuned, run, caps, cells))
    for task in a.tasks:
        for p in a.target_p:
            cells.append(cell(ctx, task, p, tuned, caps))
            report = write(a.out, document(ctx, host, t_start, tuned, run, caps, cells))
    print(report)


# --------------------------------------------------------------------------- report


def _header(o: dict) -> list[str]:
    m, c, e = o["machine"], o["public_corpus"], o["environment"]
    sources = ", ".join(f"{s['name']}/{s['split']} {s['texts']}" for s in c["sources"])
    where = e.get("gpu") or f"{m['cpu_count']} CPUs shared, {m['threads']} thread(s)"
    lines = [
        "# LLM reconstruction attacker, few-shot and LoRA-tuned, vs nearest neighbour and Bayes",
        "", f"`{o['command']}` on {m['platform']}, {where}; load {m['loadavg_start'][0]:.1f} "
        f"before, {m['loadavg_end'][0]:.1f} after; {o['total_wall_s'] / 60:.1f} min in all.", ""]
    if o["quick"]:
        lines += ["**A --quick dry run of the code paths: a handful of rows and steps. These "
                  "numbers measure nothing.**", ""]
    lines += [f"Encoder `{o['backbone']}`; η per P: " + ", ".join(
        f"P {p} → {eta:.4g}" for p, eta in o["etas"].items()) + " (calibrated on rapt's "
        f"public sample). Public text (the attackers' examples, Bayes prior, fine-tuning): "
        f"{c['n_texts']:,} texts, {c['n_tokens']:,} tokens ({sources}). Reply caps chosen on "
        f"{o['held_out']}.", ""]
    t = o["tuning"]
    if t is not None:
        meta, cfg, run = t["meta"], t["config"], t["run"]
        lines += [f"Tuned LLM: `{meta['base']}` + LoRA r {cfg['lora_r']} on {cfg['targets']}, "
                  f"lr {cfg['lr']:g}, batch {cfg['batch_size']}, {meta['steps']} steps "
                  f"({'stopped by the wall cap' if meta['stopped'] else 'all planned'}) on "
                  f"{meta['pairs']:,} pairs ({meta['dropped']} too long) privatized at η "
                  f"{', '.join(f'{x:.4g}' for x in meta['etas'])} (P {meta['tune_p']}, "
                  f"{meta['repeats']} × each, P measured {meta['P_train']:.3f}); reply cap "
                  f"{cfg['max_change']}."
                  + (f" Loaded from `{t['loaded_from']}`." if t["loaded_from"] else ""), ""]
        if run:
            lines += [f"Training: {run['train_wall_s'] / 60:.1f} min, "
                      f"{run['s_per_step']:.2f} s a step. Curve (step: loss / answer-token "
                      "accuracy): " + ", ".join(f"{r['step']}: {r['loss']:.3f} / "
                                                f"{r['answer_acc']:.3f}" for r in run["curve"]),
                      ""]
    return lines


def markdown(o: dict) -> str:
    lines = _header(o)
    for c in o["cells"]:
        lines += [f"## {c['set']}, P ≈ {c['target_p']} (η {c['eta']:.4g}, measured "
                  f"{c['P']:.3f})", "", "| attacker | all tokens | replaced only | replaced, "
                  "outside top-100 | unreplaced changed | wall s |", "|---|---|---|---|---|---|"]
        for k, r in c["results"].items():
            if "error" in r:
                lines.append(f"| {k} | failed: {r['error'][:120]} | | | | |")
                continue
            lines.append(f"| {k} | {r['all']:.1%} | {r['replaced_only']:.1%} | "
                         f"{r['replaced_rare']:.1%} | {r['unreplaced_changed']:.1%} | "
                         f"{c['wall_s'][k]:.0f} |")
        lines.append("")
    lines += ["## Reply caps on the held-out public rows (all tokens / replaced only)", "",
              "| max change | " + " | ".join([f"few-shot, P {p}" for p in o["caps"]["fewshot"]]
                                            + (["tuned, all P"] if o["caps"]["tuned"] else []))
              + " |", "|---|" + "---|" * (len(o["caps"]["fewshot"]) + bool(o["caps"]["tuned"]))]
    grids = [g["grid"] for g in o["caps"]["fewshot"].values()]
    grids += [o["caps"]["tuned"]["grid"]] if o["caps"]["tuned"] else []
    for t in map(str, GRID):
        lines.append(f"| {t} | " + " | ".join(f"{g[t]['all']:.1%} / "
                                              f"{g[t]['replaced_only']:.1%}" for g in grids)
                     + " |")
    chosen = [f"few-shot P {p}: {g['chosen']:g}" for p, g in o["caps"]["fewshot"].items()]
    chosen += [f"tuned: {o['caps']['tuned']['chosen']:g}"] if o["caps"]["tuned"] else []
    lines += ["", "Chosen: " + "; ".join(chosen) + f" (few-shot module default "
              f"{o['llm_options']['max_change_default']:g}).", "", "Examples (first cell):", ""]
    for e in o["cells"][0]["examples"] if o["cells"] else []:
        lines += [f"- {k}: {v}" for k, v in e.items()] + [""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
