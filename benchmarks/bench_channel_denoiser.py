"""The contextual denoiser attacker on MiniLM, against nearest neighbour, at one P or several.

Public text (``public_corpus_for(--task)``, without the families of ``--eval-tasks`` either, and
without any text the shipped attack table attacks, so the model may join that table; for SST-2
and FP together: TREC, CB premises and hypotheses, TrustPilot) is privatized by the provider at
the η that ``calibrate_eta_public`` gives for each P of ``--target-p`` (several: an η band),
``--repeats`` times with fresh noise (:func:`rapt.channel.corpus.privatize_channel`); a
:class:`rapt.channel.denoiser.Denoiser` is trained on the (privatized -> original) pairs, either
for a wall-clock budget on ``--threads`` threads or for ``--epochs`` passes over every pair
(``--budget-min`` is then only a wall cap). ``--eval-every N``: every N steps the held-out curve
(the dev releases below, plain argmax) and, with ``--save``, a checkpoint; ``--init DIR`` goes on
training a saved one (a new ``--noise-seed`` gives fresh privatizations). Its change margin is
fitted on held-out public pairs (:func:`fit_change_margin`), and it is evaluated on each eval
task's dev sentences privatized at each P with fixed seeds: token recovery over all non-special
tokens, over replaced tokens only (nearest neighbour: 0 by construction) and over the replaced
tokens outside the public corpus's 100 most frequent, plus the share of unreplaced tokens it
wrongly changes. Writes STEM.{json,md} (+ STEM.png, the curve), STEM = ``--out`` or
benchmarks/results/channel_denoiser.

    python -m benchmarks.bench_channel_denoiser --threads 2 --per-source 0 --target-p 0.4 0.6 \
        --eval-tasks sst2 financial_phrasebank --eval-every 167 --epochs 1 \
        --save DIR --out benchmarks/results/attacker_denoiser_band
    python -m benchmarks.bench_channel_denoiser --device cuda --backbone .gpu-carry/minilm \
        --per-source 0 --repeats 3 --epochs 4 --budget-min 3 --save DIR --out $OUT/STEM

``--save DIR`` keeps the trained denoiser (outside the repo) for benchmarks/bench_channel.py's
denoise-then-tune setting and for ``bench_attack_table --denoiser minilm=DIR``. ``--device
cuda``: backbone, privatization, training and evaluation on the GPU; ``--backbone`` may be a
local folder (the float16 copy carried to the device machine, see benchmarks/gpu/README.md): it
is loaded in float32 either way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from benchmarks._common import RESULTS, command, machine, save_png
from benchmarks.bench_gpu import environment
from rapt.channel.corpus import (
    PUBLIC_SOURCES,
    privatize_channel,
    public_corpus_for,
    task_family,
)
from rapt.channel.denoiser import (
    Denoiser,
    DenoiserConfig,
    fit_change_margin,
    train_denoiser,
)
from rapt.data import load_dataset
from rapt.models import load_backbone
from rapt.privacy.inversion import invert_ids
from rapt.privacy.mechanism import (
    Privatizer,
    calibrate_eta_public,
    candidate_ids_from_tokenizer,
    replacement_probability,
    tokenize_texts,
)

HOLDOUT = 300  # public rows kept out of training, to fit the change margin on
EVAL_SET = {"sst2": ("sst2", "dev"), "financial_phrasebank": ("financial_phrasebank", "dev")}


def public_texts(limit_per_source: int, seed: int, task: str = "sst2",
                 also: tuple[str, ...] = ()) -> tuple[list[str], dict]:
    """``public_corpus_for(task)`` texts without the families in ``also`` either (a seeded
    subset of each split; every row when ``limit_per_source`` <= 0), shuffled; -> (texts,
    provenance)."""
    drop = {task_family(t) for t in also}
    sources = [s for s in PUBLIC_SOURCES[task_family(task)] if task_family(s[0]) not in drop]
    corpus = public_corpus_for(task, sources=sources, max_rows_per_source=limit_per_source
                               if limit_per_source > 0 else None, seed=seed)
    texts = [t for t in corpus.texts if t.strip()]
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
    return [texts[i] for i in order], corpus.provenance()


def recovery(clean, private, guess, frequent: set[int]) -> dict:
    """Token recovery of ``guess`` over all tokens, replaced ones, replaced rare ones, and the
    share of unreplaced tokens it changed."""
    n = rep = ok = ok_rep = rare = ok_rare = kept = broke = 0
    for c, p, g in zip(clean, private, guess, strict=True):
        for a, b, x in zip(c, p, g, strict=True):
            n += 1
            ok += a == x
            if a != b:
                rep += 1
                ok_rep += a == x
                if a not in frequent:
                    rare += 1
                    ok_rare += a == x
            else:
                kept += 1
                broke += a != x
    return {"tokens": n, "replaced": rep, "all": ok / n, "replaced_only": ok_rep / max(1, rep),
            "replaced_rare": ok_rare / max(1, rare), "rare_replaced": rare,
            "unreplaced_changed": broke / max(1, kept)}


def gain_ci(clean, private, base, guess, n_boot: int = 2000, seed: int = 0) -> dict:
    """Paired bootstrap over sentences of ``guess``'s gain over ``base`` in recovery of all
    tokens and of replaced ones (percentage points); -> point, 95 % CI per measure."""
    per = torch.tensor([[sum(a == x for a, x in zip(c, g, strict=True)) -
                         sum(a == x for a, x in zip(c, b0, strict=True)),
                         len(c),
                         sum(a == x for a, p, x in zip(c, p_, g, strict=True) if a != p),
                         sum(a != p for a, p in zip(c, p_, strict=True))]
                        for c, p_, b0, g in zip(clean, private, base, guess, strict=True)],
                       dtype=torch.float64)
    idx = torch.randint(0, len(per), (n_boot, len(per)),
                        generator=torch.Generator().manual_seed(seed))
    boot = per[idx].sum(1)  # (n_boot, 4)
    out = {}
    for key, num, den in (("all", 0, 1), ("replaced_only", 2, 3)):
        point = per[:, num].sum() / per[:, den].sum().clamp(min=1)
        draws = boot[:, num] / boot[:, den].clamp(min=1)
        lo, hi = torch.quantile(draws, torch.tensor([0.025, 0.975], dtype=torch.float64))
        out[key] = {"gain_pp": 100 * point.item(), "ci95_pp": [100 * lo.item(), 100 * hi.item()]}
    return out


def privatize(priv: Privatizer, rows: list[list[int]]) -> list[list[int]]:
    return privatize_channel(rows, priv).private


def steps_for_budget(bb, cfg: DenoiserConfig, clean, private,
                     budget_s: float) -> tuple[int, float]:
    """Optimizer steps that fit in ``budget_s``, from 3 timed steps on a throwaway copy."""
    probe = DenoiserConfig(**{**cfg.__dict__, "epochs": 1})
    n = 4 * cfg.batch_size
    t0 = time.perf_counter()
    train_denoiser(bb, clean[:n], private[:n], probe)
    per_step = (time.perf_counter() - t0) / 4
    return max(1, int(budget_s / per_step)), per_step


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--backbone", default="minilm",
                    help="name or local folder (the device machine's carried float16 copy); "
                         "always loaded in float32")
    ap.add_argument("--task", default="sst2", choices=sorted(EVAL_SET),
                    help="evaluation task; the public corpus is disjoint from it")
    ap.add_argument("--budget-min", type=float, default=None,
                    help="wall minutes of training (default 12); with --epochs only a wall cap")
    ap.add_argument("--epochs", type=int, default=None,
                    help="train this many passes over every pair instead of for a wall budget")
    ap.add_argument("--repeats", type=int, default=1,
                    help="privatizations of the public corpus, each with fresh noise")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", default=None, help="folder to save the trained denoiser in")
    ap.add_argument("--target-p", type=float, nargs="+", default=[0.4],
                    help="P levels: the training pairs are privatized at each one's η (an η "
                         "band), and the denoiser is evaluated at each")
    ap.add_argument("--eval-tasks", nargs="+", default=None, choices=sorted(EVAL_SET),
                    help="tasks whose dev text is attacked (default: --task); the public corpus "
                         "leaves out every one of them")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="every N steps: the held-out curve (dev recovery at each task and P) "
                         "and, with --save, a checkpoint (0: only at the end)")
    ap.add_argument("--init", default=None,
                    help="a saved denoiser (--save) to go on training, with fresh noise")
    ap.add_argument("--noise-seed", type=int, default=1,
                    help="seed of the training pairs' privatization (a new one to go on)")
    ap.add_argument("--eval-n", type=int, default=300, help="dev sentences evaluated (0: all)")
    ap.add_argument("--corpus", default="public", choices=["public", "domain", "both"],
                    help="training text: other families' (public: what the shipped table's "
                         "attacker may use), the attacked tasks' own families without their "
                         "dev split (domain: public text of the user's domain, simulated by "
                         "the disjoint splits; exact dev duplicates dropped), or both")
    ap.add_argument("--per-source", type=int, default=3000,
                    help="public rows per dataset split (0: all)")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--keep-bonus", type=float, default=8.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=48)
    ap.add_argument("--trainable", default="full", choices=["full", "lora"])
    ap.add_argument("--quick", action="store_true", help="tiny run to check the script")
    ap.add_argument("--out", default=None,
                    help="output stem (default benchmarks/results/channel_denoiser[_quick])")
    args = ap.parse_args()
    if args.epochs is not None and args.epochs < 1:
        ap.error(f"--epochs must be >= 1, got {args.epochs}")
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


def per_epoch(hist: list[dict]) -> list[dict]:
    """Mean training loss / token accuracy / replaced-token accuracy per epoch (convergence)."""
    out = []
    for e in sorted({h["epoch"] for h in hist}):
        hs = [h for h in hist if h["epoch"] == e]
        row: dict = {"epoch": e, "steps": len(hs)}
        for k in ("loss", "token_acc", "replaced_acc"):
            v = [h[k] for h in hs if k in h and not math.isnan(h[k])]
            row[k] = sum(v) / len(v) if v else None
        out.append(row)
    return out


def train(args, bb, cfg: DenoiserConfig, clean, priv, meta: dict, curve=None):
    """``--epochs`` passes over every pair (``--budget-min``: a wall cap), else as many steps as
    fit in the wall budget; ``curve(den, step)`` every ``--eval-every`` steps; ``--init`` goes
    on from a saved denoiser; -> (denoiser, facts about the run)."""
    per_step = None
    if args.epochs:
        cfg.epochs, n_rows = args.epochs, len(clean)
        cap = None if args.budget_min is None else args.budget_min * 60
    else:
        budget = 20.0 if args.quick else (args.budget_min or 12.0) * 60
        steps, per_step = steps_for_budget(bb, cfg, clean, priv, budget)
        rows = steps * cfg.batch_size
        # More steps than one pass: extra epochs over the same pairs (fresh noise is
        # --repeats: the privatization of 20k+ sentences costs minutes on a CPU).
        cfg.epochs = max(1, -(-rows // len(clean)))
        n_rows = min(len(clean), rows)
        cap = 1.2 * budget
    # Built here, not inside train_denoiser, so that the curve can read it while it trains.
    den = Denoiser.load(args.init, bb) if args.init else Denoiser(bb, cfg, meta)
    hist: list[dict] = []

    def progress(rec: dict) -> None:
        hist.append(rec)
        if curve is not None and args.eval_every and rec["step"] % args.eval_every == 0:
            curve(den, rec["step"])

    if curve is not None and args.eval_every and args.init:
        curve(den, 0)  # where it starts: the saved denoiser on the same releases
    deadline = None if cap is None else time.perf_counter() + cap
    t0, c0 = time.perf_counter(), time.process_time()
    den = train_denoiser(bb, clean[:n_rows], priv[:n_rows], cfg, meta=meta, progress=progress,
                         should_stop=None if deadline is None
                         else (lambda: time.perf_counter() > deadline), init=den)
    return den, {"rows_used": n_rows, "wall_cap_s": cap, "cpu_s_per_step_probe": per_step,
                 "train_wall_s": time.perf_counter() - t0,
                 "train_cpu_s": time.process_time() - c0, "per_epoch": per_epoch(hist)}


class Releases:
    """The dev sentences of each evaluation task, privatized once per P with fixed seeds, and
    nearest neighbour's guesses on them: the same releases for every point of the curve."""

    def __init__(self, args, bb, cand, room: int, etas: dict[float, float]) -> None:
        self.cells = []
        for t_i, task in enumerate(args.eval_tasks):
            name, split = EVAL_SET[task]
            texts = list(load_dataset(name, split).texts)
            clean = [r[:room] for r in tokenize_texts(
                texts[:args.eval_n] if args.eval_n > 0 else texts, bb.tokenizer)]
            for p_i, (p, eta) in enumerate(etas.items()):
                priv = privatize(make_privatizer(bb, eta, cand, 100 + 10 * t_i + p_i), clean)
                flat = invert_ids(torch.tensor([t for r in priv for t in r]), bb.embeddings,
                                  candidate_ids=cand).cpu()
                nn = [x.tolist() for x in torch.split(flat, [len(r) for r in priv])]
                self.cells.append({"task": task, "target_p": p, "eta": eta,
                                   "set": f"{task} {split}, first {len(clean)} sentences",
                                   "clean": clean, "private": priv, "nn": nn,
                                   "P_eval": replacement_probability(clean, priv,
                                                                     bb.special_ids)})

    def score(self, den, frequent: set[int], margin: float | None = None,
              ci: bool = False) -> list[dict]:
        """Recovery of nearest neighbour and the denoiser (at ``margin``, default its own);
        ``ci``: with the denoiser's paired bootstrap gain over nearest neighbour."""
        saved = den.config.change_margin
        den.config.change_margin = saved if margin is None else margin
        out = []
        try:
            for c in self.cells:
                guess = den.guess(c["private"])
                out.append({"task": c["task"], "target_p": c["target_p"], "eta": c["eta"],
                            "set": c["set"], "P_eval": c["P_eval"],
                            "nearest neighbour": recovery(c["clean"], c["private"], c["nn"],
                                                          frequent),
                            "denoiser": recovery(c["clean"], c["private"], guess, frequent)})
                if ci:  # nearest neighbour recovers no replaced token: its gain is the rate
                    out[-1]["denoiser"]["gain_over_nn"] = gain_ci(c["clean"], c["private"],
                                                                  c["nn"], guess)
        finally:
            den.config.change_margin = saved
        return out


def make_privatizer(bb, eta: float, cand, seed: int) -> Privatizer:
    return Privatizer(bb.embeddings, eta, special_ids=bb.special_ids, candidate_ids=cand,
                      mode="fast", seed=seed)


def drop_attacked(rows: list[list[int]], attacked: list[list[int]],
                  width: int) -> list[list[int]]:
    """``rows`` without those whose first ``width`` tokens are an ``attacked`` row (attacked rows
    are cut to ``width``); compare uncut rows, so that a long text matches whatever either side
    was cut to later."""
    table = {tuple(r) for r in attacked}
    return [r for r in rows if tuple(r[:width]) not in table]


# The splits of each evaluated family that are not its dev split: the domain attacker's text.
DOMAIN_SPLITS = {"sst2": (("sst2-sentences", "train"), ("sst2-sentences", "test")),
                 "financial_phrasebank": (("financial_phrasebank", "train"),
                                          ("financial_phrasebank", "test"))}


def near_duplicate_share(dev: list[list[int]], train: list[list[int]],
                         threshold: float = 0.8) -> float:
    """Share of ``dev`` rows with a ``train`` row whose token set overlaps theirs by at least
    ``threshold`` (Jaccard): templated sentences that exact deduplication keeps."""
    # Candidates share a token with the row; sets, not a library index: a few seconds here.
    sets = [set(r) for r in train]
    by_token: dict[int, list[int]] = {}
    for i, s in enumerate(sets):
        for t in s:
            by_token.setdefault(t, []).append(i)
    hits = 0
    for r in dev:
        a = set(r)
        # A row with Jaccard >= threshold holds all but at most (1 - threshold)|a| of this
        # row's tokens, so it holds one of its k rarest: only those rows need checking.
        k = int((1 - threshold) * len(a)) + 1
        cand = set()
        for t in sorted(a, key=lambda t: len(by_token.get(t, ())))[:k]:
            cand.update(by_token.get(t, ()))
        if any(len(a & sets[i]) / len(a | sets[i]) >= threshold for i in cand):
            hits += 1
    return hits / max(1, len(dev))


def domain_rows(tasks: list[str], bb, limit: int) -> tuple[list[list[int]], list[dict]]:
    """Token rows of the evaluated tasks' non-dev splits, without any row equal to a row of
    their dev split (FP repeats some sentences across splits); -> (rows, provenance: per
    source, and per task the share of dev rows with a near duplicate kept)."""
    rows: list[list[int]] = []
    record = []
    for task in tasks:
        name, split = EVAL_SET[task]
        dev_rows = tokenize_texts(list(load_dataset(name, split).texts), bb.tokenizer)
        dev = {tuple(r) for r in dev_rows}
        mine: list[list[int]] = []
        for src, src_split in DOMAIN_SPLITS[task]:
            if src_split == split:
                raise ValueError(f"{src}/{src_split} is the attacked split")
            ds = load_dataset(src, src_split)
            if 0 < limit < len(ds):
                ds = ds.subset(limit, seed=0)
            got = [r for r in tokenize_texts([t for t in ds.texts if t.strip()], bb.tokenizer)
                   if r]
            kept = [r for r in got if tuple(r) not in dev]
            mine += kept
            record.append({"task": task, "name": src, "split": src_split, "rows": len(ds),
                           "texts": len(kept), "dev_duplicates_dropped": len(got) - len(kept)})
        record[-1]["dev_near_duplicate_share_0.8"] = near_duplicate_share(dev_rows, mine)
        rows += mine
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0)).tolist()
    return [rows[i] for i in order], record


def training_rows(args, bb) -> tuple[list[list[int]], dict, int]:
    """Public token rows without the eval tasks' families and without any text the shipped
    attack table attacks (so this denoiser may join that table); -> (rows, provenance,
    rows dropped for the table)."""
    from benchmarks.bench_attack_table import public_split

    also = tuple(t for t in args.eval_tasks if task_family(t) != task_family(args.task))
    limit = 60 if args.quick else args.per_source
    texts, counts = [], {"sources": []}
    if args.corpus in ("public", "both"):
        texts, counts = public_texts(limit, seed=0, task=args.task, also=also)
        counts["also_disjoint_from"] = [task_family(t) for t in also]
    rows = [r for r in tokenize_texts(texts, bb.tokenizer) if r]
    if args.corpus in ("domain", "both"):
        dom, dom_sources = domain_rows(args.eval_tasks, bb, limit)
        rows += dom
        counts["sources"] = counts["sources"] + dom_sources
        counts["domain"] = ("the attacked tasks' own families, dev split left out (public "
                            "text of the user's domain, simulated by disjoint splits)")
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0)).tolist()
        rows = [rows[i] for i in order]
    # The table's defaults (250 texts cut to 48 tokens, 1,000 rows per split, seed 0), compared
    # before the rows are cut to max_length: a text longer than both cuts must match too.
    attacked, _, _ = public_split(bb, 1000, 250, 48, 0)
    room = args.max_length - 2
    kept = [r[:room] for r in drop_attacked(rows, attacked, 48)]
    counts["left_out"] = "the texts the shipped attack table attacks (its default sample)"
    return kept, counts, len(rows) - len(kept)


def main() -> None:
    args = parse_args()
    args.eval_tasks = args.eval_tasks or [args.task]
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here (use --device cpu --quick for a dry run)")
    torch.set_num_threads(args.threads)  # the machine is shared
    host = machine()
    t_start = time.perf_counter()

    bb = load_backbone(args.backbone, device=device)  # float32, also from a float16 copy
    etas = {p: calibrate_eta_public(bb, p) for p in args.target_p}
    cand = candidate_ids_from_tokenizer(bb.tokenizer, bb.embeddings.shape[0])
    clean, counts, n_table = training_rows(args, bb)
    hold = min(HOLDOUT, len(clean) // 5)
    clean, held_clean = clean[hold:], clean[:hold]
    first = etas[args.target_p[0]]
    pairs = privatize_channel(clean, make_privatizer(bb, first, cand, args.noise_seed),
                              list(etas.values()), repeats=args.repeats)
    held = privatize_channel(held_clean, make_privatizer(bb, first, cand, 3), list(etas.values()))
    p_train = replacement_probability(pairs.clean, pairs.private, bb.special_ids)
    frequent = {t for t, _ in Counter(t for r in clean for t in r).most_common(100)}
    releases = Releases(args, bb, cand, args.max_length - 2, etas)
    points: list[dict] = []

    def curve(den, step: int) -> None:
        t = time.perf_counter()
        points.append({"step": step, "cells": releases.score(den, frequent, margin=0.0)})
        if args.save:  # a checkpoint: --init goes on from it after a crash or a stop
            den.save(args.save)
        print(f"step {step}: " + "  ".join(
            f"{c['task']} P{c['target_p']}: {c['denoiser']['all']:.3f}/"
            f"{c['denoiser']['replaced_only']:.3f} (nn {c['nearest neighbour']['all']:.3f})"
            for c in points[-1]["cells"]) + f"  [{time.perf_counter() - t:.0f} s]", flush=True)

    cfg = DenoiserConfig(lr=args.lr, epochs=1, batch_size=args.batch, max_length=args.max_length,
                         trainable=args.trainable, keep_bonus=args.keep_bonus, seed=0)
    band = [min(etas.values()), max(etas.values())]
    den, run = train(args, bb, cfg, pairs.clean, pairs.private,
                     {"corpus": counts, "eta": band[0] if len(etas) == 1 else None,
                      "eta_band": band, "target_p": args.target_p, "repeats": args.repeats,
                      "noise_seed": args.noise_seed, "device": str(device)}, curve=curve)
    margin_scores = fit_change_margin(den, held.clean, held.private)
    den.meta["change_margin_fit"] = {"held_out_public_rows": hold, "recovery": margin_scores}
    if args.save:
        den.save(args.save)
    final = releases.score(den, frequent, ci=True)
    last = releases.score(den, frequent, margin=0.0)
    for cell, am in zip(final, last, strict=True):
        cell["denoiser, plain argmax (margin 0)"] = am["denoiser"]
    if args.eval_every and (not points or points[-1]["step"] != den.meta["steps"]):
        points.append({"step": den.meta["steps"], "cells": last})  # the curve's last point
    out = {"command": command(),
           "machine": {**host, "loadavg_end": list(os.getloadavg())},
           "environment": environment(device),
           "backbone": args.backbone, "task": args.task, "eval_tasks": args.eval_tasks,
           "etas": {str(p): e for p, e in etas.items()}, "P_train": p_train,
           "corpus": {"sources": counts, "sentences": len(clean), "repeats": args.repeats,
                      "left_out_for_the_attack_table": n_table,
                      "rows_used": run["rows_used"], "tokens_used": den.meta["tokens"]},
           "config": cfg.__dict__, "steps": den.meta["steps"], "stopped": den.meta["stopped"],
           "earlier": den.meta.get("earlier", []), "init": args.init,
           **{k: run[k] for k in ("wall_cap_s", "cpu_s_per_step_probe", "train_wall_s",
                                  "train_cpu_s", "per_epoch")},
           "last_train_record": den.meta["last"],
           "change_margin": den.config.change_margin, "change_margin_fit": margin_scores,
           "saved_to": args.save, "eval": final, "curve": points,
           "total_wall_s": time.perf_counter() - t_start,
           "attacks": [{"task": c["task"], "backbone": args.backbone, "P": c["P_eval"],
                        "attacker": k, "recovery": c[k]["all"]}
                       for c in final for k in ("nearest neighbour", "denoiser")]}
    stem = Path(args.out) if args.out else RESULTS / (
        "channel_denoiser_quick" if args.quick else "channel_denoiser")
    stem.parent.mkdir(parents=True, exist_ok=True)
    # Not with_suffix: a stem like "p0.4" has a dot of its own.
    Path(f"{stem}.json").write_text(json.dumps(out, indent=2) + "\n")
    Path(f"{stem}.md").write_text(markdown(out))
    if points:
        plot_curve(out, Path(f"{stem}.png"))
    print(markdown(out))


def plot_curve(o: dict, path: Path) -> None:
    """Held-out recovery (margin 0) against optimizer steps, per task and P."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    offset = sum(e.get("steps") or 0 for e in o["earlier"])
    steps = [offset + pt["step"] for pt in o["curve"]]
    for i, cell in enumerate(o["curve"][0]["cells"]):
        for ax, key in zip(axes, ("all", "replaced_only"), strict=True):
            ys = [pt["cells"][i]["denoiser"][key] * 100 for pt in o["curve"]]
            line, = ax.plot(steps, ys, marker="o", label=f"{cell['task']} P {cell['target_p']}")
            if key == "all":
                ax.axhline(cell["nearest neighbour"]["all"] * 100, ls=":",
                           color=line.get_color())
    axes[0].set_title("all tokens (dotted: nearest neighbour)")
    axes[1].set_title("replaced tokens (nearest neighbour: 0)")
    for ax in axes:
        ax.set_xlabel("optimizer steps (all runs)")
        ax.set_ylabel("recovery on dev, %")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle("Contextual denoiser attacker: held-out recovery while training")
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def markdown(o: dict) -> str:
    sources = ", ".join(f"{s['name']}/{s['split']} {s['texts']}"
                        for s in o["corpus"]["sources"]["sources"])
    m, env, c = o["machine"], o["environment"], o["corpus"]
    where = (f"{env['gpu']} ({m['platform']})" if "gpu" in env else
             f"{m['platform']}, {m['cpu_count']} CPUs shared, {m['threads']} torch threads")
    name = "MiniLM" if o["backbone"] == "minilm" else f"`{o['backbone']}` (run in float32)"
    times = "once" if c["repeats"] == 1 else f"{c['repeats']} times with fresh noise"
    how = (f"{o['config']['epochs']} epoch(s)" if o["wall_cap_s"] is None or not o["stopped"]
           else f"stopped at the {o['wall_cap_s'] / 60:g}-min wall cap")
    etas = ", ".join(f"{float(e):.4g} (P ≈ {p})" for p, e in o["etas"].items())
    disjoint = ("none of the attacked dev texts: the domain attacker" if "domain" in
                c["sources"] else "disjoint from every evaluated task")
    earlier = "".join(f" It went on from a checkpoint of {e['steps']} earlier steps on "
                      f"{e['rows']:,} pairs." for e in o["earlier"])
    lines = [
        "# Contextual denoiser vs nearest neighbour", "",
        f"`{o['command']}` on {where}; load {m['loadavg_start'][0]:.1f} before, "
        f"{m['loadavg_end'][0]:.1f} after.", "",
        f"{name}, η = {etas}, each calibrated on rapt's public sample; P measured "
        f"{o['P_train']:.3f} on the training pairs.", "",
        f"Trained ({o['config']['trainable']}, lr {o['config']['lr']}, batch "
        f"{o['config']['batch_size']}, max length {o['config']['max_length']}) on "
        f"{c['rows_used']:,} (privatized, original) pairs ({c['tokens_used']:,} tokens) of "
        f"{c['sentences']:,} public sentences ({sources}; {disjoint}; "
        f"{c['left_out_for_the_attack_table']} texts the shipped attack table attacks left out) "
        f"privatized at each η {times}, {o['steps']} steps ({how}), "
        f"{o['train_cpu_s'] / 60:.1f} CPU-min ({o['train_wall_s'] / 60:.1f} min wall).{earlier} "
        "Evaluated on dev sentences privatized with fresh noise. Change margin "
        f"{o['change_margin']:g} logits, fitted on held-out public pairs (recovery per margin: "
        f"{', '.join(f'{float(k):g}: {v:.1%}' for k, v in o['change_margin_fit'].items())}).",
        "",
        "| set | P | attacker | all tokens | replaced only | replaced, outside top-100 | "
        "unreplaced changed | gain over nearest neighbour, all tokens (95 % CI) |",
        "|---|---|---|---|---|---|---|---|"]
    for cell in o["eval"]:
        for k in ("nearest neighbour", "denoiser, plain argmax (margin 0)", "denoiser"):
            r = cell[k]
            g = r.get("gain_over_nn")
            gain = (f"{g['all']['gain_pp']:+.1f} ({g['all']['ci95_pp'][0]:+.1f} to "
                    f"{g['all']['ci95_pp'][1]:+.1f})" if g else "")
            lines.append(f"| {cell['set']} | {cell['P_eval']:.3f} | {k} | {r['all']:.1%} | "
                         f"{r['replaced_only']:.1%} | {r['replaced_rare']:.1%} | "
                         f"{r['unreplaced_changed']:.1%} | {gain} |")
    lines += ["", "Replaced, outside top-100: replaced tokens outside the public corpus's 100 "
              "most frequent. Gain: paired bootstrap over sentences (2,000 draws), one "
              "privatization of the dev text.", ""]
    if o["curve"]:  # did it converge: held-out recovery (margin 0) along the run
        cells = o["curve"][0]["cells"]
        lines += ["Held-out curve (plain argmax; all tokens / replaced only):", "",
                  "| step | " + " | ".join(f"{x['task']} P {x['target_p']}" for x in cells)
                  + " |", "|---" * (len(cells) + 1) + "|"]
        lines += [f"| {pt['step']} | " + " | ".join(
            f"{x['denoiser']['all']:.1%} / {x['denoiser']['replaced_only']:.1%}"
            for x in pt["cells"]) + " |" for pt in o["curve"]]
        lines.append("")
    if len(o["per_epoch"]) > 1:  # the training curve per pass over the pairs
        lines += ["| epoch | steps | training loss | token acc | replaced acc |",
                  "|---|---|---|---|---|"]
        for e in o["per_epoch"]:
            cells = [f"{e[k]:.3f}" if e[k] is not None else "–"
                     for k in ("loss", "token_acc", "replaced_acc")]
            lines.append(f"| {e['epoch']} | {e['steps']} | {' | '.join(cells)} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
