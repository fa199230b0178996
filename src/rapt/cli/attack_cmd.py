"""`rapt attack`: simulated attacks that measure empirical privacy: `invert` (nearest-neighbour
inversion), `reconstruct` (token reconstruction attackers) and `attribute` (attribute
inference)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from rapt import numfmt
from rapt.cli._app import (
    app,
    check_eta_options,
    fail,
    load_backbone_or_fail,
    load_data_or_fail,
    resolve_eta,
    sub_app,
    warn_if_seeded,
)
from rapt.cli._tuning import customization, privatize_with_bar
from rapt.cli.options import ETA, TARGET_P, TEXT_COLUMN
from rapt.config import DEFAULT_PRIVATIZER_MODE
from rapt.privacy.rule import DEFAULT_TARGET_P

# The options `attack invert` and `attack reconstruct` share.
NOISE_SEED = typer.Option(None, "--noise-seed", "--seed",
                          help="seed the simulated privacy noise (default: OS entropy)")
INPUT_FORMAT = typer.Option("auto", "--format", help="input format (see rapt privatize)")
SPLIT = typer.Option("train", "--split")
RECORDS = typer.Option(None, "--limit", help="N records only, a random sample (seed 0, not the "
                       "noise seed: the same N every run) in file order")
JSON_REPORT = typer.Option(False, "--json-report")

attack_app = sub_app(help="Simulated attacks that measure empirical privacy.",
                     no_args_is_help=True)
app.add_typer(attack_app, name="attack")


@attack_app.command("invert")
def invert(
    input: str = typer.Argument(..., help="original text file or built-in dataset name"),
    eta: list[float] = typer.Option([], "--eta", help="η values to attack (repeatable)"),
    target_p: list[float] = typer.Option(
        [], "--target-p", help="instead of / beside --eta: the η calibrated for each of these P "
        "on rapt's bundled public text sample, as every command calibrates it (repeatable; "
        f"default {DEFAULT_TARGET_P:g} when neither is given)"),
    setting: str = typer.Option("text", "--setting",
                                help="text: attack privatized tokens; vectors: attack the noised "
                                "embeddings themselves (SAP)"),
    backbone: str = typer.Option("minilm", "--backbone", "-b", help="embedding model"),
    mode: str = typer.Option(DEFAULT_PRIVATIZER_MODE, "--mode",
                             help="search used by mechanism and attacker: exact, fast "
                             "(certified exact), annoy"),
    seed: int | None = NOISE_SEED,
    fmt: str = INPUT_FORMAT,
    split: str = SPLIT,
    text_column: str | None = TEXT_COLUMN,
    limit: int | None = RECORDS,
    json_report: bool = JSON_REPORT,
) -> None:
    """Nearest-neighbour embedding inversion: privatize the input at each η, let the attacker
    map every received token (or noised vector) to its nearest vocabulary token, report the
    success rate and the empirical privacy = 1 − success."""
    import torch

    from rapt.privacy.inversion import inversion_attack
    from rapt.privacy.mechanism import (
        Privatizer,
        candidate_ids_from_tokenizer,
        replacement_probability,
        tokenize_texts,
    )
    from rapt.privacy.nn_search import build_index

    if setting not in ("text", "vectors"):
        fail(f"--setting must be text or vectors, got {setting!r}")
    if mode not in ("exact", "fast", "annoy"):
        fail(f"--mode must be exact, fast or annoy, got {mode!r}")
    if any(not math.isfinite(e) or e <= 0 for e in eta):
        fail(f"--eta values must be positive, got {eta}")
    for p in target_p:
        check_eta_options(None, p)
    if not eta and not target_p:
        target_p = [DEFAULT_TARGET_P]
    ds = load_data_or_fail(input, split, fmt=None if fmt == "auto" else fmt,
                           text_column=text_column, limit=limit)
    bb = load_backbone_or_fail(backbone)
    levels = [(float(e), None) for e in eta] + [(resolve_eta(bb, None, p)[0], p)
                                                 for p in target_p]
    emb = bb.embeddings.detach()
    cand = candidate_ids_from_tokenizer(bb.tokenizer, emb.shape[0])
    ids = torch.tensor([i for row in tokenize_texts(ds.texts, bb.tokenizer) for i in row])
    if ids.numel() == 0:
        fail(f"{ds.source}: no tokens to attack")
    index = build_index(emb[cand].float(), mode)
    rows = []
    for e, tp in levels:
        priv = Privatizer(emb, e, special_ids=bb.special_ids, candidate_ids=cand, seed=seed,
                          index=index)
        if setting == "text":
            private = priv.privatize_ids(ids)
            res = inversion_attack(ids, emb, private_ids=private, special_ids=bb.special_ids,
                                   candidate_ids=cand, index=index)
            p = replacement_probability(ids, private, bb.special_ids)
        else:
            noised = priv.noised_embeddings(ids)
            res = inversion_attack(ids, emb, noised=noised, special_ids=bb.special_ids,
                                   candidate_ids=cand, index=index)
            p = 1.0 - res.success_rate
        rows.append({"eta": e, "target_p": tp, "p": p, **res.as_dict()})
        calibrated = f" (calibrated for P ≈ {tp:g})" if tp is not None else ""
        typer.echo(f"η = {numfmt.eta(e)}{calibrated}  P = {numfmt.p(p)}  attack success = "
                   f"{res.success_rate:.4f}  empirical privacy = {res.empirical_privacy:.4f}  "
                   f"({res.n_tokens} tokens)")
    if json_report:
        typer.echo(json.dumps({"input": ds.source, "setting": setting, "backbone": backbone,
                               "seeded": seed is not None, "results": rows}))


# Attackers that cost minutes on a CPU: the denoiser trains a model when none is given, the LLM
# attacker loads a second model and generates text, the bigram Bayes attacker draws 1024
# privatizations of each of its 2000 candidates. ``all`` includes one only when an option
# named here is given (--option denoiser=FOLDER, --option llm_backbone=NAME or
# llm_adapter=FOLDER, --option bigram_samples=N).
_SLOW = {"denoiser": ("denoiser",), "llm": ("llm_backbone", "llm_adapter"),
         "bayes-bigram": ("bigram_samples",)}


def _attacker_names(requested: list[str], options: dict) -> list[str]:
    from rapt.attacks import ATTACKERS
    from rapt.channel import denoiser  # noqa: F401  (registers "denoiser")

    every = [k for k in sorted(ATTACKERS, key=lambda k: (k != "nn", k))
             if k not in _SLOW or any(o in options for o in _SLOW[k])]
    names: list[str] = []
    for a in requested:
        for n in (every if a == "all" else [a]):
            if n not in ATTACKERS:
                fail(f"unknown --attacker {n!r}; choose from all, "
                     f"{', '.join(sorted(ATTACKERS))}")
            if n not in names:
                names.append(n)
    return names


def _options(pairs: list[str]) -> dict:
    out: dict = {}
    for kv in pairs:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            fail(f"--option takes KEY=VALUE, got {kv!r}")
        out[key] = value
    return out


@attack_app.command("reconstruct")
def reconstruct(
    input: str = typer.Argument(..., help="original text file or built-in dataset name"),
    backbone: str = typer.Option("minilm", "--backbone", "-b", help="embedding model"),
    eta: float | None = ETA,
    target_p: float | None = TARGET_P,
    attacker: list[str] = typer.Option(["all"], "--attacker", "-a",
                                       help="nn, bayes, bayes-bigram (a bigram context prior), "
                                       "denoiser, llm, another registered attacker, or all "
                                       "(repeatable; all takes bayes-bigram only with --option "
                                       "bigram_samples=N, the denoiser "
                                       "only when --option denoiser=FOLDER gives a trained one, "
                                       "the LLM only with --option llm_backbone=NAME)"),
    public_for: str | None = typer.Option(None, "--public-for",
                                          help="evaluation task the attackers' public corpus "
                                          "must be disjoint from (default: INPUT when it is a "
                                          "built-in task)"),
    max_public_rows: int | None = typer.Option(None, "--max-public-rows",
                                               help="at most N rows per public source"),
    bayes_k: int = typer.Option(2000, "--bayes-k", help="Bayes: candidate originals (top-K "
                                "public tokens)"),
    bayes_samples: int = typer.Option(64, "--bayes-samples", help="Bayes: screen draws per "
                                      "candidate (a guess changes only where fresh draws "
                                      "confirm it: --option bayes_confirm_samples=N, default "
                                      "2048)"),
    option: list[str] = typer.Option([], "--option", help="KEY=VALUE passed to the attackers "
                                     "(repeatable)"),
    mode: str = typer.Option("fast", "--mode", help="search: exact, fast, annoy"),
    seed: int | None = NOISE_SEED,
    fmt: str = INPUT_FORMAT,
    split: str = SPLIT,
    text_column: str | None = TEXT_COLUMN,
    limit: int | None = RECORDS,
    json_report: bool = JSON_REPORT,
) -> None:
    """Token reconstruction: privatize the input, let each attacker guess the original tokens
    from the release (and public knowledge only), report token recovery over all tokens and
    over the replaced tokens only."""
    from rapt.attacks.recovery import reconstruct as run
    from rapt.channel.corpus import public_corpus_for, task_family
    from rapt.privacy.mechanism import tokenize_texts

    check_eta_options(eta, target_p)
    if eta is None and target_p is None:
        fail("give --eta or --target-p")
    names = _attacker_names(attacker, _options(option))
    task: str | None = public_for or input
    try:
        task_family(str(task))
    except ValueError:
        # the Bayes prior is public text; other attackers say themselves what they need
        if public_for is not None or any(n.startswith("bayes") for n in names):
            fail(f"{task!r} is not a built-in task: give --public-for TASK, the task the "
                 "public corpus must be disjoint from")
        task = None
    ds = load_data_or_fail(input, split, fmt=None if fmt == "auto" else fmt,
                           text_column=text_column, limit=limit)
    bb = load_backbone_or_fail(backbone)
    eta_v, _ = resolve_eta(bb, eta, target_p)
    rows = tokenize_texts(ds.texts, bb.tokenizer)
    corpus = None
    if task is not None and any(n != "nn" for n in names):
        corpus = public_corpus_for(task, max_rows_per_source=max_public_rows).tokenize(
            bb.tokenizer)
    opts = {"bayes_k": bayes_k, "bayes_samples": bayes_samples, **_options(option)}
    res = run(rows, bb, float(eta_v), names, public_rows=None if corpus is None else corpus.rows,
              seed=seed, mode=mode, options=opts)
    warn_if_seeded(seed)
    typer.echo(f"η = {numfmt.eta(res['eta'])}  P = {numfmt.p(res['p'])}  "
               f"({res['n_tokens']} tokens)")
    for name, r in res["attackers"].items():
        typer.echo(f"{name:>10}: recovery {r['all']:.4f} of all tokens ({r['n_all']}), "
                   f"{r['replaced']:.4f} of replaced tokens ({r['n_replaced']})")
    if json_report:
        typer.echo(json.dumps({"input": ds.source, "backbone": backbone, "target_p": target_p,
                               **res, "options": opts,
                               "public_corpus": None if corpus is None else corpus.provenance()}))


@attack_app.command("attribute")
def attribute(
    attribute: str = typer.Option("gender", help="gender | age"),
    backbone: str = typer.Option("minilm"),
    data: str = typer.Option("trustpilot"),
    train_split: str = typer.Option("a"),
    test_split: str = typer.Option("b"),
    limit: int | None = typer.Option(1000, help="examples per split, a random sample seeded "
                                     "by --seed, in file order"),
    eta: float | None = typer.Option(None, help="privatize the texts with η first"),
    artifact: Path | None = typer.Option(None, help="tuned prompt: attack its states"),
    max_length: int = typer.Option(128),
    seed: int = typer.Option(0, help="attacker's MLP init and data order"),
    noise_seed: int | None = typer.Option(
        None, help="seed the privatization noise (tests only; default: OS entropy)"),
) -> None:
    """Attribute inference: a 2-layer MLP on mean-pooled representations predicts a
    private attribute; reports accuracy, empirical privacy and the majority-class rate."""
    from rapt.attacks.attribute import attribute_attack, embedding_features, hidden_features
    from rapt.tuning.reconstruction import build_rows
    from rapt.tuning.tune import TunedPrompt

    if attribute not in ("gender", "age"):
        fail(f"--attribute must be gender or age (got {attribute!r})")
    tr = load_data_or_fail(data, train_split, limit=limit, attribute=attribute, limit_seed=seed)
    te = load_data_or_fail(data, test_split, limit=limit, attribute=attribute, limit_seed=seed)
    bb = load_backbone_or_fail(backbone)
    from rapt.artifacts import ArtifactError

    try:
        tuned = TunedPrompt.load(artifact) if artifact is not None else None
    except ArtifactError as e:
        fail(str(e))
    if tuned is not None:
        rtr, rte = tuned.encode(bb, tr.texts), tuned.encode(bb, te.texts)
    else:
        rtr = build_rows(bb.tokenizer, tr.texts, max_length)
        rte = build_rows(bb.tokenizer, te.texts, max_length)
    custom = customization(bb, eta, None, noise_seed, DEFAULT_PRIVATIZER_MODE)
    if custom.privatizer is not None:
        rtr = privatize_with_bar(custom, rtr, texts=tr.texts, measure=False)
        rte = privatize_with_bar(custom, rte, texts=te.texts, measure=False)
    feats = {"input embeddings": (embedding_features(bb, rtr), embedding_features(bb, rte)),
             "last-layer states": (hidden_features(bb, rtr, tuned),
                                   hidden_features(bb, rte, tuned))}
    typer.echo("| features | accuracy | empirical privacy | majority rate |")
    typer.echo("|---|---|---|---|")
    for name, (a, b) in feats.items():
        r = attribute_attack(a, tr.labels, b, te.labels, attribute=attribute, feature=name,
                             seed=seed)
        typer.echo(f"| {name} | {r.accuracy:.3f} | {r.empirical_privacy:.3f} | "
                   f"{r.majority_rate:.3f} |")
