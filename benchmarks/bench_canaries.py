"""Planted secrets in training rows (canaries): what the provider recovers of them from the
release, per kind of secret, number of copies, P, mechanism and attacker.

Synthetic secrets (:mod:`rapt.attacks.canaries`): a person's name (first and last from public
lists of 50 each), an 8-digit account number, a phone number 555-01xx-xxxx. ``--per-cell``
secrets of each kind are planted 1, 4 and 16 times, each copy a random SST-2 training row
(from a seeded sample of ``--rows``) with the secret's template sentence appended ("my account
number is … ."). Every text (task rows and copies) is privatized once per P and mechanism with
MiniLM, η from ``calibrate_eta_public``:

* ``uniform``: every token at η;
* ``by-kind rare``: ``KindPolicy("rare")``: personal data and words outside the public list's
  top 1,000 at η, frequent words in clear;
* ``by-kind personal``: ``KindPolicy("personal")``: only personal data at η, the rest in clear;
* ``..., personal η 0``: personal data swapped for a uniform draw before the noise
  (``eta_personal=0``); ``..., personal and beyond 10k η 0``: so is every word outside the
  public list's top 10,000 (``personal_rank=10_000``).

Personal data: Presidio (spaCy's small English model and pattern recognizers), run once on
every text; the spans found decide the classes of both by-kind mechanisms. Attackers: nearest
neighbour, the mechanism-aware Bayes attacker (unigram prior from rapt's public word texts, the
shipped attack table's settings, one screen per η) and, with ``--denoiser FOLDER``, a trained
contextual denoiser (`rapt adapt`). Exposure (Secret Sharer): the true secret's rank among
``--candidates`` never-planted secrets of its format, scored by the share of their tokens the
attacker's guesses match at the secret's positions (the scorer knows them: an upper bound on
what an attacker that must first find them recovers).

Writes benchmarks/results/canaries.{json,md,png} (``--out`` for another stem). The results
committed were measured at 1,000 rows and 8 secrets per cell (16 min on one shared thread; the
defaults, 2,000 rows and 10, take about twice that):

    OMP_NUM_THREADS=1 python -m benchmarks.bench_canaries --rows 1000 --per-cell 8
    OMP_NUM_THREADS=1 python -m benchmarks.bench_canaries --quick   # a dry run, ~2 min
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks._common import RESULTS, command, machine, save_png, write_json, write_md
from rapt.attacks.canaries import KINDS, TEMPLATES

# name -> (--protect, personal data's η: None the protected η, 0 independent of the token[,
# personal_rank: rare words beyond it get personal data's η]); new ones go last (the noise
# seed of a mechanism is its index here)
MECHANISMS = {"uniform": (None, None), "by-kind rare": ("rare", None),
              "by-kind personal": ("personal", None),
              "uniform, personal η 0": ("all", 0.0), "by-kind rare, personal η 0": ("rare", 0.0),
              "by-kind rare, personal and beyond 10k η 0": ("rare", 0.0, 10_000)}
ATTACKERS = {"nn": "nearest neighbour (the release itself)",
             "bayes": "mechanism-aware Bayes (unigram prior)", "denoiser": "contextual denoiser"}
BAYES = {"bayes_k": 1000, "bayes_samples": 64, "bayes_confirm_samples": 1024,
         "bayes_max_confirm": 64, "bayes_z": 3.0}  # the shipped attack table's settings
QUICK_BAYES = {**BAYES, "bayes_k": 200, "bayes_samples": 16, "bayes_confirm_samples": 128,
               "bayes_max_confirm": 16}
NO_DENOISER = {"attacker": "domain denoiser (contextual, bench_channel_denoiser --corpus domain)",
               "why": "no trained weights were given (--denoiser FOLDER) and none are on this "
                      "machine (training takes hours of CPU); it is the strongest attacker "
                      "measured so far (attackers.md), so the exposures here are lower bounds "
                      "that it could raise"}


def training_texts(n: int, seed: int) -> list[str]:
    """A seeded sample of ``n`` SST-2 training sentences (all of them when n <= 0)."""
    from rapt.data import load_dataset

    texts = list(load_dataset("sst2-sentences", "train").texts)
    return texts if n <= 0 or n >= len(texts) else random.Random(seed).sample(texts, n)


def find_personal(texts: list[str], chunk: int = 100, name_list: bool = True
                  ) -> tuple[dict[str, list], dict]:
    """Text -> Presidio's spans, with a progress bar; and the detector's record."""
    from rapt.privacy.personal_data import PersonalDataDetector
    from rapt.progress import progress_bar

    detector = PersonalDataDetector(name_list=name_list)
    found: dict[str, list] = {}
    todo = list(dict.fromkeys(texts))
    with progress_bar(total=len(todo), desc="presidio", unit="text") as bar:
        for s in range(0, len(todo), chunk):
            part = todo[s:s + chunk]
            found.update(zip(part, detector.find_all(part), strict=True))
            bar.update(len(part))
    return found, detector.record


def detected(planted, spans: dict[str, list]) -> dict[str, dict[str, float]]:
    """Per kind of secret: the share of its planted copies that Presidio marks with each entity
    (a copy can have several; "none": not found at all)."""
    out: dict[str, Counter[str]] = {}
    copies: Counter[str] = Counter()
    for c in planted.canaries:
        for o in c.occurrences:
            hits = {s.entity for s in spans[planted.texts[o.row]]
                    if s.start < o.end and o.start < s.end}
            out.setdefault(c.kind, Counter()).update(hits or {"none"})
            copies[c.kind] += 1
    return {k: {e: n / copies[k] for e, n in v.most_common()} for k, v in out.items()}


def make_privatize(bb, eta: float, mechanism: tuple, spans: dict, seed: int):
    """privatize(texts) -> Release for one mechanism: rows without a length limit (a cut row
    could drop its secret), the certified-exact search, each position's class recorded."""
    from rapt.attacks.canaries import Release
    from rapt.pipeline import Customization, Encoding
    from rapt.privacy.by_kind import KindPolicy
    from rapt.progress import progress_bar

    protect, personal, *rank = mechanism
    policy = KindPolicy(protect or "all", eta_personal=personal,
                        personal_rank=rank[0] if rank else None)
    policy = None if policy.uniform else policy
    custom = Customization.create(bb, Encoding(max_length=None), eta=eta, noise_seed=seed,
                                  privatizer_mode="exact", kind_policy=policy,
                                  personal_spans=spans)

    def privatize(texts):
        rows = custom.rows(texts)
        classes = custom.kind_noise(rows, texts)[2]
        with progress_bar(total=len(rows), desc=f"privatize {protect or 'uniform'}",
                          unit="row") as bar:
            released = custom.privatize(rows, texts=texts if policy else None, measure=False,
                                        progress=bar.update)
        return Release(rows, released, classes)

    return privatize


def bayes_for(bb, eta: float, prior, cand, index, seed: int, opts: dict):
    """The Bayes attacker at ``eta`` (its screen built once per η, used on every release)."""
    from rapt.attacks.bayes import BayesAttacker, unigram_log_prior

    log_prior = unigram_log_prior(prior, bb.embeddings.shape[0], bb.special_ids)
    return BayesAttacker.build(bb.embeddings, eta, log_prior, k=opts["bayes_k"],
                               samples=opts["bayes_samples"],
                               confirm_samples=opts["bayes_confirm_samples"],
                               max_confirm=opts["bayes_max_confirm"], z=opts["bayes_z"],
                               special_ids=bb.special_ids, candidate_ids=cand, index=index,
                               seed=seed)


def _text_spans(bb, rows) -> list[tuple[int, int]]:
    """(start, end) of each row's text: after the leading specials, before the trailing."""
    from rapt.tuning.reconstruction import plain_offset

    special = {int(i) for i in bb.special_ids}
    out = []
    for r in rows:
        a, b = plain_offset(bb.tokenizer), len(r)
        while b > a and r[b - 1] in special:
            b -= 1
        out.append((a, b))
    return out


def attackers_for(bb, bayes, denoiser) -> dict:
    """name -> guess(released rows) -> guessed rows, each reading the whole release. Nearest
    neighbour is the release itself: with the mechanism's own embeddings and candidates every
    released token is its own nearest neighbour (rapt.attacks.recovery), so no search is run."""

    def by_bayes(rows):
        flat = torch.tensor([i for r in rows for i in r], dtype=torch.long)
        return [g.tolist() for g in torch.split(bayes.guess(flat), [len(r) for r in rows])]

    def by_denoiser(rows):
        # The denoiser reads max_length tokens (48 for the domain attacker): a longer text is
        # read in windows taken from its end, so the appended secret and the words before it
        # share one window (it returned the rest as received before)
        from rapt.channel.corpus import special_wrap

        head, tail = special_wrap(bb.tokenizer)
        room = denoiser.config.max_length - len(head) - len(tail)
        windows, where = [], []
        for k, (r, (a, b)) in enumerate(zip(rows, _text_spans(bb, rows), strict=True)):
            for e in range(b, a, -room):
                start = max(a, e - room)
                windows.append(r[start:e])
                where.append((k, start))
        out = [list(r) for r in rows]
        for (k, start), g in zip(where, denoiser.guess(windows), strict=True):
            out[k][start:start + len(g)] = list(g)
        return out

    out = {"nn": lambda rows: [list(r) for r in rows], "bayes": by_bayes}
    if denoiser is not None:
        out["denoiser"] = by_denoiser
    return out


def _timed(name: str, guess, seconds: dict):
    def run(rows):
        t0 = time.perf_counter()
        try:
            return guess(rows)
        finally:
            seconds[name] = round(time.perf_counter() - t0, 1)
    return run


def one_release(bb, planted, cands, privatize, attackers: dict) -> dict:
    """One mechanism at one η: privatize, every attacker, scores per (kind, repeats)."""
    from rapt.attacks.canaries import class_shares, locate, run_canaries, summarize
    from rapt.privacy.by_kind import CLASSES
    from rapt.privacy.mechanism import replacement_probability

    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    timed = {k: _timed(k, g, seconds) for k, g in attackers.items()}
    release, scores = run_canaries(bb.tokenizer, planted, privatize, timed, cands)
    positions = locate(bb.tokenizer, planted, release.clean)
    return {"P": replacement_probability(release.clean, release.released, bb.special_ids),
            "classes": class_shares(planted, positions, release.classes, CLASSES),
            "cells": {k: summarize(v) for k, v in scores.items()},
            "canaries": {k: [asdict(s) for s in v] for k, v in scores.items()},
            "seconds": {"total": round(time.perf_counter() - t0, 1), **seconds}}


def setup(args) -> dict:
    """The backbone, the planted texts, Presidio's spans, the candidates and the public prior:
    what every P and mechanism share."""
    from rapt.attacks.canaries import draw_candidates, plant
    from rapt.models import load_backbone
    from rapt.privacy.by_kind import personal_spans
    from rapt.privacy.kinds import public_word_texts
    from rapt.privacy.mechanism import candidate_ids_from_tokenizer, tokenize_texts

    bb = load_backbone("minilm")
    planted = plant(training_texts(args.rows, args.seed), per_cell=args.per_cell,
                    repeats=args.repeats, kinds=args.kinds, seed=args.seed,
                    lowercase=args.lowercase)
    spans, record = find_personal(planted.texts, name_list=not args.no_name_list)
    # What the mechanisms classify by: each name found in one text marked in every text.
    widened = dict(zip(planted.texts, personal_spans(planted.texts, spans=spans), strict=True))
    public, sources = public_word_texts()
    return {"bb": bb, "planted": planted, "spans": spans, "widened": widened, "detector": record,
            "cands": draw_candidates(bb.tokenizer, planted, args.candidates, seed=args.seed + 1),
            "prior": tokenize_texts(public, bb.tokenizer), "prior_sources": sources,
            "cand": candidate_ids_from_tokenizer(bb.tokenizer, bb.embeddings.shape[0])}


def load_denoiser(path: str | None, bb):
    if path is None:
        return None
    from rapt.channel.denoiser import Denoiser

    return Denoiser.load(path, bb)


def measure(args) -> dict:
    from rapt.privacy.mechanism import calibrate_eta_public, shared_index
    from rapt.privacy.personal_data import PROPAGATED

    s = setup(args)
    bb, planted = s["bb"], s["planted"]
    denoiser = load_denoiser(args.denoiser, bb)
    opts = QUICK_BAYES if args.quick else BAYES
    runs, screens = [], {}
    for p_i, p in enumerate(args.target_p):
        eta = calibrate_eta_public(bb, p)
        index = shared_index(bb.embeddings.detach().float(), s["cand"], "exact")
        t0 = time.perf_counter()
        bayes = bayes_for(bb, eta, s["prior"], s["cand"], index, 500 + p_i, opts)
        screens[str(p)] = round(time.perf_counter() - t0, 1)
        attackers = attackers_for(bb, bayes, denoiser)
        for m_i, (mech, kind) in enumerate(MECHANISMS.items()):
            if mech not in args.mechanisms:
                continue
            privatize = make_privatize(bb, eta, kind, s["spans"], 100 + 10 * p_i + m_i)
            run = one_release(bb, planted, s["cands"], privatize, attackers)
            runs.append({"target_p": p, "eta": eta, "mechanism": mech, **run})
            print(f"P {p} {mech}: measured P {run['P']:.3f}; " + "; ".join(
                f"{a} exposure " + ", ".join(f"{c['kind']}x{c['repeats']} "
                                             f"{c['exposure_mean']:.1f}" for c in cells)
                for a, cells in run["cells"].items()), flush=True)
    return {"backbone": "minilm", "rows": args.rows, "lowercase": args.lowercase,
            "per_cell": args.per_cell, "repeats": list(args.repeats), "candidates": args.candidates,
            "planted_rows": sum(len(c.occurrences) for c in planted.canaries),
            "texts": len(planted.texts), "detector": s["detector"],
            "presidio_on_secrets": detected(planted, s["widened"]),
            "presidio_on_secrets_found": detected(planted, s["spans"]),
            "propagated": list(PROPAGATED),
            "attackers": {a: ATTACKERS[a] for a in runs[0]["cells"]} if runs else {},
            "bayes": {**opts, "prior_sources": s["prior_sources"],
                      "screen_seconds": screens},
            "not_run": [] if denoiser is not None else [NO_DENOISER],
            # what the denoiser was trained on (rapt adapt or bench_kind_attack --save)
            "denoiser": None if denoiser is None else {
                "path": str(args.denoiser), "meta": denoiser.meta,
                "max_length": denoiser.config.max_length},
            "examples": [{"kind": c.kind, "repeats": c.repeats,
                          "text": planted.texts[c.occurrences[0].row]}
                         for c in planted.canaries[::max(1, len(planted.canaries) // 6)]],
            "runs": runs}


def _pct(ci: list[float]) -> str:
    return f"{100 * ci[0]:.1f} ({100 * ci[1]:.1f}–{100 * ci[2]:.1f})"


def cell_table(doc: dict, p: float) -> list[str]:
    lines = ["| secret | copies | mechanism | attacker | exposure mean / max (bits) | "
             "recovered, % of tokens (95 % CI) | base rate | voted over copies | its base "
             "rate | guessed whole | p ≤ 0.05 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for run in (r for r in doc["runs"] if r["target_p"] == p):
        for att, cells in run["cells"].items():
            rows += [(c, run["mechanism"], att) for c in cells]
    rows.sort(key=lambda t: (t[0]["kind"] != "name", t[0]["kind"], t[0]["repeats"]))
    for c, mech, att in rows:
        lines.append(
            f"| {c['kind']} | {c['repeats']} | {mech} | {att} | {c['exposure_mean']:.2f} / "
            f"{c['exposure_max']:.2f} | {_pct(c['recovered'])} | {_pct(c['base_rate'])} | "
            f"{_pct(c['voted'])} | {_pct(c['base_voted'])} | {c['exact']}/{c['canaries']} | "
            f"{c['above_base']}/{c['canaries']} |")
    return lines


def in_clear(doc: dict) -> list[str]:
    """The secrets' tokens each by-kind mechanism passes in clear (the classes it does not
    protect), from the class shares: the loud finding if any."""
    shares = doc["runs"][0]["classes"]
    out = []
    for mech, unprotected in (("by-kind rare", ("frequent",)),
                              ("by-kind personal", ("rare", "frequent"))):
        got = {k: sum(sh[c] for c in unprotected) for k, sh in shares.items()}
        said = ", ".join(f"{k} {100 * v:.1f} %" for k, v in got.items() if v > 0)
        out.append(f"- `{mech}` releases in clear: " + (
            f"**{said} of the secrets' tokens** (not marked personal by the detector)"
            if said else "no secret token (every one classed personal or rare)"))
    return out


def above_at_eta0(doc: dict) -> list[str]:
    """The canaries above their base rate under a personal-η-0 mechanism: with the release of a
    marked token independent of it, only the detector's misses can be."""
    out = []
    for run in doc["runs"]:
        if "personal η 0" not in run["mechanism"]:
            continue
        hits = {(c["kind"], c["repeats"], c["secret"], round(c["exposure"], 2))
                for cs in run["canaries"].values() for c in cs if c["p_value"] <= 0.05}
        out.append(f"- P {run['target_p']}, {run['mechanism']}: " + (", ".join(
            f"{k} ×{r} `{sec}` ({e} bits)" for k, r, sec, e in sorted(hits)) or "none"))
    if out:
        out.insert(0, "Canaries above their base rate under personal data at η 0 (a secret "
                      "recovered there is one the detector missed in some of its copies):")
        out.insert(1, "")
    return out


def same_guesses(doc: dict) -> str:
    """Whether the Bayes attacker ever scored differently from nearest neighbour."""
    diff = sum(a != b for r in doc["runs"] if "bayes" in r["canaries"]
               for a, b in zip(r["canaries"]["nn"], r["canaries"]["bayes"], strict=True))
    return (f"The Bayes attacker's scores differ from nearest neighbour's on {diff} canary-runs "
            "(it changes a released token only where fresh draws confirm a more probable "
            "original, which a random secret's token never is).")


def class_table(doc: dict) -> list[str]:
    """Per secret kind: how each mechanism classes its tokens (the same for every P), and what
    Presidio marked on its copies."""
    run = doc["runs"][0]
    found = doc.get("presidio_on_secrets_found")  # absent from runs before propagation

    def entities(shares: dict) -> str:
        return ", ".join(f"{e} {100 * v:.0f} %" for e, v in shares.items())

    lines = ["| secret | tokens | personal | rare | frequent | Presidio's entities on its "
             "copies |" + (" found in the copy itself |" if found else ""),
             "|---|---|---|---|---|---|" + ("---|" if found else "")]
    for kind, sh in run["classes"].items():
        lines.append(f"| {kind} | {sh['tokens']:,} | {100 * sh['personal']:.1f} % | "
                     f"{100 * sh['rare']:.1f} % | {100 * sh['frequent']:.1f} % | "
                     f"{entities(doc['presidio_on_secrets'][kind])} |"
                     + (f" {entities(found[kind])} |" if found else ""))
    return lines


def verdict(doc: dict) -> list[str]:
    """The goal "no planted secret recovered above its base rate", cell by cell."""
    out = []
    for run in doc["runs"]:
        for att, cells in run["cells"].items():
            n = sum(c["canaries"] for c in cells)
            above = sum(c["above_base"] for c in cells)
            out.append(f"- P {run['target_p']} (measured {run['P']:.2f} over all tokens), "
                       f"{run['mechanism']}, {att}: {above} of {n} canaries above their base "
                       f"rate at p ≤ 0.05 (about {0.05 * n:.0f} by chance alone); mean "
                       f"exposure {sum(c['exposure_mean'] for c in cells) / len(cells):.2f} "
                       f"bits of {cells[0]['exposure_ceiling']:.2f}")
    return out


def markdown(doc: dict) -> str:
    det = doc["detector"]
    lines = [
        "# Planted secrets (canaries): what the provider recovers from the release", "",
        f"`OMP_NUM_THREADS={doc['machine']['threads']} {doc['command']}` "
        f"({doc['wall_s'] / 60:.1f} min wall, {doc['machine']['threads']} thread).", "",
        f"{doc['rows']:,} SST-2 training sentences (seeded sample) and {doc['planted_rows']:,} "
        f"planted copies ({doc['texts']:,} texts): {doc['per_cell']} secrets of each kind "
        f"planted {', '.join(map(str, doc['repeats']))} times, each copy a random training "
        "row with the secret's sentence appended; names written "
        + ("in lower case, as SST-2 is" if doc.get("lowercase") else "capitalised") + ". "
        "Every text is privatized once per P and "
        "mechanism (MiniLM, η from `calibrate_eta_public`, seeded; rows not cut, so no secret "
        "is lost to a length limit).", "",
        "**Measures.** Exposure (Secret Sharer): log2(R + 1) − log2(rank) of the true secret "
        f"among R = {doc['candidates']:,} never-planted secrets of its format (ceiling "
        f"{doc['runs'][0]['cells']['nn'][0]['exposure_ceiling']:.2f} bits; an attacker that "
        "learns nothing averages about 1.44), ranked by the share of their tokens the "
        "attacker's guesses match at the secret's positions, over all copies, ties averaged. "
        "Recovered: that share for the true secret (mean over its copies); base rate: the same "
        "share for the never-planted candidates at the same positions (the chance of a "
        "same-format guess, format tokens such as `555` and `-` included); voted: after a "
        "per-position majority vote over the copies. CIs are Student-t over the canaries of a "
        "cell. p ≤ 0.05: canaries whose true secret scores above 95 % of the candidates. The "
        "scorer knows where each secret sits (the template's frequent words are in clear under "
        "a by-kind policy): an upper bound on what an attacker must first find. A "
        "token-by-token release keeps a secret's token count, which excludes candidates of "
        "another length: that leak is counted.", "",
        f"**Personal data.** Presidio ({det['ner_model'] or 'no NER model'}"
        + ("; the Census name lists, `rapt.privacy.name_list`: the canaries' names are among "
           "their most common entries, so this checks the rules, not their recall "
           "(`name_list.md` is the recall)" if det.get("name_list") else
           "; no name lists" if "name_list" in det else "") + f"; score ≥ "
        f"{det['score_threshold']}) on every text; its spans decide both by-kind mechanisms' "
        "classes" + (f", each {'/'.join(doc['propagated'])} found in one text marked wherever "
                     "it recurs (`rapt.privacy.personal_data.propagate_spans`)"
                     if doc.get("propagated") else "") + ".", "",
        "**Attackers:** " + "; ".join(f"{k}: {v}" for k, v in doc["attackers"].items())
        + " (Bayes: k {bayes_k}, {bayes_samples} screen and {bayes_confirm_samples} confirm "
          "draws, at most {bayes_max_confirm} changes per call, z {bayes_z}).".format(
              **doc["bayes"]), ""]
    if doc.get("denoiser"):
        d = doc["denoiser"]
        lines += [f"**The denoiser** (`{d['path']}`, reading {d['max_length']} tokens at a "
                  "time: a longer text in windows from its end): trained with "
                  + ", ".join(f"{k} {v}" for k, v in sorted(d["meta"].items())
                              if isinstance(v, str | int | float)) + ".", ""]
    if doc["not_run"]:
        lines += ["**Not run:** " + "; ".join(f"the {n['attacker']}: {n['why']}"
                                              for n in doc["not_run"]) + ".", ""]
    lines += ["## Goal: no planted secret recovered above its base rate", ""] + verdict(doc)
    lines += ["", "## How the mechanisms class the secrets' tokens", "",
              "Under `by-kind rare` personal and rare tokens get η and frequent ones pass in "
              "clear; under `by-kind personal` everything not personal passes in clear; under "
              "`personal η 0` every token the detector marks is swapped for one drawn "
              "uniformly from the vocabulary before the noise (its release does not depend on "
              "it), the rest as `uniform` or `by-kind rare`"
              + ("; under `personal and beyond 10k η 0` so is every token of a word outside "
                 "the 10,000 most frequent public words (`--personal-rank 10000`; counted as "
                 "rare in the table below)" if any("beyond" in r["mechanism"]
                                                   for r in doc["runs"]) else "") + ".", ""]
    eta0 = above_at_eta0(doc)
    lines += class_table(doc) + [""] + in_clear(doc) + ([""] + eta0 if eta0 else []) + [
        "", same_guesses(doc), "",
                                                         "Example planted rows:", ""]
    lines += [f"- {e['kind']} ×{e['repeats']}: `{e['text']}`" for e in doc["examples"]]
    for p in dict.fromkeys(r["target_p"] for r in doc["runs"]):
        eta = next(r["eta"] for r in doc["runs"] if r["target_p"] == p)
        lines += ["", f"## P {p} (η {eta:.2f})", ""] + cell_table(doc, p)
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(doc["runs"][0]["classes"])
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 4), squeeze=False)
    styles = ["-", "--", ":", "-.", (0, (1, 3))]  # one per mechanism
    for ax, kind in zip(axes[0], kinds, strict=True):
        for run in doc["runs"]:
            best = {}  # the attacker with the most exposure, per number of copies
            for cells in run["cells"].values():
                for c in (c for c in cells if c["kind"] == kind):
                    best[c["repeats"]] = max(best.get(c["repeats"], 0.0), c["exposure_mean"])
            xs = sorted(best)
            m = list(MECHANISMS).index(run["mechanism"])
            ax.plot(xs, [best[x] for x in xs], ls=styles[m % len(styles)], marker="o",
                    label=f"{run['mechanism']}, P {run['target_p']}")
        ceiling = doc["runs"][0]["cells"]["nn"][0]["exposure_ceiling"]
        ax.axhline(ceiling, color="grey", lw=0.8)
        ax.axhline(1.44, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("copies of the secret")
        ax.set_ylabel("mean exposure, bits (best attacker)")
        ax.set_title(kind)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Canary exposure (grey: ceiling log2(R+1), dotted: an attacker that learns "
                 "nothing)", fontsize=10)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-p", type=float, nargs="+", default=[0.4, 0.6])
    ap.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=list(MECHANISMS))
    ap.add_argument("--rows", type=int, default=2000, help="SST-2 training rows sampled")
    ap.add_argument("--per-cell", type=int, default=10, help="secrets per kind and repeats")
    ap.add_argument("--repeats", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--candidates", type=int, default=1000, help="R, never-planted secrets")
    ap.add_argument("--denoiser", default=None, help="a trained denoiser's folder (rapt adapt)")
    ap.add_argument("--lowercase", action="store_true",
                    help="names in lower case, as in SST-2 (the detector finds fewer)")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(TEMPLATES),
                    help="secret kinds; unlisted_name: names outside the Census name lists")
    ap.add_argument("--no-name-list", action="store_true",
                    help="Presidio without the Census name lists (rapt's detector before them)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true",
                    help="a dry run: 200 rows, 2 secrets per cell, R 100, a smaller Bayes screen")
    ap.add_argument("--out", default=None, help="output stem (default results/canaries[_quick])")
    ap.add_argument("--render", default=None, metavar="JSON",
                    help="only write the md and png of a results json again")
    args = ap.parse_args()
    if args.render:
        stem = Path(args.render).with_suffix("")
        doc = json.loads(Path(args.render).read_text())
        write_md(Path(f"{stem}.md"), markdown(doc))
        plot(doc, Path(f"{stem}.png"))
        return
    if args.quick:
        args.rows, args.per_cell, args.candidates = 200, 2, 100
    torch.set_num_threads(args.threads)
    t0, c0 = time.perf_counter(), time.process_time()
    doc = {"command": command(), "machine": machine(), **measure(args)}
    doc.update(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0)
    doc["machine"]["loadavg_end"] = list(os.getloadavg())
    stem = Path(args.out or RESULTS / ("canaries_quick" if args.quick else "canaries"))
    write_json(Path(f"{stem}.json"), doc)
    write_md(Path(f"{stem}.md"), markdown(doc))
    plot(doc, Path(f"{stem}.png"))
    print(markdown(doc))


if __name__ == "__main__":
    main()
