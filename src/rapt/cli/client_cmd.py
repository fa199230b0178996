"""`rapt client ...`: the user side: privatize locally, then upload, tune, follow a job and
predict through the service."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path

import typer

from rapt import numfmt
from rapt.cli._app import (
    TEXT_PAIR_OPT,
    app,
    check_out_or_fail,
    collapse_fixes,
    echo_collapse,
    echo_data_notes,
    echo_predictions,
    echo_privacy,
    eta_for_target_ep,
    fail,
    flag_words,
    no_loading_bars,
    privacy_level,
    sub_app,
)
from rapt.cli._by_kind import (
    KindOptions,
    check_kind_options,
    echo_policy,
    kind_policy,
    with_defaults,
)
from rapt.cli.options import (
    ETA,
    FREQUENT_RANK,
    LABEL_COLUMN,
    LABEL_NAMES,
    MIN_P,
    NO_PRIVACY,
    OTHER_ETA,
    OTHER_P,
    PERSONAL_ETA,
    PERSONAL_P,
    PERSONAL_RANK,
    PROTECT,
    TARGET_EP,
    TARGET_P,
    TEXT_COLUMN,
    protect_for_queries,
    split_names,
    with_help,
)
from rapt.config import (
    DEFAULT_PLAIN_TOKENS,
    LR_HELP,
    METHOD_DEFAULT_HELP,
    VIRTUAL_TOKENS_HELP,
)
from rapt.config import tune_default as _d
from rapt.guarantee import DP_EPSILON_HELP, DP_NOISE_HELP
from rapt.privacy.rule import DEFAULT_MIN_P

client_app = sub_app(help="User side: privatize locally, then upload / tune / predict.",
                     no_args_is_help=True)
app.add_typer(client_app, name="client")

URL_OPT = typer.Option(None, "--url", help="service URL (env RAPT_URL)")
KEY_OPT = typer.Option(None, "--key", help="API key (env RAPT_API_KEY)")
ETA_OPT = ETA
TARGET_P_OPT = TARGET_P
TARGET_EP_OPT = TARGET_EP
JSON_OPT = typer.Option(False, "--json-report", help="also print one JSON line with the privacy "
                        "report (η, measured P, nearest-neighbour inversion success); it stays "
                        "on this machine")
NOPRIV_OPT = with_help(NO_PRIVACY, "send token ids unprivatized (the default is noise by kind "
                       "of token, rare words at P ≈ 0.7; P ≈ 0.6 on every token under "
                       "--protect all)")
NOPRIV_PREDICT_OPT = with_help(NO_PRIVACY, "send the queries' token ids unprivatized (the "
                               "default is the η recorded on the service with the prompt's "
                               "training data, else P ≈ 0.6)")
BB_OPT = typer.Option("minilm", "--backbone",
                      help="local copy of the service's backbone (tokenizer + embeddings)")
PAD_OPT = typer.Option(None, "--pad-to-bucket", min=1, help="pad every row sent to a multiple "
                       "of this many tokens, so the wire shows length buckets, not lengths "
                       "(the service strips the padding: the provider still learns lengths)")
MIN_P_OPT = MIN_P
PROTECT_PREDICT_OPT = protect_for_queries("the policy declared with the prompt's training data")
NO_LOCAL_OPT = typer.Option(False, "--no-local", help="no local model: the privatized model "
                            "alone (nothing else changes in what is sent)")
LOCAL_OUT_OPT = typer.Option(
    None, "--local-out", help="where --wait saves the local model on this machine: files "
    "PATH.local.NOT-PRIVATE.json / .safetensors (0600; statistics of your clean rows, never "
    "sent, never share them). Default: $RAPT_CACHE/local/<service>-<prompt> (RAPT_CACHE "
    "defaults to ~/.cache/rapt); `client predict` finds it there, or where it was recorded")


def _client(url, key, backbone="minilm", eta=None, no_privacy=False, seed=None,
            min_p=DEFAULT_MIN_P,
            target_p=None, plain_tokens=DEFAULT_PLAIN_TOKENS, pad_to_bucket=None):
    """The client of a command: bars on stderr while rows are privatized and sent."""
    from rapt.client.client import ClientError, RaptClient

    no_loading_bars()
    try:
        with _privacy_warnings():
            return RaptClient(url, key, backbone=backbone, eta=eta, target_p=target_p,
                              no_privacy=no_privacy, seed=seed, min_p=min_p,
                              plain_tokens=plain_tokens, pad_to_bucket=pad_to_bucket,
                              progress=True)
    except ClientError as e:
        fail(str(e))


def _kind_policy(c, kinds: KindOptions, prompt_id: str | None = None) -> None:
    """Give the client the by-kind policy of the options at the η it privatizes with (a
    prompt's queries: --eta or the prompt's η). --protect not given to predict: the client
    takes the policy the prompt's training data was declared with (:func:`_echo_privacy`
    says so)."""
    from rapt.privacy.by_kind import KindPolicy

    check_kind_options(kinds, private=not c.no_privacy)
    if c.no_privacy:
        return
    if kinds.protect is not None or kinds.personal:
        eta = _guard(lambda: c.query_eta(prompt_id) if prompt_id else c.resolved_eta())
        c.set_kind_policy(kind_policy(c.backbone, eta, kinds) or KindPolicy())


@contextlib.contextmanager
def _privacy_warnings():
    """Show the client's PrivacyWarnings as one stderr line each, at once (so a --no-privacy
    warning appears before anything is sent), as every command writes its warnings; the
    weak-privacy one is left to :func:`_echo_privacy`, after the privacy lines."""
    from rapt.client.client import PrivacyWarning, WeakPrivacyWarning

    def show(message, category, *args, **kwargs):
        if issubclass(category, WeakPrivacyWarning):
            return
        if issubclass(category, PrivacyWarning):
            typer.echo(f"warning: {flag_words(str(message))}", err=True)
        else:
            previous(message, category, *args, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("always", PrivacyWarning)
        previous = warnings.showwarning
        warnings.showwarning = show
        yield


def _guard(fn):
    """Run fn; errors the user can act on become one line and exit code 2."""
    from rapt.client.client import ClientError, ServiceError
    from rapt.data import DataError

    try:
        with _privacy_warnings():
            return fn()
    except (ClientError, ServiceError, DataError, FileNotFoundError) as e:
        fail(str(e))


def _echo_privacy(c, json_report: bool = False) -> None:
    """The privacy line of what was sent, the attack table's line at its η and the weak-privacy
    warning, as every command prints them (stderr); with --json-report both as one JSON line."""
    from dataclasses import asdict

    from rapt.client.client import RELEASE_NAMES
    from rapt.privacy.attack_table import strongest_at

    r = c.last_privacy
    table = None
    if r and not r["no_privacy"] and c.kind_policy is not None and not c.kind_policy.uniform \
            and str(c.kind_source).startswith("prompt"):
        echo_policy(c.kind_policy, r["eta"], prefix=f"queries as {c.kind_source}'s training data "
                    "was declared (--protect overrides): ")
    if r and r["no_privacy"]:
        typer.echo(f"{r['what']}: {r['rows']} rows sent in clear text (--no-privacy): no "
                   "privacy", err=True)
    elif r:
        src = r.get("eta_source") or ""
        note = (f" (η recorded on the service with {src})" if src.startswith("prompt")
                else " (the default level)" if src == "default" else "")
        echo_privacy(r, backbone=c.backbone.name, err=True,
                     prefix=f"{r['what']}: {r['rows']} rows privatized; ", suffix=note,
                     min_p=r.get("min_p"), what=RELEASE_NAMES[r["what"]])
        table = asdict(strongest_at(c.backbone.name, r["eta"]))
    if json_report and r:
        _echo_json_report(c, table)


def _echo_json_report(c, table: dict | None = None) -> None:
    """--json-report: the privacy report of what was sent and the attack table's answer at
    its η, one JSON line on stdout."""
    from dataclasses import asdict

    from rapt.privacy.attack_table import strongest_at

    r = c.last_privacy
    if table is None and r and not r["no_privacy"]:
        table = asdict(strongest_at(c.backbone.name, r["eta"]))
    typer.echo(json.dumps({"privacy": r, "attack_table": table}))


@client_app.command("upload")
def client_upload(
    file: str = typer.Argument(..., help="labelled CSV / TSV / JSONL file (or a built-in name)"),
    eta: float | None = ETA_OPT, no_privacy: bool = NOPRIV_OPT, backbone: str = BB_OPT,
    protect: str | None = PROTECT, frequent_rank: int = FREQUENT_RANK,
    other_p: float | None = OTHER_P, other_eta: float | None = OTHER_ETA,
    personal_p: float | None = PERSONAL_P, personal_eta: float | None = PERSONAL_ETA,
    personal_rank: int | None = PERSONAL_RANK,
    text_column: str | None = TEXT_COLUMN, label_column: str | None = LABEL_COLUMN,
    text_pair_column: str | None = TEXT_PAIR_OPT,
    target_p: float | None = TARGET_P_OPT, target_ep: float | None = TARGET_EP_OPT,
    reconstruction: bool = typer.Option(
        _d("reconstruction"), help="prepend m plain tokens to every row for RAPT's privatized "
        "token reconstruction (RAPT §3.2.2; `rapt client tune` then trains with it); off by "
        "default, as in `rapt tune`"),
    plain_len: int = typer.Option(DEFAULT_PLAIN_TOKENS, help="number of plain tokens m"),
    max_length: int = typer.Option(_d("max_length")), limit: int | None = typer.Option(None),
    seed: int | None = typer.Option(None, "--noise-seed", "--seed",
                                    help="seed the privatization noise (tests only)"),
    min_p: float = MIN_P_OPT, json_report: bool = JSON_OPT, pad_to_bucket: int | None = PAD_OPT,
    no_local: bool = typer.Option(
        False, "--no-local", help="upload every row: hold none out (then `client tune` fits "
        "the local model by cross-validation only and fuses nothing)"),
    holdout_seed: int = typer.Option(0, help="seed of the held-out slice"),
    url: str | None = URL_OPT, key: str | None = KEY_OPT,
) -> None:
    """Privatize FILE here and upload only the privatized token ids; prints the dataset id,
    and on stderr η, the measured P and the nearest-neighbour inversion success.

    A held-out slice (20 % of the rows, at most 500; none below about 100 rows) stays on this
    machine, never uploaded: after `client tune --wait` it scores the tuned model on rows it
    never trained on, against a local model of your clean rows (--no-local: upload all).
    --limit N: a random sample of N rows (seed 0), in file order."""
    from rapt.data import load_dataset

    # the client warns of --no-privacy itself, before anything is sent
    kinds = with_defaults(KindOptions(protect, frequent_rank, other_p, other_eta, personal_p,
                                      personal_eta, personal_rank), private=not no_privacy)
    check_kind_options(kinds, private=not no_privacy)
    target_p = privacy_level(eta, target_p, target_ep, no_privacy, clear=None,
                             protect=kinds.protect)
    if target_ep is not None:
        eta = eta_for_target_ep(backbone, target_ep)
    c = _client(url, key, backbone, eta, no_privacy, seed, min_p, target_p=target_p,
                plain_tokens=plain_len, pad_to_bucket=pad_to_bucket)
    _kind_policy(c, kinds)
    # how to read the rows again after the tune (the held-out ones are never uploaded)
    reload = {"name_or_path": str(Path(file).resolve()) if Path(file).exists() else file,
              "text_column": text_column, "label_column": label_column,
              "text_pair_column": text_pair_column, "limit": limit}
    data = _guard(lambda: load_dataset(**reload))
    echo_data_notes(data)
    ds = _guard(lambda: c.upload(data, reconstruction=reconstruction, max_length=max_length,
                                 holdout=not no_local, holdout_seed=holdout_seed, reload=reload))
    typer.echo(ds)
    _echo_privacy(c, json_report)
    if c.last_upload.get("held_out"):
        typer.echo(f"held out: {c.last_upload['held_out']} rows kept on this machine, not "
                   "uploaded (`client tune --wait` scores the tuned model on them)", err=True)


@client_app.command("tune")
def client_tune(
    dataset_id: str,
    method: str | None = typer.Option(None, help=f"prompt | prefix | lora ({METHOD_DEFAULT_HELP})"),
    reconstruction: bool | None = typer.Option(
        None, "--reconstruction/--no-reconstruction", help="default: on when the dataset was "
        "uploaded with --reconstruction (plain tokens), else off"),
    epochs: int = typer.Option(_d("epochs")),
    lr: float | None = typer.Option(None, help=LR_HELP),
    batch_size: int = typer.Option(_d("batch_size")),
    num_virtual_tokens: int | None = typer.Option(
        None, help=VIRTUAL_TOKENS_HELP),
    max_length: int = typer.Option(_d("max_length")), seed: int = typer.Option(_d("seed")),
    dp_epsilon: float | None = typer.Option(None, help=f"{DP_EPSILON_HELP}; δ = "
                                            "min(1e-5, 1/(10·N)) for N rows"),
    dp_noise: float | None = typer.Option(None, help=DP_NOISE_HELP),
    dp_clip: float | None = typer.Option(None, help="PromptDPSGD: per-example clipping norm C "
                                         "(default 1)"),
    wait: bool = typer.Option(False, help="poll with a progress bar until the job ends"),
    output_denoiser: bool = typer.Option(
        False, "--output-denoiser", help="after tuning, the service fits the prompt's output "
        "denoiser (Split-N-Denoise) on public text at the dataset's η (its cost, part of the "
        "job; no row of yours); `client predict` then corrects the pooled states of your "
        "privatized queries with it on this machine (needs a privatized upload)"),
    backbone: str | None = typer.Option(
        None, "--backbone", help="local copy of the service's backbone, to privatize the "
        "held-out rows (default: the one the dataset was uploaded with)"),
    no_local: bool = NO_LOCAL_OPT, local_out: Path | None = LOCAL_OUT_OPT,
    pad_to_bucket: int | None = with_help(PAD_OPT, "pad the held-out rows sent after --wait as "
                                          "`client predict --pad-to-bucket` pads queries"),
    url: str | None = URL_OPT, key: str | None = KEY_OPT,
) -> None:
    """Start a tuning job on an uploaded dataset; prints the job id (and waits with --wait).

    With --wait, once the job succeeds, on this machine: a local model (TF-IDF + logistic
    regression) on the clean rows of the upload; the rows held out at upload are privatized
    and classified by the tuned model (one predict call, as `client predict` sends), and the
    fusion weights of the two are fitted on them; it prints both accuracies and which model to
    use, and saves the local model (--local-out). --no-local: none of it."""
    c = _client(url, key)
    dp = None
    if dp_epsilon is not None or dp_noise is not None:
        dp = {k: v for k, v in (("target_epsilon", dp_epsilon), ("noise_multiplier", dp_noise),
                                ("max_grad_norm", dp_clip)) if v is not None}
    job = _guard(lambda: c.tune(dataset_id, method=method, reconstruction=reconstruction,
                                epochs=epochs, lr=lr, batch_size=batch_size,
                                num_virtual_tokens=num_virtual_tokens, max_length=max_length,
                                seed=seed, dp=dp, output_denoiser=output_denoiser))
    typer.echo(job)
    _echo_job_setup(c, job, dataset_id, given_method=method is not None, dp=dp is not None)
    if wait:
        st = _guard(lambda: c.wait(job))
        info = _guard(lambda: c.prompt(st["prompt_id"])) if st["state"] == "succeeded" else {}
        if info.get("head"):
            typer.echo(f"head: {info['head']}", err=True)
        if info.get("output_denoiser"):
            _echo_denoiser(c, st["prompt_id"])
        typer.echo(json.dumps(st, indent=1))
        if st["state"] != "succeeded":
            raise typer.Exit(1)
        _echo_training_check(c, st, info)
        if not no_local:
            _user_side(url, key, backbone, st["prompt_id"], dataset_id, local_out, seed,
                       pad_to_bucket)
    elif not no_local:
        typer.echo("note: the local model is fitted once the job ends: `rapt client local "
                   "PROMPT_ID` then (or --wait here)", err=True)


@client_app.command("local")
def client_local(
    prompt_id: str,
    backbone: str | None = typer.Option(
        None, "--backbone", help="local copy of the service's backbone, to privatize the "
        "held-out rows (default: the one the dataset was uploaded with)"),
    local_out: Path | None = LOCAL_OUT_OPT,
    pad_to_bucket: int | None = with_help(PAD_OPT, "pad the held-out rows as `client predict "
                                          "--pad-to-bucket` pads queries"),
    seed: int = typer.Option(0, help="seed of the local model's cross-validation folds"),
    url: str | None = URL_OPT, key: str | None = KEY_OPT,
) -> None:
    """What `client tune --wait` does once the job succeeds, for a tuned prompt: the local
    model on the clean rows of its upload, the prompt scored on the rows held out at upload
    (one predict call, privatized as queries are), the comparison, the verdict, and the local
    model saved on this machine (--local-out)."""
    c = _client(url, key)
    dataset_id = _guard(lambda: c.dataset_of(prompt_id))
    if dataset_id is None:
        fail(f"prompt {prompt_id}: its job is gone, so its dataset is unknown; no local model")
    _user_side(url, key, backbone, prompt_id, dataset_id, local_out, seed, pad_to_bucket)


def _user_side(url, key, backbone: str | None, prompt_id: str, dataset_id: str,
               local_out: Path | None, seed: int, pad_to_bucket: int | None = None) -> None:
    """Stderr: the local model's accuracy, the held-out comparison and the verdict; the local
    model saved on this machine (0600). Sends one predict call of the held-out rows."""
    from rapt.artifacts import write_local_model
    from rapt.client.client import ClientError, ServiceError
    from rapt.local import verdict

    c = _client(url, key)
    rec = c.holdout_record(dataset_id)
    if rec is None:
        typer.echo(f"note: no local model: dataset {dataset_id} was not uploaded from this "
                   "machine with its rows recorded (or with --no-local)", err=True)
        return
    c = _client(url, key, backbone or rec.get("backbone") or "minilm",
                pad_to_bucket=pad_to_bucket)
    try:
        with _privacy_warnings():
            base, fusion, comp = c.user_side(prompt_id, seed=seed)
    except (ClientError, ServiceError, ValueError) as e:  # the job succeeded: say why, exit 0
        typer.echo(f"note: no local model: {e}", err=True)
        return
    if fusion is not None:
        _echo_heldout(c)
    cv = "" if base.cv_accuracy is None else (
        f"; {numfmt.pct(base.cv_accuracy)} by {base.folds}-fold cross-validation on them")
    typer.echo(f"local model: TF-IDF + logistic regression on your {base.n_rows} clean rows, "
               f"on this machine (C = {base.C:g}{cv})", err=True)
    if fusion is not None:
        acc = fusion.accuracy or {}
        den = " (denoised on this machine)" if c.prompt(prompt_id).get("output_denoiser") \
            else ""
        typer.echo(f"held-out rows ({fusion.n_rows}, never trained on): privatized model"
                   f"{den} {numfmt.pct(acc['remote'])}, local {numfmt.pct(acc['local'])} (fitted "
                   f"without these rows), fused {numfmt.pct(acc['fused'])} (cross-fitted; "
                   f"weights: remote {fusion.remote:g}, local {fusion.local:g})", err=True)
    typer.echo(verdict(comp).replace("`rapt predict", "`rapt client predict"), err=True)
    out = local_out or c.local_model_path(prompt_id)
    paths = write_local_model(out, base, fusion)
    c.remember_local_model(prompt_id, out)
    typer.echo(f"local model saved: {', '.join(str(p) for p in paths)} (0600: statistics of "
               "your clean rows; keep them on this machine, never share them)", err=True)


def _echo_heldout(c) -> None:
    """Stderr: what the held-out rows cost: nothing (their stored answer), nothing new (the
    rows sent before, sent again as they were), or the privacy line of their first release."""
    got = c.last_heldout
    if not got.get("sent"):
        typer.echo(f"held-out rows: nothing sent; the prompt's answer to them, recorded when "
                   f"they went out, is read from {got.get('file')} (each row goes out once)",
                   err=True)
        return
    if not got.get("fresh"):
        typer.echo("held-out rows: sent again exactly as privatized the first time, for "
                   f"another prompt (no fresh noise, nothing new released; {got.get('file')})",
                   err=True)
    _echo_privacy(c)  # what the held-out predict call sent


def _echo_denoiser(c, prompt_id: str) -> None:
    """Stderr: what the prompt's output denoiser learned on public text (downloaded here)."""
    rec = (_guard(lambda: c.output_denoiser(prompt_id))[2].get("record") or {})
    typer.echo(f"output denoiser (fitted by the service on {rec.get('public_rows')} public "
               f"sentences at η = {numfmt.eta(float(rec.get('eta') or 0))}; no row of yours): "
               f"held-out public error {float(rec.get('before') or 0):.4g} -> "
               f"{float(rec.get('after') or 0):.4g}; `client predict` applies it on this "
               "machine (--no-denoise: not)", err=True)


def _echo_job_setup(c, job: str, dataset_id: str, *, given_method: bool, dp: bool) -> None:
    """Stderr, as `rapt tune` prints them: the job's method (and that it is the default) and
    the privacy of the rows it trains on, as their upload declared it."""
    st = _guard(lambda: c.status(job))
    typer.echo(f"method: {st['method']}" + ("" if given_method else " (default" + (
        " under DP" if dp else "") + "; --method prompt | prefix | lora)"), err=True)
    decl = _guard(lambda: c.dataset(dataset_id)).get("privacy") or {}
    if decl.get("mechanism") == "dchi-text2text":
        typer.echo(f"privacy: η = {numfmt.eta(decl['eta'])} (declared with dataset {dataset_id} at "
                   "upload)", err=True)
    else:
        typer.echo(f"warning: dataset {dataset_id} was uploaded with --no-privacy: the job trains "
                   "on clear text", err=True)


def _echo_training_check(c, st: dict, info: dict) -> None:
    """Stderr: the service's collapse check on the job's training rows, labels by name where
    this machine recorded them, with advice that fits the job."""
    msgs = info.get("training_warnings") or []
    names = c.label_names_for(st["prompt_id"]) if msgs else None
    for i, name in enumerate(names or []):
        msgs = [m.replace(f"'label {i}'", f"'{name}'") for m in msgs]
    private = (info.get("privacy") or {}).get("mechanism") == "dchi-text2text"
    echo_collapse(msgs, when="after training (the service's predictions on training rows)",
                  fixes=collapse_fixes(method=info.get("method"), private=private,
                                       dp=st.get("epsilon") is not None))


@client_app.command("status")
def client_status(job_id: str, wait: bool = typer.Option(False), cancel: bool = typer.Option(
        False, help="cancel the job"), url: str | None = URL_OPT, key: str | None = KEY_OPT
) -> None:
    """Show a job's state, step, loss, elapsed time and ETA (JSON)."""
    c = _client(url, key)
    if cancel:
        st = _guard(lambda: c.cancel(job_id))
    else:
        st = _guard(lambda: c.wait(job_id) if wait else c.status(job_id))
    typer.echo(json.dumps(st, indent=1))


def _note_label_ids(pred) -> None:
    if pred.label_names is None:
        typer.echo("note: no label names recorded for this prompt on this machine (its dataset "
                   "was uploaded elsewhere): labels are shown as ids; pass --label-names",
                   err=True)


@client_app.command("predict")
def client_predict(
    prompt_id: str,
    inputs: list[str] = typer.Argument(..., help="a file of queries, or query texts"),
    eta: float | None = with_help(ETA, "dχ-privacy parameter η used to privatize the queries "
                                  "locally (default: the η recorded on the service with the "
                                  "prompt's training data)"),
    no_privacy: bool = NOPRIV_PREDICT_OPT, backbone: str = BB_OPT,
    min_p: float = MIN_P_OPT, json_report: bool = JSON_OPT,
    text_column: str | None = with_help(TEXT_COLUMN, "text column/key of a query file"),
    text_pair_column: str | None = TEXT_PAIR_OPT, pad_to_bucket: int | None = PAD_OPT,
    label_column: str | None = with_help(LABEL_COLUMN, "gold labels of a query file, if any: "
                                         "accuracy and a confusion table are printed"),
    label_names: str | None = with_help(LABEL_NAMES, "comma-separated label names in id order "
                                        "(default: those recorded on this machine when the "
                                        "prompt's dataset was uploaded from it)"),
    protect: str | None = PROTECT_PREDICT_OPT, frequent_rank: int = FREQUENT_RANK,
    other_p: float | None = OTHER_P, other_eta: float | None = OTHER_ETA,
    personal_p: float | None = PERSONAL_P, personal_eta: float | None = PERSONAL_ETA,
    personal_rank: int | None = PERSONAL_RANK,
    out: Path | None = typer.Option(None, "--out", help="write every prediction to this file, "
                                    "JSONL or CSV by its suffix (default: a summary and the "
                                    "first rows)"),
    local: Path | None = typer.Option(
        None, "--local", help="the --local-out of the `client tune` run whose local model to "
        "use (default: where `client tune --wait` saved the prompt's): its clean-query "
        "probabilities are fused with the remote ones, and the fused label is the prediction"),
    local_only: bool = typer.Option(False, "--local-only", help="the local model alone, on the "
                                    "clean queries: nothing is privatized or sent"),
    fused: bool = typer.Option(False, "--fused", help="fuse the privatized and local models even "
                               "where the verdict after tuning chose one alone (by default "
                               "predict does what it said, recorded with the local model)"),
    no_denoise: bool = typer.Option(
        False, "--no-denoise", help="use the service's probabilities as they are, even when "
        "the prompt has an output denoiser (`client tune --output-denoiser`)"),
    url: str | None = URL_OPT, key: str | None = KEY_OPT, no_local: bool = NO_LOCAL_OPT,
) -> None:
    """Privatize each query here, classify it with a tuned prompt; prints a summary and the
    first rows (or writes them all with --out), by label name, and on stderr η, the measured P
    and the nearest-neighbour inversion success.

    When `client tune --wait` saved a local model for the prompt (see --local), predict does
    what the verdict after tuning chose on the held-out rows: the two fused (each clean query
    classified by the local model too, on this machine), or one model alone (the local one:
    nothing sent); --fused, --local-only and --no-local choose instead. --out then holds the
    prediction's probabilities and each model's (p_remote, p_denoised with an output
    denoiser, p_local, p_fused). What is sent is the same whenever the privatized model is
    asked."""
    from rapt.data import load_dataset
    from rapt.predictions import Predictions

    check_out_or_fail(out)
    c = _client(url, key, backbone, eta, no_privacy, min_p=min_p, pad_to_bucket=pad_to_bucket)
    _kind_policy(c, KindOptions(protect, frequent_rank, other_p, other_eta, personal_p,
                                personal_eta, personal_rank), prompt_id)
    names = split_names(label_names) or _guard(lambda: c.label_names_for(prompt_id))
    src = inputs[0] if len(inputs) == 1 and os.path.exists(inputs[0]) else inputs
    if not isinstance(src, list):
        src = _guard(lambda: load_dataset(src, text_column=text_column, label_names=names,
                                          text_pair_column=text_pair_column,
                                          label_column=label_column))
        echo_data_notes(src)
    user, mode = _user_model(c, prompt_id, local, no_local, local_only, fused)
    if mode == "local":
        pred = _local_only(c, prompt_id, src, names, user[0])
    else:  # the privacy of the queries is printed once they are privatized, before sending
        pred = _guard(lambda: c.predict(prompt_id, src, label_names=names,
                                        denoise=not no_denoise,
                                        on_privatized=lambda _: _echo_privacy(c)))
        _echo_denoised(c, prompt_id, pred, no_denoise)
    _note_label_ids(pred)
    probs, sources = _combined(pred, user, mode)
    preds = _guard(lambda: Predictions(
        pred.label_names or [str(i) for i in range(len(pred.probabilities[0]))],
        probs, texts=pred.texts, text_pairs=pred.text_pairs, gold=pred.gold, sources=sources))
    info = c.prompt(prompt_id)
    echo_predictions(preds, out, eta=c.eta, fixes=collapse_fixes(
        method=info.get("method"), retune=True,
        private=(info.get("privacy") or {}).get("mechanism") == "dchi-text2text"))
    if json_report and mode != "local" and c.last_privacy:
        _echo_json_report(c)


def _echo_denoised(c, prompt_id: str, pred, no_denoise: bool) -> None:
    """Stderr: whether the remote probabilities went through the prompt's output denoiser,
    and a warning when the queries' η is not the one it was fitted at."""
    if not c.prompt(prompt_id).get("output_denoiser"):
        return
    if not pred.denoised:
        why = "--no-denoise" if no_denoise else "the queries are not privatized"
        typer.echo(f"output denoiser of prompt {prompt_id} not used ({why})", err=True)
        return
    typer.echo("remote probabilities: the prompt's pooled states of the privatized queries, "
               "corrected on this machine by its output denoiser (fitted by the service on "
               "public text), then its head; --no-denoise uses them as returned", err=True)
    fitted = (c.output_denoiser(prompt_id)[2].get("record") or {}).get("eta")
    if fitted is not None and c.eta is not None and \
            abs(float(fitted) - c.eta) > 1e-6 * max(1.0, abs(c.eta)):
        typer.echo(f"warning: the output denoiser was fitted at η = {numfmt.eta(float(fitted))}; "
                   f"these queries are privatized at η = {numfmt.eta(c.eta)}: it may correct them "
                   "less well",
                   err=True)


def _read_local(c, prompt_id: str, local: Path | None, *, required: bool):
    """(LocalBaseline, Fusion or None) saved for ``prompt_id`` on this machine, or None (a
    one-line error when ``required``, or when the files are there but unreadable)."""
    from rapt.artifacts import ArtifactError, read_local_model

    where = local or c.local_model_path(prompt_id)
    try:
        got = read_local_model(where)
    except ArtifactError as e:
        fail(f"{e} (--no-local predicts without it)")
    if got is None and required:
        fail(f"no local model at {where}.local.NOT-PRIVATE.json: `rapt client tune --wait` "
             "saves one (--local names its --local-out)")
    n = int(_guard(lambda: c.prompt(prompt_id)).get("num_labels") or 0)
    if got is not None and n and got[0].num_labels != n:  # before any query is sent
        fail(f"the local model at {where} has {got[0].num_labels} labels, prompt {prompt_id} "
             f"{n}: it was fitted for another prompt (--local names the right one, or "
             "--no-local)")
    return got


def _local_only(c, prompt_id: str, src, names, baseline):
    """The local model's prediction of clean queries: nothing is sent."""
    from rapt.client.client import Prediction

    texts = src if isinstance(src, list) else src.texts
    pairs = None if isinstance(src, list) else src.text_pairs
    gold = None if isinstance(src, list) or src.report.get("label_source") is None else [
        e.label for e in src.examples]
    probs = baseline.predict_proba(texts, pairs).tolist()
    return Prediction([max(range(len(p)), key=p.__getitem__) for p in probs], probs,
                      names or (None if isinstance(src, list) else src.label_names or None),
                      list(texts), pairs, gold)


def _user_model(c, prompt_id: str, local: Path | None, no_local: bool, local_only: bool,
                fused: bool):
    """((LocalBaseline, Fusion or None) or None, what `client predict` does: "local", "fused"
    or "remote"), by the options when given, else as the verdict after tuning chose (recorded
    with the fusion weights); a note why. One error line for options that contradict."""
    if no_local and (local is not None or local_only or fused):
        fail("--no-local leaves the local model out: give it or --local / --local-only / "
             "--fused, not both")
    if fused and local_only:
        fail("--fused pools both models: give it or --local-only, not both")
    user = None if no_local else _read_local(c, prompt_id, local,
                                             required=local_only or fused or local is not None)
    return user, _mode(user, local_only, fused)


def _mode(user, local_only: bool, fused: bool) -> str:
    """See :func:`_user_model`."""
    if user is None:
        return "remote"
    fusion = user[1]
    if fused and fusion is None:
        fail("--fused: this local model has no fusion weights (no rows were held out at "
             "upload)")
    mode = ("local" if local_only else "fused" if fused
            else fusion.mode if fusion is not None else "remote")
    if fusion is not None and not (local_only or fused) and mode != "fused":
        side = "the local model" if mode == "local" else "the privatized model"
        typer.echo(f"the verdict after tuning chose {side} alone (it scored best on "
                   f"{fusion.n_rows} held-out rows): "
                   + ("nothing is privatized or sent" if mode == "local" else
                      "its predictions, the local ones beside them")
                   + "; --fused fuses the two", err=True)
    return mode


def _combined(pred, user, mode: str):
    """(the prediction's probabilities, each model's by name or None), as `rapt predict`
    combines them: fused when fusion weights were fitted at tune time and ``mode`` is "fused",
    else the privatized model's (each model's beside them: "remote" as the service returned
    them, "denoised" through the output denoiser, "local", "fused")."""
    import numpy as np

    sources = ({"remote": pred.probabilities} if pred.remote_probabilities is None else
               {"remote": pred.remote_probabilities, "denoised": pred.probabilities})
    if user is None or mode == "local":
        return pred.probabilities, (sources if len(sources) > 1 and mode != "local" else None)
    baseline, fusion = user
    remote = np.asarray(pred.probabilities, dtype=float)
    local = baseline.predict_proba(pred.texts, pred.text_pairs)
    sources["local"] = local.tolist()
    if fusion is None:
        typer.echo("note: a local model but no fusion weights (no rows were held out at "
                   "upload): the privatized model's predictions, the local ones beside them",
                   err=True)
        return remote.tolist(), sources
    sources["fused"] = fusion(remote, local).tolist()
    if mode != "fused":
        return remote.tolist(), sources
    typer.echo(f"fused: the privatized model and your local model (weights remote "
               f"{fusion.remote:g}, local {fusion.local:g}, fitted on {fusion.n_rows} held-out "
               "rows; --no-local for the privatized model alone)", err=True)
    return sources["fused"], sources
