"""The contextual (domain) denoiser against noise by kind of token: trained on the provider's
public text of the user's domain, privatized by the same mechanism, then run on the dev sets'
releases. Its guesses come back as token ids; ``benchmarks.bench_privacy_by_kind --guesses``
scores them per kind of token beside nearest neighbour and the Bayes attacker.

For each mechanism (``u0.6``: uniform at P 0.6's η; by-kind names of
``benchmarks.local_baseline.MECHS``) one denoiser is trained from the backbone on the splits of
SST-2 and Financial PhraseBank that are not their dev split (texts equal to a dev text dropped:
the domain attacker of ``attackers.md``), each text privatized ``--repeats`` times with fresh
noise, for ``--budget-s`` wall seconds; then each dev set is privatized once (fixed seed) and
the denoiser guesses every token (plain argmax: no change margin is fitted here).

    python -m benchmarks.bench_kind_attack --backbone minilm --etas ETAS.json \\
        --spans SPANS.json.gz --mechs u0.6 r0.6 --budget-s 120 --out /tmp/kind_attack
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

DEV = {"sst2": ("sst2-sentences", "dev"), "financial_phrasebank": ("financial_phrasebank", "dev")}
DOMAIN = (("sst2-sentences", "train"), ("sst2-sentences", "test"),
          ("financial_phrasebank", "train"), ("financial_phrasebank", "test"))
MAX_LENGTH = 48  # the domain attacker's (attackers.md)


def policy_for(name: str, etas: dict):
    """(strong η, KindPolicy) of a mechanism name."""
    from benchmarks.local_baseline import kind_policy
    from rapt.privacy.by_kind import KindPolicy

    if name.startswith("u"):
        return etas[name[1:]], KindPolicy("all")
    return kind_policy(name, etas)


def domain_texts(splits, dev: set[str]) -> list[str]:
    """The texts of ``splits`` ((dataset, split) pairs) that are not a dev text (compared
    stripped and lower-cased): an attacker's public text of the user's domain."""
    from rapt.data import load_dataset

    return [x for name, split in splits for x in load_dataset(name, split).texts
            if x and x.strip().lower() not in dev]


def release(bb, texts, eta, policy, spans, seed: int, repeats: int = 1):
    """(clean text-only rows, released rows) of ``texts``, ``repeats`` privatizations each."""
    from rapt.privacy.by_kind import row_noise
    from rapt.privacy.mechanism import Privatizer, candidate_ids_from_tokenizer, tokenize_texts
    from rapt.tuning.reconstruction import privatize_rows

    room = MAX_LENGTH - 2
    full = tokenize_texts(texts, bb.tokenizer)
    rows = [r[:room] for r in full]
    cand = candidate_ids_from_tokenizer(bb.tokenizer, bb.embeddings.shape[0])
    priv = Privatizer(bb.embeddings, eta, special_ids=bb.special_ids, candidate_ids=cand,
                      seed=seed)
    scales, clear, _ = row_noise(full, texts, None, bb.tokenizer, policy, eta, special=set(),
                                 spans=spans)
    scales, clear = [s[:room] for s in scales], [c[:room] for c in clear]
    clean, out = [], []
    for _ in range(repeats):
        clean += rows
        out += privatize_rows(rows, priv, eta_scale=None if policy.uniform else scales,
                              passthrough=None if policy.uniform else clear)
    return clean, out


def main() -> None:
    from benchmarks.personal_spans import load_spans
    from rapt.channel.denoiser import DenoiserConfig, train_denoiser
    from rapt.data import load_dataset
    from rapt.models import load_backbone
    from rapt.progress import progress_bar

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backbone", default="minilm")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--etas", required=True, help="JSON {P: η}")
    ap.add_argument("--spans", required=True, help="benchmarks.personal_spans lookup")
    ap.add_argument("--mechs", nargs="+", default=["u0.6", "r0.6"])
    ap.add_argument("--budget-s", type=float, default=120.0)
    ap.add_argument("--steps", type=int, default=0,
                    help="stop after this many steps too (0: the wall budget alone); a CPU run "
                         "matching a GPU run's steps is comparable with it, its seconds are not")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--limit", type=int, default=0, help="domain texts (0: all; dry runs)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--save", default=None, metavar="DIR",
                    help="also save each trained denoiser to DIR/NAME (Denoiser.load reads it: "
                    "bench_canaries --denoiser)")
    args = ap.parse_args()
    etas = json.loads(Path(args.etas).read_text())
    spans = load_spans(args.spans)
    bb = load_backbone(args.backbone, device=args.device)
    dev_texts = {t: list(load_dataset(*DEV[t]).texts) for t in DEV}
    domain = domain_texts(DOMAIN, {x.strip().lower() for ts in dev_texts.values() for x in ts})
    domain = domain[:args.limit] if args.limit else domain
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for m_i, name in enumerate(args.mechs):
        eta, policy = policy_for(name, etas)
        t0 = time.perf_counter()
        clean, priv = release(bb, domain, eta, policy, spans, seed=7 + m_i,
                              repeats=args.repeats)
        t_priv = time.perf_counter() - t0
        cfg = DenoiserConfig(lr=2e-4, epochs=50, batch_size=args.batch, max_length=MAX_LENGTH)
        hist: list[dict] = []
        deadline = time.perf_counter() + args.budget_s
        bar = progress_bar(total=args.steps or None, desc=f"denoiser {name}", unit="step")

        def progress(h: dict, hist=hist, bar=bar) -> None:
            hist.append(h)
            bar.set_postfix(loss=f"{h['loss']:.3f}", replaced_acc=f"{h['replaced_acc']:.3f}")
            bar.update()

        den = train_denoiser(bb, clean, priv, cfg, meta={"mechanism": name},
                             progress=progress,
                             should_stop=lambda d=deadline, h=hist: time.perf_counter() > d
                             or 0 < args.steps <= len(h))
        bar.close()
        den.eval()
        if args.save:  # with what it was trained on, for the pages that load it
            den.meta.update(steps=len(hist), device=args.device, domain_texts=len(domain),
                            repeats=args.repeats)
            den.save(Path(args.save) / name)
        rec = {"mechanism": name, "eta": eta, "policy": policy.record(eta),
               "device": args.device, "backbone": args.backbone,
               "step_cap": args.steps or None,
               "domain_texts": len(domain), "pairs": len(clean),
               "privatize_s": t_priv, "train_s": time.perf_counter() - t0 - t_priv,
               "steps": len(hist), "curve": [{k: h.get(k) for k in
                                              ("step", "loss", "token_acc", "replaced_acc")}
                                             for h in hist[:: max(1, len(hist) // 40)]],
               "tasks": {}}
        for t_i, (task, texts) in enumerate(dev_texts.items()):
            c, p = release(bb, texts, eta, policy, spans, seed=100 + 10 * t_i)
            with torch.no_grad():
                g = den.guess(p)
            rec["tasks"][task] = {"texts": len(texts), "clean": c, "private": p, "guess": g}
        (out / f"kind_attack_{name}.json").write_text(json.dumps(rec))
        print(f"{name}: {len(hist)} steps, {rec['train_s']:.0f} s, last "
              f"{hist[-1] if hist else None}", flush=True)
        del den
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
