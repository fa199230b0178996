"""`rapt adapt`: the provider side of the channel remedies.

Builds the channel model -- a :class:`rapt.channel.adapter.ChannelAdapter` (``--kind adapter``:
LoRA distilled so that the backbone reads privatized text as clean text, the remedy that wins
back the most in benchmarks/results/channel.md) or a :class:`rapt.channel.denoiser.Denoiser`
(``--kind denoiser``: denoise-then-tune, and an attacker) -- for one backbone at an η (or the
η of a target P, or a band of η) from public text privatized by the provider, and saves it as
a folder with its provenance. `rapt tune` / `rapt predict` take it with
``--channel``. The stages live in rapt.channel.corpus and rapt.channel.denoiser; this module reads
the corpus, shows progress, prints the held-out recovery and writes the folder atomically.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import typer

from rapt import numfmt
from rapt.cli._app import TARGET_P_HELP, app, check_eta_options, fail, load_backbone_or_fail
from rapt.config import eta_problem

_HELP = {
    "out": "channel model folder (written atomically: nothing half-written on error or Ctrl-C)",
    "corpus_for": "public corpus: rapt's built-in sets other than TASK (sst2, fp, trec, cb, "
    "trustpilot)",
    "corpus": "public corpus: a text file, one text per line (you vouch it is public and "
    "disjoint from the customers' tasks)",
    "eta_band": "train over a band of η: LO HI N (N values spaced geometrically)",
    "budget_min": "stop training after this many minutes (wall clock); the model trained so far "
    "is kept",
    "max_rows": "use at most N corpus texts (a seeded random subset)",
    "holdout": "corpus texts held out (never trained on) to measure recovery",
    "repeats": "privatized copies of each training text per η",
    "max_length": "tokens per row read by the denoiser ([CLS]/[SEP] included); longer rows keep "
    "their tail as released",
    "noise_seed": "seed the channel data's privatization noise (public text: no privacy at "
    "stake, but recorded as seeded); default: OS entropy",
    "kind": "denoiser (reads privatized rows back: denoise-then-tune; also an attacker) | "
    "adapter (LoRA that makes the backbone read privatized text as clean text: the larger gain "
    "in benchmarks/results/channel.md)",
    "lr": "AdamW learning rate (default: 5e-5 for a denoiser, 2e-3 for an adapter)",
    "clean_share": "adapter: share of the training texts also added as (clean, clean) pairs, so "
    "that the adapted backbone still reads clean text (label descriptions) as before",
}


@dataclass(frozen=True)
class AdaptOptions:
    """The options of `rapt adapt`, one field per parameter, as typed on the command line."""

    out: Path
    backbone: str
    corpus_for: str | None
    corpus: Path | None
    eta: float | None
    target_p: float | None
    eta_band: tuple[float, float, int] | None
    epochs: int
    budget_min: float | None
    max_rows: int | None
    holdout: int
    repeats: int
    lr: float | None
    batch_size: int
    max_length: int
    trainable: str
    kind: str
    clean_share: float
    seed: int
    noise_seed: int | None
    force: bool
    json_report: bool


@app.command()
def adapt(
    out: Path = typer.Option(Path("runs/channel"), "--out", "-o", help=_HELP["out"]),
    backbone: str = typer.Option("minilm", help="encoder backbone name or path"),
    corpus_for: str | None = typer.Option(None, "--corpus-for", help=_HELP["corpus_for"]),
    corpus: Path | None = typer.Option(None, "--corpus", help=_HELP["corpus"]),
    eta: float | None = typer.Option(None, help="privacy parameter η of the channel"),
    target_p: float | None = typer.Option(None, help=TARGET_P_HELP),
    eta_band: tuple[float, float, int] | None = typer.Option(None, "--eta-band",
                                                             help=_HELP["eta_band"]),
    epochs: int = typer.Option(1, help="passes over the privatized corpus"),
    budget_min: float | None = typer.Option(None, "--budget-min", help=_HELP["budget_min"]),
    max_rows: int | None = typer.Option(None, "--max-rows", help=_HELP["max_rows"]),
    holdout: int = typer.Option(200, help=_HELP["holdout"]),
    repeats: int = typer.Option(1, help=_HELP["repeats"]),
    lr: float | None = typer.Option(None, help=_HELP["lr"]),
    batch_size: int = typer.Option(32),
    max_length: int = typer.Option(128, help=_HELP["max_length"]),
    trainable: str = typer.Option("full", help="denoiser: full | lora"),
    kind: str = typer.Option("denoiser", help=_HELP["kind"]),
    clean_share: float = typer.Option(0.2, help=_HELP["clean_share"]),
    seed: int = typer.Option(0, help="init, data order, corpus subset and held-out slice"),
    noise_seed: int | None = typer.Option(None, help=_HELP["noise_seed"]),
    force: bool = typer.Option(False, "--force", help="replace an existing --out folder"),
    json_report: bool = typer.Option(False, "--json-report",
                                     help="print the saved provenance as one JSON line"),
) -> None:
    """Provider side: learn the privatization channel from public text privatized at η, and
    save the channel model for `rapt tune/predict --channel` and `rapt serve --channel`. A
    denoiser prints its token recovery against nearest neighbour's on held-out public text (it
    is also an attacker at that η); an adapter prints how much closer the backbone reads
    held-out privatized text to the clean text."""
    o = AdaptOptions(**locals())  # the options, typed, for the stage helpers below
    _check_options(o)
    bb = load_backbone_or_fail(backbone)
    _check_backbone(o, bb)
    texts, prov = _read_corpus(o)
    rows = _tokenized(texts, bb.tokenizer, o, prov)
    train_rows, held = _split_holdout(rows, o)
    priv, etas = _privatizer_and_etas(o, bb)
    try:
        den, pairs_meta = _train(o, bb, priv, etas, train_rows, prov)
        results = (_evaluate_adapter if o.kind == "adapter" else _evaluate)(o, bb, den, held,
                                                                           etas)
        den.meta.update({"evaluation": results, **pairs_meta})
        _save_atomic(den, out, force)
    except KeyboardInterrupt:
        typer.echo(f"\ninterrupted: nothing saved to {out}", err=True)
        raise typer.Exit(130) from None
    (_echo_adapter_results if o.kind == "adapter" else _echo_results)(results, held)
    typer.echo(f"saved the channel model to {out} (corpus: {_corpus_names(prov)}; "
               f"{pairs_meta['train_rows']:,} texts, {den.meta.get('tokens', 0):,} training "
               f"tokens; η {_eta_text(etas)}; seeded: {str(noise_seed is not None).lower()})")
    if json_report:
        typer.echo(json.dumps({"out": str(out), "meta": den.meta}, default=str))


def _check_options(o: AdaptOptions) -> None:
    """Cheap option checks, before anything is loaded; each a one-line error (exit 2)."""
    check_eta_options(o.eta, o.target_p)
    given = [n for n, v in (("--eta", o.eta), ("--target-p", o.target_p),
                            ("--eta-band", o.eta_band)) if v is not None]
    if len(given) != 1:
        fail("give exactly one of --eta, --target-p, --eta-band" +
             (f" (got {', '.join(given)})" if given else ""))
    if o.eta_band is not None:
        lo, hi, n = o.eta_band
        if not (0 < lo <= hi) or n < 1:
            fail(f"--eta-band LO HI N needs 0 < LO <= HI and N >= 1 (got {lo:g} {hi:g} {n})")
        if eta_problem(lo) or eta_problem(hi):
            fail(f"--eta-band: η {eta_problem(lo) or eta_problem(hi)}")
    if (o.corpus is None) == (o.corpus_for is None):
        fail("give the public corpus with exactly one of --corpus-for TASK or --corpus FILE")
    if o.corpus is not None and not o.corpus.is_file():
        fail(f"--corpus {o.corpus}: no such file")
    for name in ("epochs", "repeats", "batch_size", "holdout", "max_rows"):
        v = getattr(o, name)
        if v is not None and v < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1 (got {v})")
    if o.budget_min is not None and not o.budget_min > 0:
        fail(f"--budget-min must be positive (got {o.budget_min})")
    if o.trainable not in ("full", "lora"):
        fail(f"--trainable must be full or lora (got {o.trainable!r})")
    if o.kind not in ("denoiser", "adapter"):
        fail(f"--kind must be denoiser or adapter (got {o.kind!r})")
    if o.lr is not None and not o.lr > 0:
        fail(f"--lr must be positive (got {o.lr})")
    if not 0 <= o.clean_share <= 1:
        fail(f"--clean-share must lie in [0, 1] (got {o.clean_share})")
    if o.out.exists() and not o.force:
        fail(f"{o.out} exists; pass --force to replace it, or choose another --out")


def _check_backbone(o: AdaptOptions, bb) -> None:
    if bb.kind != "encoder" and o.kind == "denoiser":
        fail(f"the channel model reads both sides of each token: it needs an encoder "
             f"backbone, {o.backbone!r} is {bb.kind}")
    limit = getattr(bb.model.config, "max_position_embeddings", None)
    if limit is not None and o.max_length > limit:
        fail(f"--max-length {o.max_length} exceeds {o.backbone}'s {limit} positions")


def _read_corpus(o: AdaptOptions) -> tuple[list[str], dict]:
    """(texts, provenance) of the public corpus."""
    from rapt.channel.corpus import ChannelCorpus, public_corpus_for

    if o.corpus_for is not None:
        try:
            c = public_corpus_for(o.corpus_for)
        except (ValueError, FileNotFoundError, OSError) as e:
            fail(f"--corpus-for {o.corpus_for}: {e}")
        return list(c.texts), c.provenance()
    try:
        texts = [t.strip() for t in o.corpus.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        fail(f"--corpus {o.corpus}: cannot read it as UTF-8 text ({e})")
    texts = [t for t in texts if t]
    c = ChannelCorpus(tuple(texts), ({"name": str(o.corpus), "split": None, "rows": len(texts),
                                      "texts": len(texts)},), "unchecked (a user file)")
    prov = c.provenance()
    prov["note"] = ("a text file given with --corpus: the provider vouches that it is public "
                    "and disjoint from the customers' tasks")
    return texts, prov


def _tokenized(texts: list[str], tokenizer, o: AdaptOptions, prov: dict) -> list[list[int]]:
    """Token ids of a seeded subset of at most --max-rows texts (empty ones dropped); the
    texts and tokens used go into ``prov``."""
    from rapt.privacy.mechanism import tokenize_texts

    if o.max_rows is not None and len(texts) > o.max_rows:
        keep = sorted(random.Random(o.seed).sample(range(len(texts)), o.max_rows))
        texts = [texts[i] for i in keep]
    rows = [list(r) for r in tokenize_texts(texts, tokenizer) if len(r)]
    prov.update({"max_rows": o.max_rows, "used_texts": len(rows),
                 "n_tokens": sum(len(r) for r in rows),
                 "tokenizer": str(getattr(tokenizer, "name_or_path", "") or
                                  type(tokenizer).__name__)})
    if len(rows) < 2:
        fail(f"the public corpus has {len(rows)} non-empty texts; need at least 2 (one to "
             "train on, one held out)")
    return rows


def _split_holdout(rows: list[list[int]], o: AdaptOptions):
    """(training rows, held-out rows): at most --holdout, and at most a tenth of the corpus
    (at least one row), drawn with --seed."""
    n = max(1, min(o.holdout, len(rows) // 10))
    order = list(range(len(rows)))
    random.Random(o.seed + 1).shuffle(order)
    held = set(order[:n])
    return ([r for i, r in enumerate(rows) if i not in held],
            [r for i, r in enumerate(rows) if i in held])


def _privatizer_and_etas(o: AdaptOptions, bb):
    """The privatizer (at --eta, the η of --target-p, or the band's geometric middle) and
    the η values the channel data is privatized at."""
    from rapt.channel.corpus import eta_band
    from rapt.pipeline import make_privatizer

    if o.eta_band is not None:
        etas = eta_band(o.eta_band[0], o.eta_band[1], int(o.eta_band[2]))
        mid = (etas[0] * etas[-1]) ** 0.5
        return make_privatizer(bb, mid, noise_seed=o.noise_seed), etas
    priv = make_privatizer(bb, o.eta, o.target_p, noise_seed=o.noise_seed)
    return priv, [float(priv.eta)]


def _fitter(o: AdaptOptions):
    """(train function, its config, the bar's second figure) for --kind; errors exit 2."""
    from rapt.channel import denoiser
    from rapt.channel.adapter import ChannelAdapterConfig, train_channel_adapter

    try:
        if o.kind == "adapter":
            return train_channel_adapter, ChannelAdapterConfig(
                lr=o.lr or 2e-3, epochs=o.epochs, batch_size=o.batch_size,
                max_length=o.max_length, seed=o.seed), "pooled_cos"
        return denoiser.train_denoiser, denoiser.DenoiserConfig(
            lr=o.lr or 5e-5, epochs=o.epochs, batch_size=o.batch_size, max_length=o.max_length,
            trainable=o.trainable, seed=o.seed), "replaced_acc"
    except ValueError as e:
        fail(str(e))


def _train(o: AdaptOptions, bb, priv, etas: list[float], rows, prov: dict):
    """Privatize the training rows at each η (--repeats times) and train the channel model
    with a step bar, stopping at --budget-min. -> (model, provenance of the channel data)."""
    from rapt.channel.corpus import privatize_channel
    from rapt.numfmt import loss
    from rapt.progress import progress_bar

    fit, cfg, second = _fitter(o)
    pairs = privatize_channel(rows, priv, etas, repeats=o.repeats)
    meta = {"corpus": prov, "eta_band": [min(etas), max(etas)], "etas": etas,
            "eta": (min(etas) * max(etas)) ** 0.5, "kind": o.kind,
            "target_p": o.target_p, "repeats": o.repeats, "train_rows": len(rows),
            "p": _p_by_eta(pairs, bb.special_ids), "seeded": o.noise_seed is not None,
            "mode": priv.mode, "budget_min": o.budget_min}
    clean, private = list(pairs.clean), list(pairs.private)
    if o.kind == "adapter":
        # Identity pairs: without them nothing holds the adapted backbone's reading of clean
        # text (label descriptions, RAPT's plain tokens) where it was.
        n_id = int(o.clean_share * len(rows))
        clean, private = clean + rows[:n_id], private + rows[:n_id]
        meta["identity_rows"] = n_id
    deadline = None if o.budget_min is None else time.monotonic() + 60 * o.budget_min
    bar = progress_bar(desc=f"adapt ({o.kind})", unit="step")

    def progress(r: dict) -> None:
        bar.total = r["total_steps"]
        bar.set_postfix({"loss": loss(r["loss"]), second: loss(r.get(second, 0))})
        bar.update(1)

    try:
        model = fit(bb, clean, private, cfg, meta=meta, progress=progress,
                    should_stop=None if deadline is None else
                    (lambda: time.monotonic() > deadline))
    finally:
        bar.close()
    return model, {k: meta[k] for k in ("train_rows", "p", "seeded", "etas", "eta_band")}


def _p_by_eta(pairs, special_ids) -> dict[str, float]:
    """Measured replacement probability of the channel data, per η."""
    from rapt.privacy.mechanism import replacement_probability

    out = {}
    for e in dict.fromkeys(pairs.eta):
        idx = [i for i, x in enumerate(pairs.eta) if x == e]
        out[f"{e:.6g}"] = replacement_probability([pairs.clean[i] for i in idx],
                                                  [pairs.private[i] for i in idx], special_ids)
    return out


def _evaluate(o: AdaptOptions, bb, den, held: list[list[int]], etas: list[float]) -> list:
    """Recovery of nearest neighbour and of the trained denoiser on the held-out public rows,
    privatized afresh at each η."""
    from rapt.attacks.recovery import reconstruct

    seed = None if o.noise_seed is None else o.noise_seed + 101
    out = []
    for e in etas:
        res = reconstruct(held, bb, e, ["nn", "denoiser"], seed=seed,
                          options={"denoiser": den})
        out.append({"eta": e, "p": res["p"], "n_tokens": res["n_tokens"],
                    "held_out_rows": len(held),
                    "recovery": {"nearest neighbour": res["attackers"]["nn"],
                                 "denoiser": res["attackers"]["denoiser"]}})
    return out


def _evaluate_adapter(o: AdaptOptions, bb, adapter, held: list[list[int]],
                      etas: list[float]) -> list:
    """How the raw and the adapted backbone read the held-out public rows, privatized afresh at
    each η, against the raw backbone on the clean rows (the distillation objective)."""
    from rapt.channel.adapter import distillation_loss
    from rapt.channel.corpus import privatize_channel
    from rapt.pipeline import make_privatizer

    seed = None if o.noise_seed is None else o.noise_seed + 101
    adapted = adapter.adapted_backbone(bb)
    kw = {"max_length": o.max_length, "pooled_weight": adapter.config.pooled_weight}
    out = []
    for e in etas:
        pairs = privatize_channel(held, make_privatizer(bb, e, noise_seed=seed), [e])
        out.append({"eta": e, "p": _p_by_eta(pairs, bb.special_ids)[f"{e:.6g}"],
                    "held_out_rows": len(held),
                    "raw": distillation_loss(bb, bb, pairs.clean, pairs.private, **kw),
                    "adapted": distillation_loss(bb, adapted, pairs.clean, pairs.private,
                                                 **kw)})
    return out


def _echo_adapter_results(results: list, held: list) -> None:
    typer.echo(f"on {len(held):,} held-out public texts (never trained on), privatized afresh; "
               "cosine of the sentence vector read from privatized text with the clean one, "
               "and the distillation loss (lower: closer to clean):")
    for r in results:
        raw, ad = r["raw"], r["adapted"]
        typer.echo(f"  η = {numfmt.eta(r['eta'])}  P = {numfmt.p(r['p'])}: raw backbone cos "
                   f"{raw['pooled_cos']:.3f}, loss {raw['loss']:.4f}; adapted cos "
                   f"{ad['pooled_cos']:.3f}, loss {ad['loss']:.4f}")
    typer.echo("the adapter reads the release as released: post-processing, so the formal "
               "guarantee at η is unchanged; it outputs no tokens, and the attackers that "
               "`rapt attack reconstruct` and the shipped table report are unchanged by it")
    worse = [r["eta"] for r in results if r["adapted"]["loss"] >= r["raw"]["loss"]]
    if worse:
        typer.echo(f"warning: at η = {', '.join(numfmt.eta(e) for e in worse)} the adapter reads "
                   "privatized text no closer to clean than the raw backbone: it is "
                   "undertrained; train on more rows or for longer (--epochs, --budget-min)",
                   err=True)


def _echo_results(results: list, held: list) -> None:
    typer.echo(f"recovery on {len(held):,} held-out public texts (never trained on):")
    for r in results:
        typer.echo(f"  η = {numfmt.eta(r['eta'])}  P = {numfmt.p(r['p'])}  "
                   f"({r['n_tokens']:,} tokens)")
        for name, rec in r["recovery"].items():
            typer.echo(f"    {name:>17}: {rec['all']:.1%} of all tokens, {rec['replaced']:.1%} "
                       f"of replaced tokens")
    typer.echo("the channel model is also an attacker: tuning with it leaves the formal "
               "guarantee unchanged (post-processing), but the empirical privacy is 1 − the "
               "recovery of the stronger of the two")
    weak = [r["eta"] for r in results if r["recovery"]["denoiser"]["all"]
            < r["recovery"]["nearest neighbour"]["all"]]
    if weak:
        typer.echo(f"warning: at η = {', '.join(numfmt.eta(e) for e in weak)} the channel model "
                   "recovers fewer tokens than nearest neighbour (the release itself): it is "
                   "undertrained and, as a remedy, likely to hurt; train on more rows or for "
                   "longer (--epochs, --budget-min)", err=True)


def _save_atomic(den, out: Path, force: bool) -> None:
    """Save into a hidden sibling folder, then rename it into place: an error or Ctrl-C
    leaves no partial ``out`` (with --force, the old folder is swapped out, then removed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        den.save(tmp)
        if out.exists() and force:
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _corpus_names(prov: dict) -> str:
    names = dict.fromkeys(str(s.get("name")) for s in prov.get("sources", []))
    return ", ".join(names) or "?"


def _eta_text(etas: list[float]) -> str:
    if len(etas) == 1:
        return f"= {numfmt.eta(etas[0])}"
    return f"band {numfmt.eta(etas[0])}..{numfmt.eta(etas[-1])} ({len(etas)} values)"
