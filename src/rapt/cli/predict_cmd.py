"""`rapt predict`: privatize queries locally at the artifact's level and classify them with a
tuned prompt (rapt.pipeline's Customization); reads files and prints."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import typer

from rapt.cli._app import (
    app,
    check_eta_options,
    check_out_or_fail,
    collapse_fixes,
    echo_predictions,
    echo_privacy,
    fail,
    load_backbone_or_fail,
    load_data_or_fail,
    warn_if_seeded,
)
from rapt.cli._by_kind import KindOptions, check_kind_options, echo_policy, kind_policy
from rapt.cli._output_denoiser import NO_DENOISE_HELP, for_queries
from rapt.cli._tuning import echo_channel, load_channel, privatize_with_bar
from rapt.cli.options import (
    BASE_HELP,
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
    TEXT_COLUMN,
    TEXT_PAIR_COLUMN,
    protect_for_queries,
    split_names,
    with_help,
)
from rapt.config import PRECISION_HELP, PRECISIONS


@dataclass(frozen=True)
class PredictOptions:
    """The options of `rapt predict`, one field per parameter, as typed on the command line."""

    artifact: Path
    data: str
    split: str
    limit: int | None
    text_column: str | None
    text_pair_column: str | None
    label_column: str | None
    fmt: str | None
    label_names: str | None
    label_base: int | None
    backbone: str | None
    eta: float | None
    min_p: float
    no_privacy: bool
    protect: str | None
    frequent_rank: int
    other_p: float | None
    other_eta: float | None
    personal_p: float | None
    personal_eta: float | None
    personal_rank: int | None
    out: Path | None
    noise_seed: int | None
    json_report: bool
    channel: Path | None
    allow_channel_mismatch: bool
    precision: str | None
    local: Path | None
    no_local: bool
    local_only: bool
    fused: bool
    no_denoise: bool


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
        fail(f"{artifact} was tuned on sentence pairs ('{meta['text_column']}' + "
             f"'{meta['text_pair_column']}') but {ds.source} was read as single texts; name "
             "its two text columns with --text-column and --text-pair-column")
    if has_pairs and not tuned_pairs:
        fail(f"{artifact} was tuned on single texts but {ds.source} was read as sentence pairs "
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
    "row, text, label name, gold label, probabilities by label name, and with a local model "
    "each model's (remote, local, fused) (default: print a summary and the first rows)",
    "noise_seed": "seed the query privatization noise (tests only; default: OS entropy)",
    "json_report": "print one JSON line at the end: examples, accuracy and the queries' privacy "
    "(η, measured P, inversion success); with a local model its mode and each model's accuracy",
    "channel": "the channel model the prompt was tuned with (`rapt tune --channel`): a denoiser "
    "reads the queries back before predict, a channel adapter is the backbone that reads them",
    "allow_channel_mismatch": "predict even when --channel is not the channel model the prompt "
    "was tuned with (or is missing): accuracy will suffer",
    "local": "the --out of the `rapt tune` run whose local model to use (default: ARTIFACT's, "
    "when `rapt tune` saved one beside it): its clean-query probabilities are fused with the "
    "remote ones, and the fused label is the prediction",
    "no_local": "the remote prompt alone, even when a local model lies beside ARTIFACT",
    "local_only": "the local model alone, on the clean queries: nothing is privatized, sent or "
    "run on the backbone",
    "fused": "fuse the remote and local predictions even where `rapt tune`'s verdict chose one "
    "of them alone (by default predict does what that verdict said, recorded beside ARTIFACT)",
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
    protect: str | None = protect_for_queries("the policy the prompt was tuned with, recorded "
                                              "in ARTIFACT"),
    frequent_rank: int = FREQUENT_RANK,
    other_p: float | None = OTHER_P, other_eta: float | None = OTHER_ETA,
    personal_p: float | None = PERSONAL_P, personal_eta: float | None = PERSONAL_ETA,
    personal_rank: int | None = PERSONAL_RANK,
    out: Path | None = typer.Option(None, help=_PREDICT_HELP["out"]),
    noise_seed: int | None = typer.Option(None, help=_PREDICT_HELP["noise_seed"]),
    json_report: bool = typer.Option(False, "--json-report", help=_PREDICT_HELP["json_report"]),
    channel: Path | None = typer.Option(None, "--channel", help=_PREDICT_HELP["channel"]),
    allow_channel_mismatch: bool = typer.Option(
        False, "--allow-channel-mismatch", help=_PREDICT_HELP["allow_channel_mismatch"]),
    precision: str | None = with_help(PRECISION, PRECISION_HELP + " (default: the artifact's)"),
    local: Path | None = typer.Option(None, "--local", help=_PREDICT_HELP["local"]),
    no_local: bool = typer.Option(False, "--no-local", help=_PREDICT_HELP["no_local"]),
    local_only: bool = typer.Option(False, "--local-only", help=_PREDICT_HELP["local_only"]),
    fused: bool = typer.Option(False, "--fused", help=_PREDICT_HELP["fused"]),
    no_denoise: bool = typer.Option(False, "--no-denoise", help=NO_DENOISE_HELP),
) -> None:
    """Privatize queries locally (same η as training) and predict with a tuned prompt. The data
    need no labels; accuracy is reported when every example has one. Prints η, the measured P
    and the nearest-neighbour inversion success of the privatized queries."""
    o = PredictOptions(**locals())  # the options, typed, for the stage helpers below
    from rapt.artifacts import ArtifactError
    from rapt.tuning.tune import TunedPrompt

    check_out_or_fail(out)
    check_kind_options(_kinds(o), private=not no_privacy)
    try:
        tuned = TunedPrompt.load(artifact)
    except ArtifactError as e:
        fail(str(e))
    if precision is not None:
        if precision not in PRECISIONS:
            fail(f"--precision must be one of {', '.join(PRECISIONS)} (got {precision!r})")
        tuned.config.precision = precision  # read by the model predict builds
    names, ds = _query_data(o, tuned.meta)
    _check_pairs(tuned.meta, artifact, ds)
    user = _local_model(o, tuned)
    mode = _mode(o, user)
    eta, privacy, raw, denoised = ((None, None, None, None) if mode == "local"
                                   else _remote_probs(o, tuned, ds))
    from rapt.predictions import Predictions

    probs, sources = _combine(raw, denoised, user, ds, mode)
    preds = Predictions(names or [str(i) for i in range(probs.shape[1])], probs.tolist(),
                        texts=ds.texts, text_pairs=ds.text_pairs,
                        gold=[e.label for e in ds.examples], sources=sources)
    echo_predictions(preds, out, eta=eta, fixes=collapse_fixes(
        method=tuned.config.method, private=tuned.meta.get("eta") is not None,
        dp=bool(tuned.meta.get("dp")), retune=True))
    if json_report:
        report = {"artifact": str(artifact), "examples": len(preds),
                  "accuracy": preds.accuracy(), "eta": eta, "privacy": privacy,
                  "output_denoiser": denoised is not None}
        typer.echo(json.dumps({**report, **_local_report(preds, user, mode)}))


def _remote_probs(o: PredictOptions, tuned, ds):
    """(η, the queries' privacy report, the prompt's probabilities as float64 numpy, the same
    through the output denoiser or None): the queries privatized at the artifact's level (or
    --eta / --no-privacy) and classified; corrected by the output denoiser saved in ARTIFACT
    when there is one and the queries are privatized (unless --no-denoise)."""
    import numpy as np

    from rapt.pipeline import Customization
    from rapt.pipeline.user_side import denoised_proba  # (the module's: tests replace it)
    from rapt.progress import progress_bar

    bb = load_backbone_or_fail(o.backbone or tuned.meta.get("backbone", "minilm"))
    eta = _query_eta(tuned.meta, o.eta, o.no_privacy, bb, o.artifact)
    check_eta_options(eta, None)
    den = _predict_channel(o, tuned.meta, bb)
    custom = Customization.from_artifact(bb, tuned, eta=eta, noise_seed=o.noise_seed,
                                         channel=den, kind_policy=_query_policy(o, tuned, bb,
                                                                                eta))
    if custom.privatizer is not None:
        warn_if_seeded(o.noise_seed)
    clean = rows = custom.rows(ds.texts, ds.text_pairs, queries=True)
    if custom.privatizer is not None:
        rows = privatize_with_bar(custom, rows, texts=ds.texts, text_pairs=ds.text_pairs)
        echo_privacy(custom.privacy, backbone=bb.name, err=True, min_p=o.min_p,
                     what="query set")
        echo_channel(custom.privacy, err=True)
    out_den = for_queries(o.artifact, custom.eta, o.no_denoise)
    den = None
    with progress_bar(total=len(rows), desc="classify", unit="row") as bar:
        if out_den is not None:
            den, probs = denoised_proba(custom, tuned, out_den, clean, rows, with_raw=True)
            den = np.asarray(den.detach().float().cpu().numpy(), dtype=np.float64)
            bar.update(len(rows))
        else:
            probs = custom.predict_proba(rows, progress=bar.update)
    probs = probs.detach().float().cpu().numpy()
    return eta, custom.privacy, np.asarray(probs, dtype=np.float64), den


def _kinds(o: PredictOptions) -> KindOptions:
    return KindOptions.of(o)


def _query_policy(o: PredictOptions, tuned, bb, eta: float | None):
    """The queries' noise by kind of token: --protect when given (all: uniform), else the
    policy the prompt was tuned with (its ``by_kind`` record), said on stderr."""
    from rapt.privacy.by_kind import KindPolicy

    if eta is None:
        return None
    if o.protect is not None or _kinds(o).personal:
        return kind_policy(bb, eta, _kinds(o)) or KindPolicy()
    rec = tuned.meta.get("by_kind")
    if not rec:
        return None
    policy = KindPolicy.from_record(rec)
    try:
        policy.check_against(eta)
    except ValueError as e:
        fail(f"{o.artifact} was tuned with noise by kind of token that does not fit --eta "
             f"{eta:g} ({e}); give --protect too")
    echo_policy(policy, eta, prefix="queries as the prompt was tuned (--protect overrides): ")
    return policy


def _local_model(o: PredictOptions, tuned):
    """(LocalBaseline, Fusion or None) saved beside --local or ARTIFACT, or None (--no-local,
    or none there); one error line when --local / --local-only name one that is not there,
    cannot be read, or has another number of labels than the prompt."""
    from rapt.artifacts import ArtifactError, read_local_model

    if o.no_local and (o.local is not None or o.local_only):
        fail("--no-local leaves the local model out: give it or --local / --local-only, not "
             "both")
    if o.no_local:
        return None
    where = o.local or o.artifact
    try:
        user = read_local_model(where)
    except ArtifactError as e:
        fail(f"{e}; leave it out with --no-local")
    if user is None and (o.local is not None or o.local_only):
        fail(f"no local model beside {where} ({where}.local.NOT-PRIVATE.json is written by "
             "`rapt tune`, which fits one unless --no-local); --local names the --out of "
             "that run")
    n = int(tuned.meta.get("num_labels") or 0)
    if user is not None and n and user[0].num_labels != n:
        fail(f"the local model beside {where} has {user[0].num_labels} labels, the prompt "
             f"{o.artifact} {n}: name the local model of the same run with --local")
    if user is not None and o.fused and user[1] is None:
        fail(f"--fused: the local model beside {where} has no fusion weights (too few rows "
             "were held out when tuning)")
    return user


def _mode(o: PredictOptions, user) -> str:
    """What predict does -- "remote", "local" or "fused" -- and a note saying why: the
    options when given (--no-local, --local-only, --fused), else what `rapt tune`'s verdict
    chose and recorded with the fusion weights (the remote alone without fusion weights)."""
    if o.fused and (o.local_only or o.no_local):
        fail("--fused pools the remote and local predictions: give it or --local-only / "
             "--no-local, not both")
    if user is None:
        return "remote"
    fusion = user[1]
    mode = ("local" if o.local_only else "fused" if o.fused
            else fusion.mode if fusion is not None else "remote")
    why = ("as asked" if o.local_only or o.fused else
           "no fusion weights: too few rows were held out when tuning" if fusion is None else
           f"what `rapt tune`'s verdict chose on {fusion.n_rows} held-out rows")
    say = {"local": "the local model alone, on the clean queries (nothing is privatized or "
                    "sent)",
           "fused": "the remote and local predictions fused (weights remote "
                    f"{getattr(fusion, 'remote', 0):g}, local {getattr(fusion, 'local', 0):g})",
           "remote": "the remote prediction (the local one beside it)"}[mode]
    typer.echo(f"local model ({o.local or o.artifact}.local.NOT-PRIVATE.*): {say}, {why}; "
               "--no-local: the remote alone, --local-only: the local alone, --fused: both",
               err=True)
    return mode


def _combine(raw, denoised, user, ds, mode: str):
    """(the prediction's probabilities, each model's by name or None), by ``mode``: the local
    ones alone ("local"), the fusion of the remote and local ones ("fused"), else the remote
    ones, with each model's beside them -- "remote" the prompt's as returned, "denoised" the
    same through the output denoiser (then the remote side of the fusion), "local", "fused"."""
    local_model, fusion = user if user is not None else (None, None)
    local = None if local_model is None else local_model.predict_proba(
        ds.texts, ds.text_pairs if ds.report.get("text_pair_column") else None)
    if mode == "local":
        return local, None
    remote = raw if denoised is None else denoised
    sources = {"remote": raw} if denoised is None else {"remote": raw, "denoised": denoised}
    if local is not None:
        sources["local"] = local
    if fusion is not None:
        sources["fused"] = fusion(remote, local)
    if len(sources) == 1:
        return remote, None
    return (sources["fused"] if mode == "fused" else remote), sources


def _local_report(preds, user, mode: str) -> dict:
    """--json-report's keys for the local model: which models made the prediction and each
    one's accuracy (keys added, none renamed: readers of the old report keep working)."""
    out = {"mode": "local-only" if mode == "local" else mode}
    if user is None:
        return {**out, **{f"accuracy_{s}": preds.accuracy(s) for s in preds.sources or {}}}
    fusion = user[1]
    out.update({"local_cv_accuracy": user[0].cv_accuracy,
                "chosen_at_tune": fusion.mode if fusion is not None else None,
                "fusion": fusion.to_dict() if fusion is not None and mode != "local" else None})
    for src in preds.sources or {}:
        out[f"accuracy_{src}"] = preds.accuracy(src)
    return out


def _query_data(o: PredictOptions, meta: dict):
    """(label names, dataset) of `rapt predict`: gold labels of a user file are read by the
    prompt's own label names, so that ids mean the same classes (built-ins have fixed names)."""
    from rapt.data import BUILTINS

    stored = meta.get("label_names")
    given = split_names(o.label_names)
    if given is not None and stored and list(given) != list(stored):
        fail(f"--label-names {','.join(given)} differ from the names stored in {o.artifact} "
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
    ds = load_data_or_fail(o.data, o.split, limit=o.limit, text_column=text_column,
                           label_column=label_column, label_names=names if user_file else None,
                           fmt=fmt, label_base=label_base if user_file and names else None,
                           text_pair_column=text_pair_column)
    return names, ds


def _predict_channel(o: PredictOptions, meta: dict, bb):
    """The channel model for `rapt predict`: it must be the one the prompt was tuned with
    (same fingerprint), or absent for a prompt tuned without one; otherwise refuse, unless
    --allow-channel-mismatch (then a warning)."""
    from rapt.channel.model import channel_fingerprint

    recorded = meta.get("channel") or None
    den = load_channel(o.channel, bb) if o.channel is not None else None
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
        fail(problem + ", or --allow-channel-mismatch to predict anyway")
    typer.echo(f"warning: --allow-channel-mismatch: {problem}; predicting anyway", err=True)
    return den


def _query_eta(meta: dict, eta: float | None, no_privacy: bool, bb,
               artifact: Path) -> float | None:
    """The queries' η as the artifact recorded it: --eta when given, else the training's; None
    (clear queries, announced) with --no-privacy or for a prompt tuned with --no-privacy. An
    artifact that records neither gets the default level."""
    if no_privacy:
        if eta is not None:
            fail("--no-privacy sends the queries in clear: give it or --eta, not both")
        typer.echo("warning: --no-privacy: queries are used in clear text", err=True)
        return None
    if eta is not None or meta.get("eta") is not None:
        return eta if eta is not None else float(meta["eta"])
    if meta.get("no_privacy"):
        typer.echo(f"warning: {artifact} was tuned with --no-privacy: queries are used in clear "
                   "text too (--eta privatizes them)", err=True)
        return None
    from rapt.numfmt import eta as fmt_eta
    from rapt.privacy.mechanism import calibrate_eta_public
    from rapt.privacy.rule import DEFAULT_TARGET_P

    eta = calibrate_eta_public(bb, DEFAULT_TARGET_P)
    typer.echo(f"note: {artifact} records no privacy level: queries are privatized at the "
               f"default level, P ≈ {DEFAULT_TARGET_P:g} (η = {fmt_eta(eta)}); --no-privacy sends "
               "them in clear", err=True)
    return eta
