"""The attack table shipped with rapt: token recovery per backbone and η, on public text.

For each backbone, a grid of η from the η that gives P ≈ ``--p-range`` high (much noise) to the
one that gives P ≈ low (little), spaced geometrically (calibrated with ``calibrate_eta_public``,
as every command calibrates).  At each η, ``--eval-texts`` texts of public text are privatized
with the backbone's mechanism (tokenizer candidates, certified-exact search) and every attacker
guesses the originals from the release and public knowledge only
(:func:`rapt.attacks.recovery.reconstruct`); token recovery is scored over all non-special
tokens and over the replaced ones only.

Public text: ``public_corpus_for("sst2")`` (TREC, Financial PhraseBank, CB premises and
hypotheses, TrustPilot; never SST-2), ``--per-source`` seeded rows per split, shuffled.  The
first ``--eval-texts`` (cut to ``--max-tokens`` tokens) are attacked; the rest are the Bayes
attacker's prior, so it never saw the text it attacks.

Attackers: nearest neighbour and the mechanism-aware Bayes attacker on every backbone (a screen
of ``--bayes-samples`` draws per candidate; a guess changes only where ``--bayes-confirm`` fresh
draws confirm it, for at most ``--bayes-max-confirm`` releases per η; fewer than the command's
defaults, to fit the grid in about 20 minutes of one thread: the bounds stay valid, the
attacker only changes fewer guesses); with ``--attackers nn bayes bayes-bigram``, also the
Bayes attacker with a bigram (context) prior, decoding each row as an HMM
(``--bigram-samples`` screen draws per candidate, its ``--bigram-candidates`` best originals
per position; the same confirm draws and bounds); the
contextual denoiser only where ``--denoiser BACKBONE=FOLDER`` gives a trained one (from
`rapt adapt`), and only at the grid points within its η band (× / ÷ 1.25): it is only valid near
the η it was trained at, and the table says so.

Writes ``src/rapt/resources/attack_table.json`` (read by :mod:`rapt.privacy.attack_table`) and
``benchmarks/results/attack_table.{json,md,png}``.  ``--p 0.4 0.6`` measures only the η
calibrated for those P instead of the grid, and ``--out NAME`` writes
``benchmarks/results/NAME.{json,md,png}`` and leaves the shipped table alone (a comparison of
attackers, not a table). ``--add`` measures only ``--backbones`` and adds them to the shipped
table, leaving the other backbones' rows as they are.

    python -m benchmarks.bench_attack_table [--points 12] [--threads 1]
        [--attackers nn bayes bayes-bigram] [--denoiser minilm=/tmp/channel/minilm] [--quick]
    python -m benchmarks.bench_attack_table --backbones mpnet --add --threads 2
    python -m benchmarks.bench_attack_table --backbones minilm --p 0.4 0.6
        --attackers nn bayes bayes-bigram --out attacker_bayes_bigram --threads 1
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import time
from pathlib import Path

import torch

from benchmarks._common import RESULTS, command, machine

ROOT = Path(__file__).resolve().parents[1]
RESOURCE = ROOT / "src" / "rapt" / "resources" / "attack_table.json"
NAMES = {"nn": "nearest neighbour", "bayes": "mechanism-aware Bayes",
         "bayes-bigram": "Bayes, bigram prior", "denoiser": "contextual denoiser"}
BAND_SLACK = 1.25  # a denoiser counts as valid within its η band widened by this factor


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src/rapt"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (src/rapt modified)" if dirty else "")


def public_split(backbone, per_source: int, n_eval: int, max_tokens: int, seed: int):
    """(attacked rows, their texts, prior rows, provenance): the public corpus disjoint from
    SST-2, tokenized and shuffled; the first ``n_eval`` non-empty rows (cut to ``max_tokens``)
    are attacked, the others form the prior."""
    from rapt.channel.corpus import public_corpus_for

    corpus = public_corpus_for("sst2", max_rows_per_source=per_source, seed=seed)
    corpus = corpus.tokenize(backbone.tokenizer)
    kept = [(t, list(r)) for t, r in zip(corpus.texts, corpus.rows, strict=True) if r]
    order = torch.randperm(len(kept), generator=torch.Generator().manual_seed(seed)).tolist()
    attacked = [kept[i][1][:max_tokens] for i in order[:n_eval]]
    texts = [kept[i][0] for i in order[:n_eval]]
    prior = [kept[i][1] for i in order[n_eval:]]
    prov = corpus.provenance()
    prov.update(attacked_texts=len(attacked), attacked_tokens=sum(map(len, attacked)),
                max_tokens_per_attacked_text=max_tokens, prior_texts=len(prior),
                prior_tokens=sum(map(len, prior)), shuffle_seed=seed)
    return attacked, texts, prior, prov


def attacked_classes(rows, texts, tokenizer) -> tuple[list[list[int]], dict]:
    """(each attacked token's class: personal, rare or frequent, of rapt.privacy.by_kind; what
    decided them): the texts' kinds with rapt's public word list and Presidio, cut as the rows
    were (a token that does not line up with its text counts as personal data)."""
    from rapt.privacy.by_kind import DEFAULT_FREQUENT_RANK, align_classes, classes_of
    from rapt.privacy.kind_recovery import class_counts
    from rapt.privacy.kinds import token_kinds
    from rapt.privacy.personal_data import PersonalDataDetector

    t0 = time.perf_counter()
    detector = PersonalDataDetector()
    kinds = token_kinds(texts, tokenizer, detector=detector)
    per_text = classes_of(kinds, DEFAULT_FREQUENT_RANK)
    classes = [align_classes(r, [ids], [c], set()) for r, ids, c in zip(rows, kinds.ids,
                                                                         per_text, strict=True)]
    return classes, {"frequent_rank": DEFAULT_FREQUENT_RANK,
                     "counts": class_counts(DEFAULT_FREQUENT_RANK),
                     "personal_data_detector": kinds.detector,
                     "seconds": round(time.perf_counter() - t0, 1)}


def kind_figures(res: dict) -> tuple[dict, dict]:
    """(each attacker's recovery per kind, the point's token count per kind) of a
    :func:`rapt.attacks.recovery.reconstruct` result run with classes."""
    from rapt.privacy.attack_table import TABLE_KINDS

    by = {k: {kind: v["by_kind"][kind]["recovery"] for kind in TABLE_KINDS}
          for k, v in res["attackers"].items()}
    any_rec = next(iter(res["attackers"].values()))["by_kind"]
    return by, {kind: any_rec[kind]["n_tokens"] for kind in TABLE_KINDS}


def load_denoiser(spec: str | None, bb):
    """(Denoiser, (η lo, η hi)) from a saved folder, or (None, None)."""
    if spec is None:
        return None, None
    from rapt.channel.denoiser import Denoiser

    den = Denoiser.load(spec, bb)
    band = den.meta.get("eta_band") or [den.meta.get("eta")]
    if not band or any(b is None for b in band):
        raise SystemExit(f"--denoiser {spec}: its meta records no η or η band")
    return den, (float(min(band)), float(max(band)))


def measure_backbone(name: str, args, denoiser_spec: str | None) -> dict:
    """Every point of one backbone's grid (see the module docstring)."""
    from rapt.attacks.recovery import reconstruct
    from rapt.channel.corpus import eta_band
    from rapt.models import load_backbone
    from rapt.privacy.mechanism import calibrate_eta_public

    t0 = time.perf_counter()
    bb = load_backbone(name)
    attacked, texts, prior, prov = public_split(bb, args.per_source, args.eval_texts,
                                                args.max_tokens, args.seed)
    classes, kinds_record = attacked_classes(attacked, texts, bb.tokenizer)
    p_hi, p_lo = args.p_range
    eta_lo, eta_hi = calibrate_eta_public(bb, p_hi), calibrate_eta_public(bb, p_lo)
    etas = (sorted(calibrate_eta_public(bb, p) for p in args.p) if args.p
            else eta_band(eta_lo, eta_hi, args.points))
    den, band = load_denoiser(denoiser_spec, bb)
    opts = {"bayes_k": args.bayes_k, "bayes_samples": args.bayes_samples,
            "bayes_confirm_samples": args.bayes_confirm,
            "bayes_max_confirm": args.bayes_max_confirm, "bayes_z": args.bayes_z,
            "bigram_samples": args.bigram_samples, "bigram_candidates": args.bigram_candidates,
            "bigram_max_confirm": args.bigram_max_confirm}
    points = []
    for i, eta in enumerate(etas):
        names = list(args.attackers)
        if den is not None and band[0] / BAND_SLACK <= eta <= band[1] * BAND_SLACK:
            names.append("denoiser")
        t = time.perf_counter()
        res = reconstruct(attacked, bb, eta, names, public_rows=prior, seed=1000 * args.seed + i,
                          mode="fast", options={**opts, "denoiser": den}, classes=classes)
        by_kind, counts = kind_figures(res)
        rec = {k: {"all": v["all"], "replaced": v["replaced"], "by_kind": by_kind[k]}
               for k, v in res["attackers"].items()}
        any_rec = next(iter(res["attackers"].values()))
        points.append({"eta": eta, "p": res["p"], "n_tokens": any_rec["n_all"],
                       "n_replaced": any_rec["n_replaced"], "n_tokens_by_kind": counts,
                       "recovery": rec, "strongest": max(rec, key=lambda k: rec[k]["all"]),
                       "seconds": round(time.perf_counter() - t, 2)})
        print(f"{name} η={eta:.4g} P={res['p']:.3f} "
              + "  ".join(f"{k} {v['all']:.3f}/{v['replaced']:.3f} rare {_pc(v['by_kind']['rare'])}"
                          f" personal {_pc(v['by_kind']['personal'])}" for k, v in rec.items())
              + f"  ({points[-1]['seconds']:.1f} s)", flush=True)
    attackers = {"nn": {"name": NAMES["nn"]},
                 "bayes": {"name": NAMES["bayes"], "k": args.bayes_k,
                           "samples": args.bayes_samples, "confirm_samples": args.bayes_confirm,
                           "max_confirm": args.bayes_max_confirm, "z": args.bayes_z,
                           "prior": "unigram counts of the prior rows + 1",
                           "decision": "the release unless fresh draws confirm a challenger "
                                       "(Wilson bounds at z)"}}
    if "bayes-bigram" in args.attackers:
        attackers["bayes-bigram"] = {
            "name": NAMES["bayes-bigram"], "k": args.bayes_k, "samples": args.bigram_samples,
            "candidates": args.bigram_candidates, "confirm_samples": args.bayes_confirm,
            "max_confirm": args.bigram_max_confirm, "z": args.bayes_z,
            "prior": "interpolated Kneser-Ney bigram of the prior rows (discount 0.75)",
            "decision": "per-token MAP of each row's HMM (forward-backward); the release unless "
                        "fresh draws confirm the challenger and it still wins with every "
                        "emission at its release-favouring Wilson bound"}
    if den is not None:
        attackers["denoiser"] = {
            "name": NAMES["denoiser"], "folder": denoiser_spec, "eta_band": list(band),
            "measured_within": [band[0] / BAND_SLACK, band[1] * BAND_SLACK],
            # The folder is not shipped: say what it was, so it can be trained again.
            "trained": {k: den.meta.get(k) for k in ("target_p", "rows", "tokens", "steps",
                                                     "earlier", "noise_seed")}
            | {"corpus": [f"{s['name']}/{s['split']}" for s in
                          den.meta.get("corpus", {}).get("sources", [])],
               "trainable": den.config.trainable, "change_margin": den.config.change_margin},
            "note": "a channel model trained at this η band: measured (and valid) only near it"}
    emb = bb.embeddings
    return {"tokenizer": f"{name}'s ({type(bb.tokenizer).__name__}, {len(bb.tokenizer):,} "
                         "tokens)",
            "embeddings": list(emb.shape),
            "mechanism": "dχ text-to-text at η; outputs: the tokenizer's real tokens (no "
                         "specials or unused placeholders); certified-exact (fast) search",
            "grid": ({"p_on_public_sample": list(args.p), "eta": etas} if args.p else
                     {"p_range_on_public_sample": [p_hi, p_lo], "eta_range": [eta_lo, eta_hi],
                      "points": args.points, "spacing": "geometric in η"}),
            "corpus": prov, "kinds": kinds_record, "attackers": attackers, "points": points,
            "seconds": round(time.perf_counter() - t0, 1)}


def _pc(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def _bayes_note(b: dict) -> str:
    if "confirm_samples" not in b:
        return f"Bayes: top-{b['k']} candidates, {b['samples']} Monte-Carlo samples each."
    return (f"Bayes: top-{b['k']} candidates screened with {b['samples']} draws each; a release "
            f"is changed only when {b['confirm_samples']} fresh draws confirm the challenger "
            f"(Wilson bounds, z = {b['z']:g}; at most {b['max_confirm']} releases confirmed per "
            "η), so it is never below nearest neighbour beyond sampling error.")


def _bigram_note(e: dict) -> str:
    b = e["attackers"].get("bayes-bigram")
    if b is None:
        return ""
    return (f" Bayes with a bigram prior: each row an HMM over the release and the "
            f"{b['candidates']} best of the top-{b['k']} originals screened with {b['samples']} "
            f"draws each, transitions {b['prior']}; a guess changes only when "
            f"{b['confirm_samples']} fresh draws confirm it and it still wins with every emission"
            f" at its release-favouring bound (at most {b['max_confirm']} pairs per η).")


def markdown(doc: dict) -> str:
    prov = doc["provenance"]
    shipped = doc.get("shipped", True)
    title = ("Attack table: token recovery vs η, per backbone, on public text" if shipped else
             "Attackers compared on one release per η: token recovery on public text")
    lines = [f"# {title}", "",
             f"`{prov['command']}` at rapt {prov['rapt_version']} ({prov['commit']}), "
             f"{prov['date']}.  ",
             f"Machine: {prov['machine']['platform']}, {prov['machine']['cpu_count']} CPUs "
             f"shared, {prov['machine']['threads']} thread(s), torch {prov['machine']['torch']}; "
             f"load {prov['machine']['loadavg_start'][0]:.2f} before, "
             f"{prov['machine']['loadavg_end'][0]:.2f} after; {prov['wall_s'] / 60:.1f} min "
             "wall.", "",
             "Recovery = share of non-special tokens the attacker guesses right (all / replaced "
             "only); empirical privacy (EP) = 1 − the best recovery of the attackers we ran (an "
             "upper bound on privacy: a stronger attacker would lower it). "
             + ("Shipped as `src/rapt/resources/attack_table.json` (read by "
                "`rapt.privacy.attack_table`), printed by every command beside P." if shipped else
                "Not the shipped table: every attacker sees the same release at each η."), ""]
    for name, e in doc["backbones"].items():
        c = e["corpus"]
        src = ", ".join(f"{s['name']}/{s['split']} {s['texts']}" for s in c["sources"])
        keys = list(e["attackers"])
        lines += [f"## {name}", "",
                  f"Public text disjoint from {c['disjoint_from']} ({src}; tokenizer "
                  f"{e['tokenizer']}): {c['attacked_texts']} texts attacked "
                  f"({c['attacked_tokens']:,} tokens, at most {c['max_tokens_per_attacked_text']}"
                  f" each), prior from the other {c['prior_texts']:,} texts "
                  f"({c['prior_tokens']:,} tokens). {_bayes_note(e['attackers']['bayes'])}"
                  f"{_bigram_note(e)} "
                  f"{e['seconds'] / 60:.1f} min.", ""]
        if "provenance" in e:  # added to the table later (--add), by its own command
            lines += [f"Added by `{e['provenance']['command']}` at {e['provenance']['commit']}, "
                      f"{e['provenance']['date']}.", ""]
        if "denoiser" in e["attackers"]:
            d = e["attackers"]["denoiser"]
            t = d.get("trained") or {}
            how = (f" ({t['trainable']} fine-tune of the backbone, {t['steps']} steps on "
                   f"{t['rows']:,} pairs of {', '.join(t['corpus'])}; change margin "
                   f"{t['change_margin']:g})" if t.get("steps") else "")
            lines += [f"Denoiser `{d['folder']}`{how}, trained at η {d['eta_band'][0]:.4g}.."
                      f"{d['eta_band'][1]:.4g}: measured only at η "
                      f"{d['measured_within'][0]:.4g}..{d['measured_within'][1]:.4g}.", ""]
        lines += ["| η | P | " + " | ".join(f"{NAMES.get(k, k)} all / replaced" for k in keys)
                  + " | best attacker | EP | s |",
                  "|---|---|" + "---|" * len(keys) + "---|---|---|"]
        for pt in e["points"]:
            cells = [f"{pt['recovery'][k]['all']:.1%} / {pt['recovery'][k]['replaced']:.1%}"
                     if k in pt["recovery"] else "–" for k in keys]
            best = pt["recovery"][pt["strongest"]]["all"]
            lines.append(f"| {pt['eta']:.4g} | {pt['p']:.3f} | " + " | ".join(cells)
                         + f" | {NAMES.get(pt['strongest'], pt['strongest'])} | {1 - best:.3f} "
                         f"| {pt['seconds']:.0f} |")
        lines += [""] + _kinds_table(e)
    return "\n".join(lines)


def _kinds_table(e: dict) -> list[str]:
    """Each attacker's recovery of rare-word and personal-data tokens per η, and the
    rare-word / personal-data privacy (1 − the best of them); nothing for an older table."""
    pts = [pt for pt in e["points"] if "n_tokens_by_kind" in pt]
    if not pts or "kinds" not in e:
        return []
    keys = list(e["attackers"])
    counts = e["kinds"]["counts"]
    lines = [f"Per kind of token: rare = {counts['rare']}; personal = {counts['personal']}. "
             "Recovery of rare / personal tokens; rare-word and personal-data privacy = 1 − the "
             "best recovery of the attackers we ran on those tokens (upper bounds).", "",
             "| η | rare / personal tokens | "
             + " | ".join(f"{NAMES.get(k, k)} rare / personal" for k in keys)
             + " | rare-word privacy | personal-data privacy |",
             "|---|---|" + "---|" * len(keys) + "---|---|"]
    for pt in pts:
        by = {k: pt["recovery"][k]["by_kind"] for k in keys if k in pt["recovery"]}
        cells = [f"{_pc(by[k]['rare'])} / {_pc(by[k]['personal'])}" if k in by else "–"
                 for k in keys]
        ep = {kind: None if any(v[kind] is None for v in by.values())
              else 1 - max(v[kind] for v in by.values()) for kind in ("rare", "personal")}
        n = pt["n_tokens_by_kind"]
        lines.append(f"| {pt['eta']:.4g} | {n['rare']:,} / {n['personal']:,} | "
                     + " | ".join(cells) + " | "
                     + " | ".join("–" if ep[k] is None else f"{ep[k]:.3f}"
                                  for k in ("rare", "personal")) + " |")
    return lines + [""]


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bbs = list(doc["backbones"])
    fig, axes = plt.subplots(1, len(bbs), figsize=(5.5 * len(bbs), 4.2), squeeze=False)
    for ax, name in zip(axes[0], bbs, strict=True):
        e = doc["backbones"][name]
        for k in e["attackers"]:
            pts = [pt for pt in e["points"] if k in pt["recovery"]]
            ps = [pt["p"] for pt in pts]
            line, = ax.plot(ps, [pt["recovery"][k]["all"] for pt in pts], "o-", ms=3,
                            label=f"{NAMES.get(k, k)}, all tokens")
            ax.plot(ps, [pt["recovery"][k]["replaced"] for pt in pts], "x--", ms=3,
                    color=line.get_color(), label=f"{NAMES.get(k, k)}, replaced only")
        ax.set_title(f"{name}: token recovery on public text")
        ax.set_xlabel("P (share of tokens replaced)")
        ax.set_ylabel("recovery")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def merged_with_shipped(doc: dict) -> dict:
    """The shipped table with ``doc``'s backbones added or replaced, each of those with
    ``doc``'s provenance (the table's own provenance stays that of the rows it measured)."""
    shipped = json.loads(RESOURCE.read_text())
    for name, entry in doc["backbones"].items():
        shipped["backbones"][name] = {**entry, "provenance": doc["provenance"]}
    return shipped


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbones", nargs="+", default=["minilm", "smollm2-135m"])
    ap.add_argument("--points", type=int, default=12, help="η grid points per backbone")
    ap.add_argument("--p-range", type=float, nargs=2, default=[0.85, 0.07],
                    help="P (on rapt's public sample) at the grid's smallest and largest η")
    ap.add_argument("--eval-texts", type=int, default=250, help="public texts attacked per η")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens kept per attacked text")
    ap.add_argument("--per-source", type=int, default=1000, help="public rows per split")
    ap.add_argument("--bayes-k", type=int, default=1000)
    ap.add_argument("--bayes-samples", type=int, default=64, help="screen draws per candidate")
    ap.add_argument("--bayes-confirm", type=int, default=1024,
                    help="fresh draws per challenger and per challenged release")
    ap.add_argument("--bayes-max-confirm", type=int, default=64,
                    help="releases confirmed per η (the screen's likeliest flips first)")
    ap.add_argument("--bayes-z", type=float, default=3.0)
    ap.add_argument("--attackers", nargs="+", default=["nn", "bayes"],
                    choices=["nn", "bayes", "bayes-bigram"],
                    help="attackers at every point (nn and bayes at least; the denoiser: "
                         "--denoiser)")
    ap.add_argument("--bigram-samples", type=int, default=1024,
                    help="bayes-bigram: screen draws per candidate original")
    ap.add_argument("--bigram-candidates", type=int, default=16,
                    help="bayes-bigram: screened originals per position besides the release")
    ap.add_argument("--bigram-max-confirm", type=int, default=256,
                    help="bayes-bigram: (release, challenger) pairs confirmed per η")
    ap.add_argument("--p", type=float, nargs="+", default=[],
                    help="measure only the η calibrated for each of these P, not the grid")
    ap.add_argument("--out", default="attack_table",
                    help="results name under benchmarks/results; the shipped table is written "
                         "only under the default name and without --p")
    ap.add_argument("--denoiser", action="append", default=[], metavar="BACKBONE=FOLDER",
                    help="a trained channel model (rapt adapt) for that backbone")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--add", action="store_true",
                    help="add (or replace) only the measured backbones in the shipped table, "
                         "keeping the others' rows and provenance; each added entry carries its "
                         "own provenance")
    ap.add_argument("--quick", action="store_true",
                    help="check the script: 3 points, 40 texts, written under /tmp only")
    args = ap.parse_args()
    if not {"nn", "bayes"} <= set(args.attackers):
        ap.error("--attackers must include nn and bayes (the table's floor and its Bayes rule)")
    if args.p and args.out == "attack_table":
        ap.error("--p measures a few points, not the table: give --out NAME as well")
    if args.quick:
        args.points, args.eval_texts, args.per_source = 3, 40, 200
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)  # the machine is shared
    dens = dict(s.split("=", 1) for s in args.denoiser)
    unknown = set(dens) - set(args.backbones)
    if unknown or any("=" not in s for s in args.denoiser):
        raise SystemExit(f"--denoiser takes BACKBONE=FOLDER for one of {args.backbones}")
    import rapt

    host, t0, commit = machine(), time.perf_counter(), git_commit()  # the code measured
    backbones = {b: measure_backbone(b, args, dens.get(b)) for b in args.backbones}
    doc = {"format": "rapt-attack-table", "version": 1,
           "metric": "token recovery: share of non-special tokens an attacker guesses right "
                     "from the release and public knowledge (all tokens / replaced only); "
                     "empirical privacy = 1 - the best recovery of the attackers we ran over all "
                     "tokens (an upper bound on privacy)",
           "provenance": {
               "command": command(),
               "rapt_version": rapt.__version__, "commit": commit,
               "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
               "public_text": "public_corpus_for('sst2'): rapt's built-in datasets other than "
                              "SST-2; a deployment would use a general web or encyclopedic "
                              "corpus",
               "machine": {**host, "loadavg_end": list(os.getloadavg())},
               "wall_s": round(time.perf_counter() - t0, 1), "seed": args.seed,
               "noise": "seeded per point (a benchmark: the table is not a release)"},
           "shipped": args.out == "attack_table" and not args.p, "backbones": backbones}
    from rapt.privacy.attack_table import parse_table

    if args.add and not args.p:
        doc = merged_with_shipped(doc)
    if not args.p:
        parse_table(doc, "the table just measured")  # what rapt reads must parse
    out_dir = Path("/tmp/attack_table_quick") if args.quick else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=1) + "\n"
    if args.out == "attack_table" and not args.p:
        resource = out_dir / "attack_table_resource.json" if args.quick else RESOURCE
        resource.write_text(text)
        print(f"wrote {resource}")
    (out_dir / f"{args.out}.json").write_text(text)
    (out_dir / f"{args.out}.md").write_text(markdown(doc))
    plot(doc, out_dir / f"{args.out}.png")
    print(markdown(doc))
    print(f"wrote {out_dir / args.out}.json, .md, .png")


if __name__ == "__main__":
    main()
