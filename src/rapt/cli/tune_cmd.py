"""`rapt tune`, `rapt predict`, `rapt demo` and `rapt attack attribute`: thin layers over
rapt.pipeline (one Customization: privatize → rows → tune → predict), rapt.demo and
rapt.attacks.attribute. They read files, print and save; the stages live in rapt.pipeline."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typer

from rapt.cli import tune_resume
from rapt.cli._app import (
    TARGET_P_HELP,
    app,
    check_eta_options,
    check_out_or_fail,
    collapse_fixes,
    echo_collapse,
    echo_predictions,
    echo_privacy,
    eta_for_target_ep,
    load_backbone_or_fail,
    load_data_or_fail,
    privacy_level,
    warn_if_seeded,
    warn_weak_privacy,
)
from rapt.cli._app import fail as _fail
from rapt.cli.options import (
    BASE_HELP,
    ETA,
    FORMAT,
    LABEL_BASE,
    LABEL_COLUMN,
    LABEL_NAMES,
    LIMIT,
    MIN_P,
    NO_PRIVACY,
    PRECISION,
    TARGET_EP,
    TARGET_P,
    TEXT_COLUMN,
    TEXT_PAIR_COLUMN,
    parse_label_descriptions,
    split_names,
    with_default,
    with_help,
)
from rapt.config import (
    DEFAULT_PLAIN_TOKENS,
    DEFAULT_PRIVATIZER_MODE,
    LR_HELP,
    METHOD_DEFAULT_HELP,
    PRECISION_HELP,
    PRECISIONS,
    VIRTUAL_TOKENS_HELP,
)
from rapt.config import tune_default as _d
from rapt.privacy.rule import DEFAULT_TARGET_P


def _load_data(data: str, split: str, limit: int | None, text_column: str | None,
               label_column: str | None, attribute: str | None = None,
               label_names: list[str] | None = None, fmt: str | None = None,
               label_base: int | None = None, text_pair_column: str | None = None):
    return load_data_or_fail(data, split, limit=limit, text_column=text_column,
                             label_column=label_column, attribute=attribute,
                             label_names=label_names, fmt=fmt, label_base=label_base,
                             text_pair_column=text_pair_column)


_split_names = split_names


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



def _customization(bb, eta: float | None, target_p: float | None, noise_seed: int | None,
                   mode: str, encoding=None, config=None):
    """The Customization at η (or at the η that gives P ≈ target on rapt's public text sample);
    its privatizer is None when neither is given. Its noise comes from OS entropy unless
    ``noise_seed`` is given (with a warning). Bad --eta/--target-p values exit 2."""
    from rapt.pipeline import Customization

    check_eta_options(eta, target_p)
    custom = Customization.create(bb, encoding, config, eta=eta, target_p=target_p,
                                  noise_seed=noise_seed, privatizer_mode=mode)
    if custom.privatizer is not None:
        warn_if_seeded(noise_seed)
    return custom


def _check_label_words(bb, words: list[str] | None) -> None:
    """The verbalizer's words must start with distinct tokens: fail before any work with a
    fix the user can type."""
    from rapt.tuning.heads import label_token_ids

    if bb.kind != "causal" or not words:
        return
    try:
        label_token_ids(bb.tokenizer, words)
    except ValueError as e:
        _fail(f"{e}; pass distinct words with --label-words, one per label in id order, "
              "e.g. --label-words negative,positive")


def _privatize_with_bar(custom, rows, *, measure: bool = True):
    """``custom.privatize`` with a progress bar on stderr (its report in ``custom.privacy``)."""
    from rapt.progress import progress_bar

    with progress_bar(total=len(rows), desc="privatize", unit="row") as bar:
        return custom.privatize(rows, measure=measure, progress=bar.update)


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
    "(mode 0600; under DP they are not covered by ε, so only when asked; without DP they are "
    "also in the artifact's config)",
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
    no_privacy: bool = NO_PRIVACY,
    min_p: float = MIN_P,
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
    dp_epsilon: float | None = typer.Option(None, help="PromptDPSGD target ε"),
    dp_noise: float | None = typer.Option(None, help="PromptDPSGD noise multiplier σ"),
    dp_clip: float | None = typer.Option(None, help="PromptDPSGD clipping norm C (default 1)"),
    dp_delta: float | None = typer.Option(None, help="PromptDPSGD δ, below 1/N (default "
                                          "min(1e-5, 1/(10·N)) for N training rows)"),
    dp_physical_batch: int | None = typer.Option(None,
                                                 help="micro-batch size under DP (default 32)"),
    channel: Path | None = typer.Option(None, "--channel", help=_TUNE_HELP["channel"]),
    resume: bool = typer.Option(False, "--resume", help=_TUNE_HELP["resume"]),
    train_log: bool = typer.Option(False, "--train-log", help=_TUNE_HELP["train_log"]),
    precision: str = with_default(PRECISION, _d("precision")),
) -> None:
    """Privatize a dataset locally, tune a prompt on it, save it to --out (shareable; what is
    measured on your rows goes beside it). Ctrl-C saves a checkpoint; --resume goes on."""
    o = SimpleNamespace(**locals())  # the options, for the stage helpers below
    eta = _tune_eta(o)
    ds = _training_data(o)
    bb = load_backbone_or_fail(backbone)
    dp = _dp_config(o, len(ds))
    encoding = _encoding(o, bb, len(ds))
    cfg, rows = _tune_config_and_rows(o, bb, ds, dp, encoding)
    _echo_method_and_head(bb, cfg, method is None, dp is not None, bool(label_descriptions))
    custom = _customization(bb, eta, o.target_p, noise_seed, privatizer_mode, encoding, cfg)
    custom.channel = _load_channel(channel, bb) if channel is not None else None
    if dp is not None and custom.privatizer is None:
        warn_if_seeded(noise_seed)
    rows, resumed = _training_rows(o, custom, rows, ds, cfg)
    tuned = _tune_with_bar(custom, rows, ds, out=out, resume=resumed)
    _warn_training_collapse(custom, rows, ds)
    _record_meta(tuned, custom, ds, o)
    _save_tuned(tuned, out, cfg.method, custom.privacy, train_log)
    tune_resume.drop(out)


def _training_rows(o: SimpleNamespace, custom, rows, ds, cfg):
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
        return _privatize_and_echo(custom, rows, o.min_p), None
    return rows, None  # --no-privacy, announced when the options were read


def _warn_training_collapse(custom, rows, ds) -> None:
    """Warn when the model, on the training rows as trained on, answers one class or does no
    better than the majority class; the advice fits this run."""
    check = custom.training_check(rows, ds.labels, ds.label_names)
    cfg = custom.config
    echo_collapse(check["warnings"],
                  when=f"after training (predictions on {check['rows']} training rows)",
                  fixes=collapse_fixes(method=cfg.method, private=custom.privatizer is not None,
                                       dp=cfg.dp is not None))


def _record_meta(tuned, custom, ds, o: SimpleNamespace) -> None:
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


def _tune_eta(o: SimpleNamespace) -> float | None:
    """--eta, or the η of --target-ep through the shipped attack table; ``o.target_p`` becomes
    the level to calibrate later, on the loaded backbone (the default one when none is given,
    None with --no-privacy); --channel needs a level."""
    dp = o.dp_epsilon is not None or o.dp_noise is not None
    o.target_p = privacy_level(o.eta, o.target_p, o.target_ep, o.no_privacy, clear=(
        "training on clear (unprivatized) text" + ("; DP-SGD covers the trained prompt, not the "
                                                   "queries `rapt predict` sends" if dp else "")))
    if o.channel is not None and o.no_privacy:
        _fail("--channel reads privatized text back: leave out --no-privacy")
    return eta_for_target_ep(o.backbone, o.target_ep) if o.target_ep is not None else o.eta


def _privatize_and_echo(custom, rows, min_p: float):
    """Privatized rows with a bar; the privacy line, and the channel model's recovery when
    there is one (warned when this η lies outside the band it was trained on)."""
    _warn_channel_eta(custom.channel, custom.eta)
    rows = _privatize_with_bar(custom, rows)
    echo_privacy(custom.privacy, backbone=custom.backbone.name, min_p=min_p,
                 what="training data")
    _echo_channel(custom.privacy)
    return rows


def _load_channel(path: Path, bb):
    """The channel model saved by `rapt adapt` in ``path``, rebuilt on ``bb``; one error line
    when it cannot be (not a channel folder, another backbone, a causal backbone)."""
    from rapt.artifacts import ArtifactError
    from rapt.channel.load import load_channel_model

    try:
        return load_channel_model(path, bb)
    except (ArtifactError, ValueError) as e:
        _fail(f"--channel {path}: {e}")


def _warn_channel_eta(den, eta: float | None) -> None:
    """A channel model read at an η far outside the band it was trained on is a weaker
    remedy (and a weaker attacker): say so."""
    band = (den.meta.get("eta_band") or [den.meta.get("eta")]) if den is not None else None
    if not band or eta is None or any(b is None for b in band):
        return
    lo, hi = float(min(band)), float(max(band))
    if not lo / 1.25 <= eta <= hi * 1.25:
        typer.echo(f"warning: the channel model was trained at η {lo:.4g}..{hi:.4g}; this "
                   f"run privatizes at η = {eta:.4g}", err=True)


def _echo_channel(privacy: dict | None, *, err: bool = False) -> None:
    """The channel model's recovery on this release: the strongest attacker's figure."""
    ch = (privacy or {}).get("channel")
    if not ch:
        return
    typer.echo(f"channel: the channel model recovers {ch['recovery']:.1%} of the text tokens "
               f"({ch['recovery_replaced']:.1%} of the replaced ones); empirical privacy "
               f"against the strongest attacker ({ch['strongest_attacker']}) "
               f"{ch['empirical_privacy']:.3f}; post-processing, so the formal guarantee at η is "
               "unchanged", err=err)


def _training_data(o: SimpleNamespace):
    """`rapt tune`'s dataset: every example labelled, or one error line saying which flag
    fixes it."""
    ds = _load_data(o.data, o.split, o.limit, o.text_column, o.label_column,
                    label_names=_split_names(o.label_names), fmt=o.fmt, label_base=o.label_base,
                    text_pair_column=o.text_pair_column)
    if len(ds) == 0:
        _fail(f"{o.data}: no examples to train on")
    unlabelled = [e.line for e in ds.examples if e.label is None]
    if len(unlabelled) == len(ds):
        _fail(_no_labels_hint(ds))
    if unlabelled:
        _fail(f"{ds.source}: {len(unlabelled)} examples have no label (first at line "
              f"{unlabelled[0]}); tuning needs a label on every example")
    return ds


def _dp_config(o: SimpleNamespace, n_rows: int):
    from rapt.dp import dp_config_from_options

    try:
        dp = dp_config_from_options(o.dp_epsilon, o.dp_noise, o.dp_clip, o.dp_delta,
                                    o.dp_physical_batch, noise_seed=o.noise_seed)
        if dp is not None:
            dp.resolve_delta(n_rows, "--dp-delta")  # δ ≥ 1/N: an error naming the flag
        return dp
    except ValueError as e:
        _fail(str(e))


def _encoding(o: SimpleNamespace, bb, n_rows: int):
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
        _fail(str(e))


def _tune_config_and_rows(o: SimpleNamespace, bb, ds, dp, encoding):
    """(TuneConfig, clean rows) from the options; a bad value is one error line."""
    from rapt.config import tune_config

    try:
        options = {**vars(o), "dp": dp, "label_descriptions": _given_descriptions(
            o.label_descriptions, ds.label_names) if o.label_descriptions else None,
                   "label_words": o.label_words.split(",") if o.label_words else None}
        cfg = tune_config(options, kind=bb.kind, label_names=ds.label_names, dataset=o.data)
        return cfg, encoding.rows(bb.tokenizer, ds.texts, ds.text_pairs)
    except ValueError as e:
        _fail(str(e))


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


def _loss_postfix(r: dict) -> dict:
    """A step's losses for a bar: with reconstruction the task loss and L_rec apart (L_rec is
    summed over the m plain positions, ~100x the task loss), else the loss."""
    if r.get("rec_loss") is not None:
        return {"task": f"{r.get('task_loss', r['loss']):.3f}", "L_rec": f"{r['rec_loss']:.1f}"}
    return {"loss": f"{r['loss']:.3f}"}


def _tune_with_bar(custom, rows, ds, *, out: Path, resume=None):
    """``custom.tune`` with a step bar on stderr (loss, and ε under DP). Ctrl-C or SIGTERM
    stops it after the current step: the checkpoint goes to ``out`` and the command exits
    with 128 + the signal's number."""
    from rapt.progress import progress_bar

    # a resumed run's bar goes on from the step and the time it stopped at
    bar = progress_bar(desc="tune", unit="step", initial=resume.step if resume else 0,
                       elapsed=resume.seconds if resume else 0.0)
    stop = tune_resume.StopSignals()
    dp = getattr(custom.config, "dp", None)
    delta = dp.resolve_delta(len(rows)) if dp is not None else None

    def progress(r: dict) -> None:
        bar.total = r["total_steps"]
        post = _loss_postfix(r)
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
        _fail(str(e))
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
    private rows (the release's privacy report) and, with --train-log, the per-step log (under
    DP the config never holds it: it is not covered by ε)."""
    from rapt.artifacts import TRAIN_LOG, beside, write_measured, write_train_log

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


def _stored_columns(meta: dict, data: str, fmt: str | None) -> tuple[str | None, str | None]:
    """The text (and pair) columns `rapt tune` read, when ``data`` has them all; else (None,
    None), and the loader guesses as usual."""
    from rapt.data import columns_of

    want = (meta.get("text_column"), meta.get("text_pair_column"))
    present = columns_of(data, fmt)
    if want[0] is None or present is None or any(c not in present for c in want if c):
        return None, None
    return want


def _stored_label_column(meta: dict, data: str, fmt: str | None) -> str | None:
    """The label column `rapt tune` read, when ``data`` has it (predict needs no labels: a
    file without it is read unlabelled, as before)."""
    from rapt.data import columns_of

    want = meta.get("label_column")
    present = columns_of(data, fmt) if want else None
    return want if present is not None and want in present else None


def _stored_format(meta: dict, data: str) -> str | None:
    """The --format `rapt tune` was given, for a file with the training file's suffix."""
    fmt, trained_on = meta.get("format"), meta.get("dataset")
    if not fmt or not trained_on:
        return None
    return fmt if Path(trained_on).suffix.lower() == Path(data).suffix.lower() else None


def _check_pairs(meta: dict, artifact: Path, ds) -> None:
    """A prompt tuned on sentence pairs reads pairs, one tuned on single texts single texts."""
    if "text_pair_column" not in meta:  # artifacts from before pairs were recorded
        return
    tuned_pairs = meta["text_pair_column"] is not None
    has_pairs = ds.report.get("text_pair_column") is not None
    if tuned_pairs and not has_pairs:
        _fail(f"{artifact} was tuned on sentence pairs ('{meta['text_column']}' + "
              f"'{meta['text_pair_column']}') but {ds.source} was read as single texts; name "
              "its two text columns with --text-column and --text-pair-column")
    if has_pairs and not tuned_pairs:
        _fail(f"{artifact} was tuned on single texts but {ds.source} was read as sentence pairs "
              f"('{ds.report['text_column']}' + '{ds.report['text_pair_column']}'); name the "
              "text column with --text-column")


_PREDICT_HELP = {
    "text_column": "default: the column `rapt tune` read, when the file has it",
    "label_column": "gold labels, if any: accuracy is printed when every example has one "
    "(default: the column `rapt tune` read, when the file has it)",
    "no_privacy": "send clear queries, unprivatized (default: the artifact's level: its η, or "
    "clear text for a prompt tuned with --no-privacy)",
    "label_names": "default: the names stored in the artifact by `rapt tune` (give them only "
    "for an artifact without; they must match the artifact's)",
    "out": "write every prediction to this file, JSONL or CSV by its suffix (.jsonl/.csv): "
    "row, text, label name, gold label, probabilities by label name (default: print a summary "
    "and the first rows)",
    "noise_seed": "seed the query privatization noise (tests only; default: OS entropy)",
    "json_report": "print one JSON line at the end: examples, accuracy and the queries' privacy "
    "(η, measured P, inversion success)",
    "channel": "the channel model the prompt was tuned with (`rapt tune --channel`): a denoiser "
    "reads the queries back before predict, a channel adapter is the backbone that reads them",
    "allow_channel_mismatch": "predict even when --channel is not the channel model the prompt "
    "was tuned with (or is missing): accuracy will suffer",
}


@app.command()
def predict(
    artifact: Path = typer.Argument(..., help="folder written by `rapt tune`"),
    data: str = typer.Argument(..., help="dataset name or file"),
    split: str = typer.Option("dev"),
    limit: int | None = LIMIT,
    text_column: str | None = with_help(TEXT_COLUMN, _PREDICT_HELP["text_column"]),
    text_pair_column: str | None = TEXT_PAIR_COLUMN,
    label_column: str | None = with_help(LABEL_COLUMN, _PREDICT_HELP["label_column"]),
    fmt: str | None = FORMAT,
    label_names: str | None = with_help(LABEL_NAMES, _PREDICT_HELP["label_names"]),
    label_base: int | None = with_help(LABEL_BASE, BASE_HELP + "; default: as in tune"),
    backbone: str | None = typer.Option(None, help="default: the artifact's backbone"),
    eta: float | None = with_help(ETA, "default: the artifact's η (same as training)"),
    min_p: float = MIN_P,
    no_privacy: bool = with_help(NO_PRIVACY, _PREDICT_HELP["no_privacy"]),
    out: Path | None = typer.Option(None, help=_PREDICT_HELP["out"]),
    noise_seed: int | None = typer.Option(None, help=_PREDICT_HELP["noise_seed"]),
    json_report: bool = typer.Option(False, "--json-report", help=_PREDICT_HELP["json_report"]),
    channel: Path | None = typer.Option(None, "--channel", help=_PREDICT_HELP["channel"]),
    allow_channel_mismatch: bool = typer.Option(
        False, "--allow-channel-mismatch", help=_PREDICT_HELP["allow_channel_mismatch"]),
    precision: str | None = with_help(PRECISION, PRECISION_HELP + " (default: the artifact's)"),
) -> None:
    """Privatize queries locally (same η as training) and predict with a tuned prompt. The data
    need no labels; accuracy is reported when every example has one. Prints η, the measured P
    and the nearest-neighbour inversion success of the privatized queries."""
    o = SimpleNamespace(**locals())  # the options, for the stage helpers below
    from rapt.artifacts import ArtifactError
    from rapt.tuning.tune import TunedPrompt

    check_out_or_fail(out)
    try:
        tuned = TunedPrompt.load(artifact)
    except ArtifactError as e:
        _fail(str(e))
    if precision is not None:
        if precision not in PRECISIONS:
            _fail(f"--precision must be one of {', '.join(PRECISIONS)} (got {precision!r})")
        tuned.config.precision = precision  # read by the model predict builds
    names, ds = _query_data(o, tuned.meta)
    _check_pairs(tuned.meta, artifact, ds)
    bb = load_backbone_or_fail(backbone or tuned.meta.get("backbone", "minilm"))
    eta = _query_eta(tuned.meta, eta, no_privacy, bb, artifact)
    from rapt.pipeline import Customization

    check_eta_options(eta, None)
    den = _predict_channel(o, tuned.meta, bb)
    custom = Customization.from_artifact(bb, tuned, eta=eta, noise_seed=noise_seed, channel=den)
    if custom.privatizer is not None:
        warn_if_seeded(noise_seed)
    rows = custom.rows(ds.texts, ds.text_pairs, queries=True)
    if custom.privatizer is not None:
        rows = _privatize_with_bar(custom, rows)
        echo_privacy(custom.privacy, backbone=bb.name, err=True, min_p=min_p, what="query set")
        _echo_channel(custom.privacy, err=True)
    probs = custom.predict_proba(rows)
    from rapt.predictions import Predictions

    preds = Predictions(names or [str(i) for i in range(probs.shape[1])], probs.tolist(),
                        texts=ds.texts, text_pairs=ds.text_pairs,
                        gold=[e.label for e in ds.examples])
    echo_predictions(preds, out, eta=eta, fixes=collapse_fixes(
        method=tuned.config.method, private=tuned.meta.get("eta") is not None,
        dp=bool(tuned.meta.get("dp")), retune=True))
    if json_report:
        typer.echo(json.dumps({"artifact": str(artifact), "examples": len(preds),
                               "accuracy": preds.accuracy(), "eta": eta,
                               "privacy": custom.privacy}))


def _query_data(o: SimpleNamespace, meta: dict):
    """(label names, dataset) of `rapt predict`: gold labels of a user file are read by the
    prompt's own label names, so that ids mean the same classes (built-ins have fixed names)."""
    from rapt.data import BUILTINS

    stored = meta.get("label_names")
    given = _split_names(o.label_names)
    if given is not None and stored and list(given) != list(stored):
        _fail(f"--label-names {','.join(given)} differ from the names stored in {o.artifact} "
              f"({','.join(stored)}); leave --label-names out to use the stored ones")
    names = stored or given
    label_base = o.label_base if o.label_base is not None else meta.get("label_base")
    user_file = o.data not in BUILTINS
    text_column, text_pair_column = o.text_column, o.text_pair_column
    fmt = o.fmt if o.fmt is not None or not user_file else _stored_format(meta, o.data)
    if user_file and text_column is None and text_pair_column is None:
        text_column, text_pair_column = _stored_columns(meta, o.data, fmt)
    label_column = o.label_column
    if user_file and label_column is None:
        label_column = _stored_label_column(meta, o.data, fmt)
        if label_column not in (None, "label"):
            typer.echo(f"note: gold labels from column '{label_column}', the one `rapt tune` "
                       "read (--label-column names another)", err=True)
    ds = _load_data(o.data, o.split, o.limit, text_column, label_column,
                    label_names=names if user_file else None, fmt=fmt,
                    label_base=label_base if user_file and names else None,
                    text_pair_column=text_pair_column)
    return names, ds


def _predict_channel(o: SimpleNamespace, meta: dict, bb):
    """The channel model for `rapt predict`: it must be the one the prompt was tuned with
    (same fingerprint), or absent for a prompt tuned without one; otherwise refuse, unless
    --allow-channel-mismatch (then a warning)."""
    from rapt.channel.model import channel_fingerprint

    recorded = meta.get("channel") or None
    den = _load_channel(o.channel, bb) if o.channel is not None else None
    problem = None
    if recorded and den is None:
        problem = (f"{o.artifact} was tuned with the channel model {recorded.get('path')!r} "
                   f"; pass --channel {recorded.get('path') or 'FOLDER'}")
    elif den is not None and not recorded:
        problem = (f"{o.artifact} was tuned without a channel model; leave --channel out")
    elif den is not None and channel_fingerprint(den) != recorded.get("fingerprint"):
        problem = (f"--channel {o.channel} is not the channel model {o.artifact} was tuned with "
                   f"({recorded.get('path')!r}: another fingerprint); pass that one")
    if problem is None:
        return den
    if not o.allow_channel_mismatch:
        _fail(problem + ", or --allow-channel-mismatch to predict anyway")
    typer.echo(f"warning: --allow-channel-mismatch: {problem}; predicting anyway", err=True)
    return den


def _query_eta(meta: dict, eta: float | None, no_privacy: bool, bb,
               artifact: Path) -> float | None:
    """The queries' η as the artifact recorded it: --eta when given, else the training's; None
    (clear queries, announced) with --no-privacy or for a prompt tuned with --no-privacy. An
    artifact that records neither gets the default level."""
    if no_privacy:
        if eta is not None:
            _fail("--no-privacy sends the queries in clear: give it or --eta, not both")
        typer.echo("warning: --no-privacy: queries are used in clear text", err=True)
        return None
    if eta is not None or meta.get("eta") is not None:
        return eta if eta is not None else float(meta["eta"])
    if meta.get("no_privacy"):
        typer.echo(f"warning: {artifact} was tuned with --no-privacy: queries are used in clear "
                   "text too (--eta privatizes them)", err=True)
        return None
    from rapt.privacy.mechanism import calibrate_eta_public
    from rapt.privacy.rule import DEFAULT_TARGET_P

    eta = calibrate_eta_public(bb, DEFAULT_TARGET_P)
    typer.echo(f"note: {artifact} records no privacy level: queries are privatized at the "
               f"default level, P ≈ {DEFAULT_TARGET_P:g} (η = {eta:.4g}); --no-privacy sends "
               "them in clear", err=True)
    return eta


_DEMO_HELP = {
    "benchmark_config": "run benchmarks/bench_rapt.py's cpu configuration at P 0.4 (1,000 rows, "
    "500 steps, 5 seeds; about 40 min on 2 cores); other options override it",
    "max_length": "text tokens per row, plain tokens excluded (default: the length that keeps "
    "95 % of training rows whole)",
    "plain_sequences": "random plain sequences, one drawn per row (default 1)",
    "head": "auto (default: label-description on encoders, verbalizer on causal LMs; frozen, the "
    "prompt carries the task) | label-description | verbalizer | linear (a trainable probe, a "
    "control)",
    "label_descriptions": "'|'-separated, one per label (default: the built-in dataset's)",
    "seed": "data subset and first seed's init and plain tokens, not privacy noise (default 0)",
    "noise_seed": "seed the privatization noise (repeatable table, no guarantee); default: OS "
    "entropy",
    "channel": "a channel model folder from `rapt adapt` (same backbone): adds a "
    "+channel adapter row (the +privatization rows and queries read by the adapted backbone) or "
    "a +denoise-then-tune row (read back by a denoiser), and a line on how much of the "
    "privatization gap it wins back; it adds that row's runs to the time",
}


@app.command()
def demo(
    out: Path = typer.Option(Path("runs/demo"), "--out", "-o", help="output folder"),
    benchmark_config: bool = typer.Option(False, "--benchmark-config",
                                          help=_DEMO_HELP["benchmark_config"]),
    backbone: str | None = typer.Option(None, help="default minilm"),
    dataset: str | None = typer.Option(None, help="default sst2-sentences"),
    train_size: int | None = typer.Option(None, help="default 600"),
    test_size: int | None = typer.Option(None, help="default 500"),
    method: str | None = typer.Option(None, help="default prefix"),
    epochs: int | None = typer.Option(None, help="default 2"),
    lr: float | None = typer.Option(None, help=LR_HELP),
    batch_size: int | None = typer.Option(None, help="default 8"),
    max_length: int | None = typer.Option(None, help=_DEMO_HELP["max_length"]),
    plain_len: int | None = typer.Option(None, help="plain tokens m (default 40)"),
    plain_sequences: int | None = typer.Option(None, help=_DEMO_HELP["plain_sequences"]),
    num_virtual_tokens: int | None = typer.Option(None, help="default 10"),
    head: str | None = typer.Option(None, help=_DEMO_HELP["head"]),
    label_descriptions: str | None = typer.Option(None, help=_DEMO_HELP["label_descriptions"]),
    rec_reduction: str | None = typer.Option(None, help="sum (eq. 7, default) | mean"),
    target_p: float | None = with_help(TARGET_P, TARGET_P_HELP + f" (default "
                                       f"{DEFAULT_TARGET_P:g})"),
    eta: float | None = with_help(ETA, "η (overrides --target-p)"),
    min_p: float = MIN_P,
    seeds: int | None = typer.Option(None, help="paired seeds (default 3)"),
    seed: int | None = typer.Option(None, help=_DEMO_HELP["seed"]),
    noise_seed: int | None = typer.Option(None, help=_DEMO_HELP["noise_seed"]),
    channel: Path | None = typer.Option(None, "--channel", help=_DEMO_HELP["channel"]),
    precision: str | None = with_help(PRECISION, PRECISION_HELP + " (default auto: "
                                      "measured equal to fp32 in this setting)"),
) -> None:
    """RAPT end to end on a small SST-2 subset: privatize, tune (no privacy / head only /
    +privatization / +reconstruction, and +denoise-then-tune with --channel) on paired seeds,
    privatized inference, inversion attack; prints a table with CIs and verdict lines, writes a
    plot."""
    cfg = _demo_config(SimpleNamespace(**locals()))  # the options, before any other name
    from rapt.demo import format_table, make_plot, run_demo

    warn_if_seeded(noise_seed)
    bars = _SettingBars()
    try:
        res = run_demo(cfg, log=lambda s: typer.echo(s), progress=bars)
    except ValueError as e:
        _fail(str(e))
    bars.close()
    t = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    fig = make_plot(res)
    fig.savefig(out / "demo.png", dpi=120)
    res.stage_seconds["plot"] = time.perf_counter() - t
    table = format_table(res)
    (out / "results.json").write_text(json.dumps(res.as_dict(), indent=2) + "\n")
    (out / "results.md").write_text(table + "\n")
    _keep_local_unless_public(cfg.dataset, out)
    typer.echo(f"plot: {res.stage_seconds['plot']:.1f} s")
    typer.echo("")
    typer.echo(table)
    warn_weak_privacy({"eta": res.eta, "replacement_probability": res.p,
                       "inversion_success": res.inversion_success}, backbone=cfg.backbone,
                      min_p=min_p, what="demo's privatized text")
    typer.echo(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {out / 'demo.png'}")


def _keep_local_unless_public(dataset: str, out: Path) -> None:
    """The demo's folder holds accuracies and privacy measured on its data: shareable for a
    built-in public set; on a file of your own they are statistics of your rows, so the files
    are made owner-only (0600) and the folder is named as not to be shared."""
    from rapt.data import BUILTINS

    if dataset in BUILTINS:
        return
    for name in ("results.json", "results.md", "demo.png"):
        if (out / name).exists():
            (out / name).chmod(0o600)
    typer.echo(f"note: {out} holds accuracies and privacy measured on {dataset}, your own "
               "rows (files made owner-only, 0600): keep it local, do not share it", err=True)


def _demo_config(o: SimpleNamespace):
    """The DemoConfig of `rapt demo`'s options (those given override the defaults, or the
    benchmark's with --benchmark-config); a bad value is one error line."""
    from rapt.demo import DemoConfig
    from rapt.tuning.tune import HEADS

    given = {k: v for k, v in vars(o).items()
             if v is not None and k not in ("out", "benchmark_config", "min_p")}
    if o.label_descriptions:
        given["label_descriptions"] = [d.strip() for d in o.label_descriptions.split("|")]
    if o.channel is not None:
        given["channel"] = str(o.channel)  # a string in results.json
    if o.head is not None and o.head not in HEADS:
        _fail(f"--head must be one of {', '.join(HEADS)} (got {o.head!r})")
    if o.rec_reduction is not None and o.rec_reduction not in ("sum", "mean"):
        _fail(f"--rec-reduction must be sum or mean (got {o.rec_reduction!r})")
    try:
        return DemoConfig.benchmark(**given) if o.benchmark_config else DemoConfig(**given)
    except ValueError as e:
        _fail(str(e))


class _SettingBars:
    """``progress(setting, step_record)`` for run_demo: one stderr step bar per setting, the
    previous ones closed when a new setting starts."""

    def __init__(self) -> None:
        self.bars: dict[str, Any] = {}

    def __call__(self, setting: str, r: dict) -> None:
        from rapt.progress import progress_bar

        if setting not in self.bars:
            self.close()
            self.bars[setting] = progress_bar(total=r["total_steps"], desc=setting,
                                              unit="step", leave=False)
        self.bars[setting].set_postfix(_loss_postfix(r))
        self.bars[setting].update(1)

    def close(self) -> None:
        for b in self.bars.values():
            b.close()


def _register_attack() -> None:
    try:
        from rapt.cli.privatize_cmd import attack_app
    except ImportError:  # engineer A's `attack` group not there yet: nothing to attach to
        return

    @attack_app.command("attribute")
    def attribute(
        attribute: str = typer.Option("gender", help="gender | age"),
        backbone: str = typer.Option("minilm"),
        data: str = typer.Option("trustpilot"),
        train_split: str = typer.Option("a"),
        test_split: str = typer.Option("b"),
        limit: int | None = typer.Option(1000, help="examples per split"),
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
            _fail(f"--attribute must be gender or age (got {attribute!r})")
        tr = _load_data(data, train_split, limit, None, None, attribute=attribute)
        te = _load_data(data, test_split, limit, None, None, attribute=attribute)
        bb = load_backbone_or_fail(backbone)
        from rapt.artifacts import ArtifactError

        try:
            tuned = TunedPrompt.load(artifact) if artifact is not None else None
        except ArtifactError as e:
            _fail(str(e))
        if tuned is not None:
            rtr, rte = tuned.encode(bb, tr.texts), tuned.encode(bb, te.texts)
        else:
            rtr = build_rows(bb.tokenizer, tr.texts, max_length)
            rte = build_rows(bb.tokenizer, te.texts, max_length)
        custom = _customization(bb, eta, None, noise_seed, DEFAULT_PRIVATIZER_MODE)
        if custom.privatizer is not None:
            rtr = _privatize_with_bar(custom, rtr, measure=False)
            rte = _privatize_with_bar(custom, rte, measure=False)
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


_register_attack()
