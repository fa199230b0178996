"""The contextual denoiser attacker (issue 27) on MiniLM at P ≈ 0.4, against nearest neighbour.

Public text (``public_corpus_for("sst2")``: TREC, Financial PhraseBank, CB premises and
hypotheses, TrustPilot; never SST-2) is privatized by the provider at the η that
``calibrate_eta_public`` gives for P ≈ 0.4; a :class:`rapt.attacks.denoiser.Denoiser` is trained
on the (privatized -> original) pairs for a wall-clock budget on ``--threads`` threads, its
change margin is fitted on held-out public pairs (:func:`fit_change_margin`), and it is
evaluated on SST-2 dev sentences privatized with fresh noise:
token recovery over all non-special tokens, over replaced tokens only (nearest neighbour: 0 by
construction) and over the replaced tokens outside the public corpus's 100 most frequent, plus
the share of unreplaced tokens it wrongly changes. Writes
benchmarks/results/channel_denoiser.{json,md}.

    python benchmarks/bench_channel_denoiser.py [--budget-min 12] [--threads 2] [--save DIR]
        [--quick]

``--save DIR`` keeps the trained denoiser (outside the repo, e.g. /tmp/channel/minilm-p0.4-sst2)
for benchmarks/bench_channel.py's denoise-then-tune setting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from rapt.attacks.denoiser import DenoiserConfig, fit_change_margin, train_denoiser
from rapt.attacks.inversion import invert_ids
from rapt.channel import public_corpus_for
from rapt.data import load_dataset
from rapt.models import load_backbone
from rapt.privatization import (
    Privatizer,
    calibrate_eta_public,
    candidate_ids_from_tokenizer,
    replacement_probability,
    tokenize_texts,
)

RESULTS = Path(__file__).resolve().parent / "results"
HOLDOUT = 300  # public rows kept out of training, to fit the change margin on


def public_texts(limit_per_source: int, seed: int) -> tuple[list[str], dict]:
    """``public_corpus_for("sst2")`` texts (a seeded subset of each split), shuffled;
    -> (texts, provenance)."""
    corpus = public_corpus_for("sst2", max_rows_per_source=limit_per_source, seed=seed)
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


def privatize(priv: Privatizer, rows: list[list[int]]) -> list[list[int]]:
    flat = torch.tensor([t for r in rows for t in r], dtype=torch.long)
    out = priv.privatize_ids(flat).cpu()
    return [x.tolist() for x in torch.split(out, [len(r) for r in rows])]


def steps_for_budget(bb, cfg: DenoiserConfig, clean, private,
                     budget_s: float) -> tuple[int, float]:
    """Optimizer steps that fit in ``budget_s``, from 3 timed steps on a throwaway copy."""
    probe = DenoiserConfig(**{**cfg.__dict__, "epochs": 1})
    n = 4 * cfg.batch_size
    t0 = time.perf_counter()
    train_denoiser(bb, clean[:n], private[:n], probe)
    per_step = (time.perf_counter() - t0) / 4
    return max(1, int(budget_s / per_step)), per_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-min", type=float, default=12.0, help="wall minutes of training")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", default=None, help="folder to save the trained denoiser in")
    ap.add_argument("--target-p", type=float, default=0.4)
    ap.add_argument("--eval-n", type=int, default=300)
    ap.add_argument("--per-source", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--keep-bonus", type=float, default=8.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=48)
    ap.add_argument("--trainable", default="full", choices=["full", "lora"])
    ap.add_argument("--quick", action="store_true", help="tiny run to check the script")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)  # the machine is shared
    load0 = os.getloadavg()
    t_start = time.perf_counter()

    bb = load_backbone("minilm")
    tok = bb.tokenizer
    eta = calibrate_eta_public(bb, args.target_p)
    cand = candidate_ids_from_tokenizer(tok, bb.embeddings.shape[0])
    room = args.max_length - 2
    texts, counts = public_texts(60 if args.quick else args.per_source, seed=0)
    clean = [r[:room] for r in tokenize_texts(texts, tok) if r]
    hold = min(HOLDOUT, len(clean) // 5)
    clean, held_clean = clean[hold:], clean[:hold]
    priv = privatize(Privatizer(bb.embeddings, eta, special_ids=bb.special_ids,
                                candidate_ids=cand, mode="fast", seed=1), clean)
    held_priv = privatize(Privatizer(bb.embeddings, eta, special_ids=bb.special_ids,
                                     candidate_ids=cand, mode="fast", seed=3), held_clean)
    p_train = replacement_probability(clean, priv, bb.special_ids)
    freq = Counter(t for r in clean for t in r)
    frequent = {t for t, _ in freq.most_common(100)}

    cfg = DenoiserConfig(lr=args.lr, epochs=1, batch_size=args.batch, max_length=args.max_length,
                         trainable=args.trainable, keep_bonus=args.keep_bonus, seed=0)
    budget = 20.0 if args.quick else args.budget_min * 60
    steps, per_step = steps_for_budget(bb, cfg, clean, priv, budget)
    rows = steps * cfg.batch_size
    # More steps than one pass: extra epochs over the same pairs (not fresh noise: the
    # privatization of 20k+ sentences costs minutes of its own).
    cfg.epochs = max(1, -(-rows // len(clean)))
    n_rows = min(len(clean), rows)
    hist: list[dict] = []
    deadline = time.perf_counter() + 1.2 * budget
    t0, c0 = time.perf_counter(), time.process_time()
    den = train_denoiser(bb, clean[:n_rows], priv[:n_rows], cfg,
                         meta={"corpus": counts, "eta": eta, "target_p": args.target_p},
                         progress=hist.append, should_stop=lambda: time.perf_counter() > deadline)
    train_wall, train_cpu = time.perf_counter() - t0, time.process_time() - c0
    margin_scores = fit_change_margin(den, held_clean, held_priv)
    if args.save:
        den.meta["change_margin_fit"] = {"held_out_public_rows": hold, "recovery": margin_scores}
        den.save(args.save)

    dev = load_dataset("sst2", "dev")
    ev_clean = [r[:room] for r in tokenize_texts(list(dev.texts)[:args.eval_n], tok)]
    ev_priv = privatize(Privatizer(bb.embeddings, eta, special_ids=bb.special_ids,
                                   candidate_ids=cand, mode="fast", seed=2), ev_clean)
    flat = invert_ids(torch.tensor([t for r in ev_priv for t in r]), bb.embeddings,
                      candidate_ids=cand)
    nn_guess = [x.tolist() for x in torch.split(flat, [len(r) for r in ev_priv])]
    margin = den.config.change_margin
    den.config.change_margin = 0.0
    argmax = recovery(ev_clean, ev_priv, den.guess(ev_priv), frequent)
    den.config.change_margin = margin
    res = {"nearest neighbour": recovery(ev_clean, ev_priv, nn_guess, frequent),
           "denoiser": recovery(ev_clean, ev_priv, den.guess(ev_priv), frequent)}
    out = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "threads": args.threads,
                       "load_before": load0, "load_after": os.getloadavg()},
           "backbone": "minilm", "eta": eta, "target_p": args.target_p,
           "P_train": p_train, "P_eval": replacement_probability(ev_clean, ev_priv,
                                                                 bb.special_ids),
           "corpus": {"sources": counts, "rows_used": n_rows, "tokens_used": den.meta["tokens"]},
           "config": cfg.__dict__, "steps": den.meta["steps"], "stopped": den.meta["stopped"],
           "cpu_s_per_step_probe": per_step, "train_wall_s": train_wall,
           "train_cpu_s": train_cpu, "last_train_record": den.meta["last"],
           "change_margin": margin, "change_margin_fit": margin_scores,
           "saved_to": args.save,
           "eval": {"set": f"sst2 dev, first {len(ev_clean)} sentences", **res,
                    "denoiser, plain argmax (margin 0)": argmax},
           "total_wall_s": time.perf_counter() - t_start,
           "attacks": [{"task": "sst2", "backbone": "minilm", "P": args.target_p,
                        "attacker": k, "recovery": v["all"]} for k, v in res.items()]}
    name = "channel_denoiser_quick" if args.quick else "channel_denoiser"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown(out))
    print(markdown(out))


def markdown(o: dict) -> str:
    sources = ", ".join(f"{s['name']}/{s['split']} {s['texts']}"
                        for s in o["corpus"]["sources"]["sources"])
    lines = [
        "# Contextual denoiser vs nearest neighbour (issue 27)", "",
        f"`{o['command']}` on {o['machine']['platform']}, {o['machine']['cpus']} CPUs shared, "
        f"{o['machine']['threads']} torch threads; load {o['machine']['load_before'][0]:.1f} before, "
        f"{o['machine']['load_after'][0]:.1f} after.", "",
        f"MiniLM, η = {o['eta']:.4g} (calibrated for P ≈ {o['target_p']} on rapt's public "
        f"sample); P measured {o['P_train']:.3f} on the training pairs, {o['P_eval']:.3f} on the "
        "evaluation rows.", "",
        f"Trained ({o['config']['trainable']}, lr {o['config']['lr']}, batch "
        f"{o['config']['batch_size']}, max length {o['config']['max_length']}) on "
        f"{o['corpus']['rows_used']:,} public sentences ({o['corpus']['tokens_used']:,} tokens; "
        f"{sources}) privatized once, "
        f"{o['steps']} steps, {o['train_cpu_s'] / 60:.1f} CPU-min "
        f"({o['train_wall_s'] / 60:.1f} min wall). Evaluated on {o['eval']['set']}, privatized "
        f"with fresh noise. Change margin {o['change_margin']:g} logits, fitted on held-out "
        "public pairs (recovery per margin: "
        f"{', '.join(f'{float(k):g}: {v:.1%}' for k, v in o['change_margin_fit'].items())}).",
        "",
        "| attacker | all tokens | replaced only | replaced, outside top-100 | unreplaced "
        "changed |", "|---|---|---|---|---|"]
    for k in ("nearest neighbour", "denoiser, plain argmax (margin 0)", "denoiser"):
        r = o["eval"][k]
        lines.append(f"| {k} | {r['all']:.1%} | {r['replaced_only']:.1%} | "
                     f"{r['replaced_rare']:.1%} | {r['unreplaced_changed']:.1%} |")
    r = o["eval"]["denoiser"]
    lines += ["", f"{r['tokens']:,} evaluation tokens, {r['replaced']:,} replaced "
              f"({r['rare_replaced']:,} outside the public corpus's 100 most frequent tokens).",
              "The issue's probe (17 CPU-min, 22k sentences × 3 privatizations): 62.4 % / 16.8 %, "
              "5.4 % of unreplaced tokens changed; nearest neighbour 58.6 % / 0 %.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
