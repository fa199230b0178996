"""`rapt tune`: a thin layer over rapt.pipeline (one Customization: privatize → rows → tune).
It reads files, prints and saves; the stages live in rapt.pipeline."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import typer

from rapt import numfmt
from rapt.cli import tune_resume
from rapt.cli._app import (
    app,
    collapse_fixes,
    echo_collapse,
    echo_privacy,
    eta_for_target_ep,
    fail,
    load_backbone_or_fail,
    load_data_or_fail,
    privacy_level,
    warn_if_seeded,
)
from rapt.cli._by_kind import KindOptions, check_kind_options, with_defaults
from rapt.cli._local import LOCAL_HELP, held_out, tune_user_side, without
from rapt.cli._output_denoiser import (
    OUTPUT_DENOISER_HELP,
    after_tune,
    check_output_denoiser,
)
from rapt.cli._tuning import (
    customization,
    echo_channel,
    load_channel,
    loss_postfix,
    privatize_with_bar,
)
from rapt.cli.options import (
    ETA,
    FORMAT,
    FREQUENT_RANK,
    LABEL_BASE,
    LABEL_COLUMN,
    LABEL_NAMES,
    LIMIT,
    MIN_P,
    NO_PRIVACY,
    OTHER_ETA,
    OTHER_P,
    PERSONAL_ETA,
    PERSONAL_P,
    PERSONAL_RANK,
    PRECISION,
    PROTECT,
    TARGET_EP,
    TARGET_P,
    TEXT_COLUMN,
    TEXT_PAIR_COLUMN,
    parse_label_descriptions,
    split_names,
    with_default,
)
from rapt.config import (
    DEFAULT_PLAIN_TOKENS,
    DEFAULT_PRIVATIZER_MODE,
    LR_HELP,
    METHOD_DEFAULT_HELP,
    VIRTUAL_TOKENS_HELP,
)
from rapt.config import tune_default as _d
from rapt.guarantee import DP_EPSILON_HELP, DP_NOISE_HELP


@dataclass(frozen=True)
class TuneOptions:
    """The options of `rapt tune`, one field per parameter, as typed on the command line
    (unresolved: ``eta`` None unless --eta; ``label_names`` the comma-separated text)."""

    data: str
    out: Path
    backbone: str
    method: str | None
    split: str
    limit: int | None
    text_column: str | None
    text_pair_column: str | None
    label_column: str | None
    fmt: str | None
    label_names: str | None
    label_base: int | None
    eta: float | None
    target_p: float | None
    target_ep: float | None
    no_privacy: bool
    min_p: float
    protect: str | None
    frequent_rank: int
    other_p: float | None
    other_eta: float | None
    personal_p: float | None
    personal_eta: float | None
    personal_rank: int | None
    reconstruction: bool
    plain_len: int
    plain_tokens: str | None
    plain_sequences: int
    num_virtual_tokens: int | None
    prefix_projection: bool
    lr: float | None
    epochs: int
    batch_size: int
    max_length: int
    rec_hidden: int
    rec_vocab_size: int
    rec_weight: float
    rec_reduction: str
    head: str
    label_descriptions: str | None
    head_temperature: float
    freeze_prompt: bool
    label_words: str | None
    seed: int
    noise_seed: int | None
    privatizer_mode: str
    dp_epsilon: float | None
    dp_noise: float | None
    dp_clip: float | None
    dp_delta: float | None
    dp_physical_batch: int | None
    channel: Path | None
    resume: bool
    train_log: bool
    precision: str
    local: bool
    output_denoiser: bool


# Long help texts of `rapt tune`, out of its signature.
_TUNE_HELP = {
    "data": "dataset name (sst2, sst2-sentences, trec, cb, trustpilot) or a CSV/TSV/JSONL file",
    "reconstruction": "RAPT privatized token reconstruction: m plain tokens per row and a second "
    "loss, about 2x the step time; no accuracy gain measured at our scale (see "
    "benchmarks/results/rapt.md), so off by default",
    "rec_reduction": "L_rec over the m plain positions: sum (eq. 7) | mean",
    "head": "auto: on causal LMs the verbalizer (label words); on encoders the label-description "
    "head when there are label descriptions (--label-descriptions, or a built-in dataset's), "
    "else linear; the head chosen is printed | label-description | verbalizer (both frozen: "
    "the prompt carries the task) | linear (a trainable probe)",
    "label_descriptions": "'|'-separated NAME=description pairs, one per label in any order, "
    "e.g. 'neg=a negative review|pos=a positive review' (plain descriptions without NAME= are "
    "read in label id order, printed; default: the built-in dataset's)",
    "freeze_prompt": "control: keep the prompt at its init, train only a trainable head",
    "label_words": "causal LMs: comma-separated verbalizer words, one per label (default: the "
    "label names, with a leading space or without, whichever starts with distinct tokens)",
    "resume": "continue the run into --out stopped by Ctrl-C / SIGTERM, on the privatized rows "
    "saved with its checkpoint (OUT.resume.NOT-PRIVATE.pt, beside the folder); the other "
    "options must be the same",
    "train_log": "write the per-step losses to OUT.train-log.NOT-PRIVATE.json beside the folder "
    "(mode 0600; measured on your rows, and under DP not covered by ε, so only when asked: "
    "the --out folder never holds them)",
    "seed": "init, data order and plain tokens (not privacy noise)",
    "noise_seed": "seed the privacy noise (dχ and DP-SGD): tests/benchmarks only, voids the "
    "guarantee; default: OS entropy",
    "channel": "a channel model folder from `rapt adapt` (same backbone). A channel adapter "
    "(`rapt adapt --kind adapter`, the better remedy in benchmarks/results/channel.md) makes the "
    "backbone read privatized rows as clean text; a denoiser (denoise-then-tune) reads the rows "
    "back before tuning (text positions only) and is also an attacker at that η, whose recovery "
    "is printed. Both are post-processing: the formal guarantee is unchanged",
}


@app.command()
def tune(
    data: str = typer.Argument(..., help=_TUNE_HELP["data"]),
    out: Path = typer.Option(Path("runs/prompt"), "--out", "-o", help="artifact folder"),
    backbone: str = typer.Option("minilm", help="backbone name or path"),
    method: str | None = typer.Option(
        None, help=f"prompt | prefix | lora | full ({METHOD_DEFAULT_HELP})"),
    split: str = typer.Option("train"),
    limit: int | None = LIMIT,
    text_column: str | None = TEXT_COLUMN,
    text_pair_column: str | None = TEXT_PAIR_COLUMN,
    label_column: str | None = LABEL_COLUMN,
    fmt: str | None = FORMAT,
    label_names: str | None = LABEL_NAMES,
    label_base: int | None = LABEL_BASE,
    eta: float | None = ETA,
    target_p: float | None = TARGET_P,
    target_ep: float | None = TARGET_EP,
    no_privacy: bool = NO_PRIVACY, min_p: float = MIN_P,
    protect: str | None = PROTECT, frequent_rank: int = FREQUENT_RANK,
    other_p: float | None = OTHER_P, other_eta: float | None = OTHER_ETA,
    personal_p: float | None = PERSONAL_P, personal_eta: float | None = PERSONAL_ETA,
    personal_rank: int | None = PERSONAL_RANK,
    reconstruction: bool = typer.Option(_d("reconstruction"), help=_TUNE_HELP["reconstruction"]),
    plain_len: int = typer.Option(DEFAULT_PLAIN_TOKENS, help="number of plain tokens m"),
    plain_tokens: str | None = typer.Option(None, help="plain tokens as text (default: random)"),
    plain_sequences: int = typer.Option(1, help="random plain sequences, one drawn per row"),
    num_virtual_tokens: int | None = typer.Option(None, help=VIRTUAL_TOKENS_HELP),
    prefix_projection: bool = typer.Option(_d("prefix_projection")),
    lr: float | None = typer.Option(None, help=LR_HELP),
    epochs: int = typer.Option(_d("epochs")),
    batch_size: int = typer.Option(_d("batch_size")),
    max_length: int = typer.Option(_d("max_length")),
    rec_hidden: int = typer.Option(_d("rec_hidden")),
    rec_vocab_size: int = typer.Option(_d("rec_vocab_size")),
    rec_weight: float = typer.Option(_d("rec_weight")),
    rec_reduction: str = typer.Option(_d("rec_reduction"), help=_TUNE_HELP["rec_reduction"]),
    head: str = typer.Option(_d("head"), help=_TUNE_HELP["head"]),
    label_descriptions: str | None = typer.Option(None, help=_TUNE_HELP["label_descriptions"]),
    head_temperature: float = typer.Option(_d("head_temperature"),
                                           help="label-description head: cos / T"),
    freeze_prompt: bool = typer.Option(_d("freeze_prompt"), help=_TUNE_HELP["freeze_prompt"]),
    label_words: str | None = typer.Option(None, help=_TUNE_HELP["label_words"]),
    seed: int = typer.Option(_d("seed"), help=_TUNE_HELP["seed"]),
    noise_seed: int | None = typer.Option(None, help=_TUNE_HELP["noise_seed"]),
    privatizer_mode: str = typer.Option(DEFAULT_PRIVATIZER_MODE,
                                        help="exact | fast (certified exact) | annoy"),
    dp_epsilon: float | None = typer.Option(None, help=DP_EPSILON_HELP),
    dp_noise: float | None = typer.Option(None, help=DP_NOISE_HELP),
    dp_clip: float | None = typer.Option(None, help="PromptDPSGD clipping norm C (default 1)"),
    dp_delta: float | None = typer.Option(None, help="PromptDPSGD δ, below 1/N (default "
                                          "min(1e-5, 1/(10·N)) for N training rows)"),
    dp_physical_batch: int | None = typer.Option(None,
                                                 help="micro-batch size under DP (default 32)"),
    channel: Path | None = typer.Option(None, "--channel", help=_TUNE_HELP["channel"]),
    resume: bool = typer.Option(False, "--resume", help=_TUNE_HELP["resume"]),
    train_log: bool = typer.Option(False, "--train-log", help=_TUNE_HELP["train_log"]),
    precision: str = with_default(PRECISION, _d("precision")),
    local: bool = typer.Option(True, "--local/--no-local", help=LOCAL_HELP),
    output_denoiser: bool = typer.Option(False, "--output-denoiser", help=OUTPUT_DENOISER_HELP),
) -> None:
    """Privatize a dataset locally, tune a prompt on it, save it to --out (shareable; what is
    measured on your rows goes beside it). Ctrl-C saves a checkpoint; --resume goes on."""
    o = _with_kind_defaults(TuneOptions(**locals()))  # typed, for the stage helpers below
    eta, target_p = _privacy_level(o)
    everything = _training_data(o)
    held = held_out(everything.labels, seed, local)
    ds = without(everything, held, seed)  # the rows the prompt trains on
    bb = load_backbone_or_fail(backbone)
    dp, delta = _dp_config(o, len(ds))
    encoding = _encoding(o, bb, len(ds))
    cfg, rows = _tune_config_and_rows(o, bb, ds, dp, encoding)
    _echo_method_and_head(bb, cfg, method is None, dp is not None, bool(label_descriptions))
    custom = _customization(o, bb, eta, target_p, encoding, cfg, dp is not None)
    rows, resumed = _training_rows(o, custom, rows, ds, cfg)
    tuned = _tune_with_bar(custom, rows, ds, out=out, resume=resumed, delta=delta)
    _warn_training_collapse(custom, rows, ds)
    _record_meta(tuned, custom, ds, o)
    _save_tuned(tuned, out, cfg.method, custom.privacy, train_log)
    tune_resume.drop(out)
    _user_side(custom, tuned, everything, held, o)


def _customization(o: TuneOptions, bb, eta, target_p, encoding, cfg, dp: bool):
    """The run's Customization: its privatizer (by kind of token under --protect) and channel
    model."""
    custom = customization(bb, eta, target_p, o.noise_seed, o.privatizer_mode, encoding, cfg,
                           kinds=_kinds(o))
    custom.channel = load_channel(o.channel, bb) if o.channel is not None else None
    if dp and custom.privatizer is None:
        warn_if_seeded(o.noise_seed)
    return custom


def _with_kind_defaults(o: TuneOptions) -> TuneOptions:
    """The kind options as rapt's defaults fill them in (:func:`with_defaults`), every one
    copied back (a default added there reaches tune without a change here)."""
    k = with_defaults(_kinds(o), private=not o.no_privacy)
    return dataclasses.replace(o, **dataclasses.asdict(k))


def _kinds(o: TuneOptions) -> KindOptions:
    return KindOptions.of(o)


def _user_side(custom, tuned, everything, held, o: TuneOptions) -> None:
    """Once the prompt is saved: its output denoiser (--output-denoiser), then the local model
    (--local), whose held-out remote probabilities are then the denoised ones, as `rapt
    predict` fuses them."""
    den = after_tune(custom, tuned, o)
    if o.local:
        tune_user_side(custom, everything, held, o.out, o.seed, denoiser=den)


def _training_rows(o: TuneOptions, custom, rows, ds, cfg):
    """(rows to tune on, the stopped run to continue or None): with --resume the privatized
    rows saved with its checkpoint (never a second privatization of the same data), else the
    rows privatized here, or clean ones with a warning."""
    if o.resume:
        saved = tune_resume.load(o.out, cfg, ds.labels, custom.eta)
        custom.privacy = saved.privacy
        typer.echo(f"resuming the run stopped at step {saved.step} "
                   f"({tune_resume.path_in(o.out)}): the privatized rows saved with it are "
                   "reused, not privatized again", err=True)
        if saved.privacy:
            echo_privacy(saved.privacy, backbone=custom.backbone.name, min_p=o.min_p,
                         what="training data", err=True)
        return saved.rows, saved
    if tune_resume.path_in(o.out).is_file():
        typer.echo(f"note: {tune_resume.path_in(o.out)} is the checkpoint of a stopped run; "
                   "--resume continues it (this run starts afresh and replaces it)", err=True)
    if custom.privatizer is not None:
        return _privatize_and_echo(custom, rows, ds, o.min_p), None
    return rows, None  # --no-privacy, announced when the options were read


def _warn_training_collapse(custom, rows, ds) -> None:
    """Warn when the model, on the training rows as trained on, answers one class or does no
    better than the majority class; the advice fits this run."""
    from rapt.pipeline.customization import COLLAPSE_CHECK_ROWS
    from rapt.progress import progress_bar

    with progress_bar(total=min(len(rows), COLLAPSE_CHECK_ROWS), unit="row",
                      desc="check: the model on its training rows") as bar:
        check = custom.training_check(rows, ds.labels, ds.label_names, progress=bar.update)
    cfg = custom.config
    echo_collapse(check["warnings"],
                  when=f"after training (predictions on {check['rows']} training rows)",
                  fixes=collapse_fixes(method=cfg.method, private=custom.privatizer is not None,
                                       dp=cfg.dp is not None))


def _record_meta(tuned, custom, ds, o: TuneOptions) -> None:
    """What `rapt predict` reads back from the artifact: label names and base, the columns
    read (given or detected), the training data's privatization (its level: what was measured
    on the rows goes beside the folder) and channel model."""
    from rapt.artifacts import shareable_privacy

    if ds.report.get("label_base") is not None:
        tuned.meta["label_base"] = ds.report["label_base"]
    tuned.meta.update({**custom.privacy_meta(), "label_names": ds.label_names,
                       "no_privacy": bool(o.no_privacy), "dataset": str(o.data),
                       "text_column": ds.report.get("text_column"),
                       "text_pair_column": ds.report.get("text_pair_column"),
                       "label_column": ds.report.get("label_source")
                       if ds.report.get("text_column") else None,
                       "format": o.fmt})
    tuned.meta["privacy"] = shareable_privacy(custom.privacy, custom.backbone.name)
    if tuned.meta.get("channel"):
        tuned.meta["channel"]["path"] = str(o.channel)


def _privacy_level(o: TuneOptions) -> tuple[float | None, float | None]:
    """(η, target P): --eta, or the η of --target-ep through the shipped attack table; the
    target P is the level to calibrate later, on the loaded backbone (the default one when none
    is given, None with --no-privacy); --channel needs a level."""
    dp = o.dp_epsilon is not None or o.dp_noise is not None
    target_p = privacy_level(o.eta, o.target_p, o.target_ep, o.no_privacy, protect=o.protect,
                             clear=(
        "training on clear (unprivatized) text" + ("; DP-SGD covers the trained prompt, not the "
                                                   "queries `rapt predict` sends" if dp else "")))
    if o.channel is not None and o.no_privacy:
        fail("--channel reads privatized text back: leave out --no-privacy")
    check_kind_options(_kinds(o), private=not o.no_privacy)
    eta = eta_for_target_ep(o.backbone, o.target_ep) if o.target_ep is not None else o.eta
    return eta, target_p


def _privatize_and_echo(custom, rows, ds, min_p: float):
    """Privatized rows (built from ``ds``'s texts) with a bar; the privacy line, and the
    channel model's recovery when there is one (warned when this η lies outside the band it
    was trained on)."""
    _warn_channel_eta(custom.channel, custom.eta)
    rows = privatize_with_bar(custom, rows, texts=ds.texts, text_pairs=ds.text_pairs)
    echo_privacy(custom.privacy, backbone=custom.backbone.name, min_p=min_p,
                 what="training data")
    echo_channel(custom.privacy)
    return rows



def _warn_channel_eta(den, eta: float | None) -> None:
    """A channel model read at an η far outside the band it was trained on is a weaker
    remedy (and a weaker attacker): say so."""
    band = (den.meta.get("eta_band") or [den.meta.get("eta")]) if den is not None else None
    if not band or eta is None or any(b is None for b in band):
        return
    lo, hi = float(min(band)), float(max(band))
    if not lo / 1.25 <= eta <= hi * 1.25:
        typer.echo(f"warning: the channel model was trained at η "
                   f"{numfmt.eta(lo)}..{numfmt.eta(hi)}; this run privatizes at η = "
                   f"{numfmt.eta(eta)}", err=True)



def _training_data(o: TuneOptions):
    """`rapt tune`'s dataset: every example labelled, or one error line saying which flag
    fixes it."""
    ds = load_data_or_fail(o.data, o.split, limit=o.limit, text_column=o.text_column,
                           label_column=o.label_column, label_names=split_names(o.label_names),
                           fmt=o.fmt, label_base=o.label_base,
                           text_pair_column=o.text_pair_column, limit_seed=o.seed)
    if len(ds) == 0:
        fail(f"{o.data}: no examples to train on")
    unlabelled = [e.line for e in ds.examples if e.label is None]
    if len(unlabelled) == len(ds):
        fail(_no_labels_hint(ds))
    if unlabelled:
        fail(f"{ds.source}: {len(unlabelled)} examples have no label (first at line "
             f"{unlabelled[0]}); tuning needs a label on every example")
    return ds


def _no_labels_hint(ds) -> str:
    """Why a file gave no labels and which flag fixes it."""
    fmt = ds.report.get("format")
    if fmt in ("csv", "tsv", "jsonl"):
        what = "column" if fmt != "jsonl" else "field"
        others = sorted(ds.examples[0].attrs) if ds.examples else []
        return (f"{ds.source}: no label {what} ('label' not found"
                + (f"; other {what}s: {', '.join(others)}" if others else "")
                + "); name it with --label-column")
    return (f"{ds.source}: read as unlabelled text (format {fmt}); for 'sentence@label' lines "
            "pass --format text-at-label, for 'LABEL sentence' lines --format label-text")


def _dp_config(o: TuneOptions, n_rows: int):
    """(the DP config or None, its δ for ``n_rows`` or None)."""
    from rapt.dp import dp_config_from_options

    try:
        dp = dp_config_from_options(o.dp_epsilon, o.dp_noise, o.dp_clip, o.dp_delta,
                                    o.dp_physical_batch, noise_seed=o.noise_seed)
        if dp is None:
            return None, None
        return dp, dp.resolve_delta(n_rows, "--dp-delta")  # δ ≥ 1/N: an error naming the flag
    except ValueError as e:
        fail(str(e))


def _encoding(o: TuneOptions, bb, n_rows: int):
    """Rows of --max-length ids, with the plain tokens k under --reconstruction (given as
    text, or random: --plain-sequences of them, one drawn per row)."""
    from rapt.pipeline import Encoding

    if not o.reconstruction:
        return Encoding(o.max_length)
    try:
        if o.plain_tokens:
            return Encoding.parsed(bb.tokenizer, o.max_length, o.plain_tokens)
        return Encoding.sampled(bb.tokenizer, o.max_length, o.plain_len, o.plain_sequences,
                                n_rows, o.seed)
    except ValueError as e:
        fail(str(e))


def _tune_config_and_rows(o: TuneOptions, bb, ds, dp, encoding):
    """(TuneConfig, clean rows) from the options; a bad value is one error line."""
    from rapt.config import tune_config

    try:
        options = {**dataclasses.asdict(o), "dp": dp, "label_descriptions": _given_descriptions(
            o.label_descriptions, ds.label_names) if o.label_descriptions else None,
                   "label_words": o.label_words.split(",") if o.label_words else None}
        cfg = tune_config(options, kind=bb.kind, label_names=ds.label_names, dataset=o.data)
        check_output_denoiser(o.output_denoiser, o.no_privacy, bb.kind, cfg)
        if cfg.dp is not None:  # a guarantee that says nothing is refused before any work
            from rapt.dp.accounting import check_plan
            from rapt.tuning.tune import planned_steps

            check_plan(cfg.dp, len(ds), planned_steps(cfg, len(ds)), cfg.batch_size,
                       ("--dp-delta", "--dp-noise"))
        return cfg, encoding.rows(bb.tokenizer, ds.texts, ds.text_pairs)
    except ValueError as e:
        fail(str(e))


def _check_label_words(bb, words: list[str] | None) -> None:
    """The verbalizer's words must start with distinct tokens: fail before any work with a
    fix the user can type."""
    from rapt.tuning.heads import label_token_ids

    if bb.kind != "causal" or not words:
        return
    try:
        label_token_ids(bb.tokenizer, words)
    except ValueError as e:
        fail(f"{e}; pass distinct words with --label-words, one per label in id order, "
             "e.g. --label-words negative,positive")


def _given_descriptions(text: str, names: list[str]) -> list[str]:
    """--label-descriptions in label id order (NAME=description pairs, or plain descriptions
    in id order); how they were matched is printed, since the ids' order is the data's."""
    descs, by_name = parse_label_descriptions(text, names)
    if not by_name:
        typer.echo("note: --label-descriptions without NAME= are read in label id order: "
                   + "; ".join(f"{n} = {d!r}" for n, d in zip(names, descs, strict=True))
                   + " (write NAME=description to match them by name)", err=True)
    return descs


def _echo_method_and_head(bb, cfg, default_method: bool, dp: bool,
                          given_descriptions: bool) -> None:
    """The method (when it is the default) and the head the run uses, and for --head auto why;
    a verbalizer's label words are checked before any work."""
    from rapt.tuning.tune import resolve_head

    if default_method:
        typer.echo(f"method: {cfg.method} (default{' under DP' if dp else ''}; --method "
                   "prompt | prefix | lora | full)", err=True)
    head = resolve_head(bb.kind, cfg)
    if head == "verbalizer":
        _check_label_words(bb, cfg.label_words)
    why = ""
    if cfg.head == "auto":
        why = {"verbalizer": " (auto: a causal LM scores its label words)",
               "label-description": " (auto: label descriptions "
               + ("given" if given_descriptions else "of the built-in dataset") + ")",
               "linear": " (auto: no label descriptions for this data; --label-descriptions "
               "'NAME=text|...' gives the frozen label-description head)"}[head]
    typer.echo(f"head: {head}{why}", err=True)



def _tune_with_bar(custom, rows, ds, *, out: Path, resume=None, delta: float | None = None):
    """``custom.tune`` with a step bar on stderr (loss, and ε at ``delta`` under DP). Ctrl-C or
    SIGTERM stops it after the current step: the checkpoint goes to ``out`` and the command
    exits with 128 + the signal's number."""
    from rapt.progress import progress_bar

    # a resumed run's bar goes on from the step and the time it stopped at
    bar = progress_bar(desc="tune", unit="step", initial=resume.step if resume else 0,
                       elapsed=resume.seconds if resume else 0.0)
    stop = tune_resume.StopSignals()

    def progress(r: dict) -> None:
        bar.total = r["total_steps"]
        post = loss_postfix(r)
        if "epsilon" in r:  # 3 significant digits: a small ε must not print as 0.00
            post["ε"] = f"{r['epsilon']:.3g}"
            post["δ"] = f"{delta:.3g}"
        bar.set_postfix(post)
        bar.update(1)

    try:
        with stop:
            tuned = custom.tune(rows, ds.labels, len(ds.label_names), progress=progress,
                                should_stop=stop.should_stop, checkpoint=stop.checkpoint,
                                resume=resume.state if resume is not None else None)
    except ValueError as e:
        bar.close()
        fail(str(e))
    bar.close()
    if resume is not None:  # the time before the stop counts too
        tuned.meta["train_seconds"] = round(resume.seconds + tuned.meta["train_seconds"], 3)
    if tuned.meta.get("stopped"):
        _save_stopped(custom, rows, ds, out, stop, tuned.meta)
    return tuned


def _save_stopped(custom, rows, ds, out: Path, stop, meta: dict) -> None:
    """A stopped run: write its checkpoint (if a step was made) and exit with the signal's
    code."""
    if stop.latest is None:
        typer.echo("stopped before the first step: nothing to save", err=True)
        raise typer.Exit(stop.exit_code)
    path = tune_resume.save(out, stop.latest, custom.config, rows, ds.labels, custom.privacy,
                            custom.eta, meta["train_seconds"])
    typer.echo(f"stopped at step {meta['steps']} of {meta['total_steps']}; checkpoint saved to "
               f"{path}; continue with the same command and --resume", err=True)
    raise typer.Exit(stop.exit_code)


def _save_tuned(tuned, out: Path, method: str, measured: dict | None, train_log: bool) -> None:
    """Save the artifact, which may be shared; beside it, mode 0600, what was measured on the
    private rows (the release's privacy report) and, with --train-log, the per-step log. The
    folder never holds that log, with DP or without: its losses are measured on your rows
    (under DP outside ε), and the folder is what one hands on."""
    from rapt.artifacts import TRAIN_LOG, beside, write_measured, write_train_log

    tuned.meta.pop("history", None)  # tuned.train_log keeps it, for --train-log
    tuned.save(out)
    msg = f"saved the {method}-tuned model to {out}"
    if tuned.meta.get("dp"):
        msg += f" (ε = {tuned.meta['dp']['epsilon']:.3g}, δ = {tuned.meta['dp']['delta']:.3g})"
    local = []
    legacy = out / TRAIN_LOG  # where rapt wrote it before: out of the folder one shares
    if legacy.is_file():
        legacy.chmod(0o600)
        legacy.replace(beside(out, TRAIN_LOG))
        local.append(str(beside(out, TRAIN_LOG)))
    if measured:
        local.append(str(write_measured(out, {"privacy": measured})))
    if train_log:
        local.append(str(write_train_log(out, tuned.train_log)))
    if local:
        msg += (f"; kept beside it, not to be shared (measured on your rows"
                f"{', not covered by ε' if tuned.meta.get('dp') else ''}): "
                f"{', '.join(dict.fromkeys(local))}")
    typer.echo(msg)
