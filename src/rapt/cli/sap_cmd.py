"""`rapt sap tune|predict|attack`: Split-and-Privatize on a dataset or the user's own file.

Both parties run in this process, or, with ``--url``, the provider is a `rapt serve` service
(``/v1/sap/...``): the customer downloads the bottom, the top never leaves the server and the labels
are not sent (the ∂l/∂g returned to it reveals them: docs/THREAT_MODEL.md). The artifact folder
holds each party's half apart: ``provider.safetensors`` (the top's tuned adapter; in-process only)
and ``customer.safetensors`` (the customer's output layer, and its bottom when trained), with
``sap.json`` (split config, labels, η, contributing tokens, and for a remote run the service URL and
session id, which `rapt sap predict` then uses). Privacy noise comes from OS entropy unless
``--noise-seed`` is given (with a warning).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from rapt import numfmt
from rapt.cli._app import (
    app,
    check_out_or_fail,
    collapse_fixes,
    echo_predictions,
    echo_privacy,
    echo_table_line,
    fail,
    load_backbone_or_fail,
    load_data_or_fail,
    privacy_level,
    resolve_eta,
    sub_app,
    warn_collapse,
    warn_if_seeded,
)
from rapt.cli._local import fit_user_side_alone
from rapt.cli.options import (
    ETA,
    LABEL_BASE,
    LABEL_COLUMN,
    LABEL_NAMES,
    LIMIT,
    MIN_P,
    NO_PRIVACY,
    NOISE_SEED,
    PRECISION,
    TARGET_EP,
    TARGET_P,
    TEXT_COLUMN,
    split_names,
    with_default,
    with_help,
)
from rapt.cli.options import (
    FORMAT as FORMAT_OPT,
)
from rapt.config import PRECISIONS

sap_app = sub_app(help="Split-and-Privatize: split the backbone, privatize the bottom's "
                           "release, keep the labels local.", no_args_is_help=True)
app.add_typer(sap_app, name="sap")

FORMAT = "rapt-sap"
VERSION = 1
_LOCAL_HELP = ("also fit a local model on your clean rows (TF-IDF + logistic regression, on "
               "this machine: about 2 s for 500 rows on 2 cores, measured; nothing more leaves "
               "it), print its "
               "cross-validated accuracy with a verdict and save it beside --out (mode 0600)")


def _data(data: str, split: str, limit: int | None, text_column: str | None,
          label_column: str | None, label_names: list[str] | None = None,
          fmt: str | None = None, label_base: int | None = None, limit_seed: int = 0):
    return load_data_or_fail(data, split, limit=limit, text_column=text_column,
                             label_column=label_column, label_names=label_names, fmt=fmt,
                             label_base=label_base, limit_seed=limit_seed)


def _eta(bb, eta: float | None, target_p: float | None,
         target_ep: float | None = None) -> float | None:
    eta, calibrated = resolve_eta(bb, eta, target_p, target_ep)
    if calibrated and target_p is not None:
        typer.echo(f"η = {numfmt.eta(eta)} (calibrated for P ≈ {target_p} on rapt's public text "
                   "sample, not on your data)")
    return eta


_PRIVATIZE = typer.Option("tokens", help="tokens: dχ on the token embeddings, then the bottom "
                          "(SAP Algorithm 1); output: dχ noise on the bottom's output states "
                          "(split >= 1, the paper's §4.3)")
_LABEL_DP = typer.Option(None, help="train on labels randomized once by randomized response: "
                         "each label ε-label-DP against the provider, which otherwise reads "
                         "them off the returned ∂l/∂g (not with --cti)")
_CTI_SMOOTHING = typer.Option(1.0, help="α of the add-α estimate of p(token | class) in the "
                              "utility importance (the paper gives none; smaller α ranks rare "
                              "one-class tokens higher)")


def _echo_output_privacy(cfg, bb) -> None:
    """What holds for ``--privatize output`` (no token report applies there)."""
    if cfg.eta is not None and cfg.privatize == "output":
        typer.echo(f"privacy: dχ noise on the bottom's output states, η = {numfmt.eta(cfg.eta)} "
                   f"(norm Gamma({bb.hidden_size}, 1/η), mean {bb.hidden_size / cfg.eta:.3g}); "
                   "metric privacy in the bottom's output space, no per-token statement "
                   "(SplitConfig docstring); measure it with `rapt sap attack --privatize output`")


def _config(**kw):
    from rapt.split import SplitConfig

    try:
        return SplitConfig(**kw)
    except ValueError as e:
        fail(str(e))  # fail() writes SplitConfig.split_layer as --split-layer


@sap_app.command("tune")
def sap_tune(
    data: str = typer.Argument(..., help="dataset name (financial_phrasebank, sst2-sentences, "
                                         "...) or a CSV/TSV/JSONL file"),
    out: Path = typer.Option(Path("runs/sap"), "--out", "-o", help="artifact folder"),
    backbone: str = typer.Option("minilm", help="backbone name or path"),
    split_layer: int = typer.Option(0, help="blocks the customer runs after the embedding "
                                            "layer (0 = embedding layer only)"),
    eta: float | None = ETA,
    target_p: float | None = TARGET_P,
    target_ep: float | None = TARGET_EP,
    no_privacy: bool = with_help(NO_PRIVACY, "release the bottom's output unprivatized (the "
                                 "default is P ≈ 0.6 when no level is given)"),
    min_p: float = MIN_P,
    cti: bool = typer.Option(False, "--cti/--no-cti", help="contributing-token identification"),
    cti_multiplier: float = typer.Option(math.inf, help="η multiplier on contributing tokens "
                                                        "(inf = no noise, SAP Algorithm 1)"),
    cti_coverage: float = typer.Option(0.01, help="max share of token occurrences they cover"),
    cti_rule: str = typer.Option("uniform", help="uniform: one k for all classes (SAP's rule); "
                                 "per-class: each class fills the budget (ours, not the paper's)"),
    cti_smoothing: float = _CTI_SMOOTHING,
    unfreeze_bottom: bool = typer.Option(False, "--unfreeze-bottom/--freeze-bottom",
                                         help="train the bottom too (fresh noise every step)"),
    label_dp_epsilon: float | None = _LABEL_DP,
    privatize: str = _PRIVATIZE,
    method: str = typer.Option("lora", help="how the provider tunes the top: lora | prompt"),
    lr: float = typer.Option(2e-3),
    head_lr: float | None = typer.Option(1e-2, help="customer's output layer"),
    epochs: int = typer.Option(3),
    batch_size: int = typer.Option(32),
    max_length: int = typer.Option(64),
    split: str = typer.Option("train"),
    limit: int | None = LIMIT,
    text_column: str | None = TEXT_COLUMN,
    label_column: str | None = LABEL_COLUMN,
    fmt: str | None = FORMAT_OPT,
    label_names: str | None = LABEL_NAMES,
    label_base: int | None = LABEL_BASE,
    seed: int = typer.Option(0, help="init and data order (not privacy noise)"),
    noise_seed: int | None = NOISE_SEED,
    url: str | None = typer.Option(
        None, "--url", help="train against this rapt service (the provider keeps the top); "
        "default: both parties in this process"),
    key: str | None = typer.Option(None, "--key", help="API key for --url (env RAPT_API_KEY)"),
    remote_backbone: str | None = typer.Option(
        None, help="the service's name for the backbone (default: --backbone)"),
    precision: str = with_default(PRECISION, "fp32"),
    local: bool = typer.Option(True, "--local/--no-local", help=_LOCAL_HELP),
) -> None:
    """Train a split model: the customer privatizes and runs the bottom, the provider tunes the
    top. Labels are not sent, but the returned ∂l/∂g reveals them (--label-dp-epsilon)."""
    target_p = privacy_level(eta, target_p, target_ep, no_privacy,
                             clear="the bottom's release is not privatized")
    ds = _labelled_data(data, split, limit, text_column, label_column,
                        label_names=split_names(label_names), fmt=fmt, label_base=label_base,
                        limit_seed=seed)
    bb = load_backbone_or_fail(backbone)
    e = _eta(bb, eta, target_p, target_ep)
    cfg = _config(split_layer=split_layer, eta=e, cti=cti, cti_multiplier=cti_multiplier,
                  cti_coverage=cti_coverage, cti_rule=cti_rule, cti_smoothing=cti_smoothing,
                  unfreeze_bottom=unfreeze_bottom, method=method, privatize=privatize,
                  label_dp_epsilon=label_dp_epsilon,
                  lr=lr, head_lr=head_lr, epochs=epochs, batch_size=batch_size,
                  max_length=max_length, seed=seed, noise_seed=noise_seed,
                  precision=precision)
    warn_if_seeded(noise_seed)
    client = _client(url, key, bb, remote_backbone or backbone, no_privacy) if url else None
    rows, customer, provider, sid = _start_parties(bb, cfg, ds, client, url)
    hist = _train(customer, provider)
    _warn_collapse(customer, provider, rows, ds)
    privacy = _echo_release_privacy(customer, rows, cfg, bb, backbone, target_p, min_p)
    out.mkdir(parents=True, exist_ok=True)
    cti_tokens = _save_tensors(out, customer, provider if client is None else None)
    doc = _sap_doc(cfg, backbone, ds, data, cti_tokens, privacy, noise_seed, provider)
    _write_doc(out, doc, no_privacy, client, url, sid)
    # one P printed: the privacy line's, of the training rows' release (customer.measured_p
    # also counts the queries the collapse check privatized afresh)
    typer.echo(f"saved SAP model (split after {split_layer} blocks, {method}) to {out}"
               + _save_measured(out, customer, privacy, hist))
    if local:
        fit_user_side_alone(ds, out, seed, predict_cmd="rapt sap predict")


def _write_doc(out: Path, doc: dict, no_privacy: bool, client, url: str | None, sid) -> None:
    """``sap.json``, with the remote session of a model trained against a service (its key is
    not written: give it again to `rapt sap predict`)."""
    doc["no_privacy"] = bool(no_privacy)
    if client is not None:
        doc["remote"] = {"url": url, "session": sid, "backbone": client.remote_backbone}
    (out / "sap.json").write_text(json.dumps(doc, indent=2) + "\n")


def _save_measured(out: Path, customer, privacy: dict | None, hist: list[dict]) -> str:
    """What was measured on the private rows (the release's privacy report, measured P, the
    final loss), written beside ``out`` (mode 0600), never into the folder one shares; -> the
    note for the saved line."""
    from rapt.artifacts import write_measured

    path = write_measured(out, {"privacy": privacy, "measured_p": customer.measured_p,
                                "final_loss": hist[-1]["loss"] if hist else None})
    return f"; kept beside it, not to be shared (measured on your rows): {path}"


def _echo_release_privacy(customer, rows, cfg, bb, backbone: str, target_p: float | None,
                          min_p: float) -> dict | None:
    """The release's privacy report (None without privatization), printed with the table's
    line and the weak-privacy rule; notes for output noise and for CTI."""
    privacy = customer.privacy_report(rows, target_p=target_p)
    _echo_output_privacy(cfg, bb)
    if privacy is not None:
        drawn = "" if not cfg.unfreeze_bottom else " (one draw; each step draws afresh)"
        echo_privacy(privacy, backbone=backbone, min_p=min_p, what="release",
                     prefix=f"release: {len(rows)} training rows privatized{drawn}; ")
        if cfg.cti:
            typer.echo("note: with --cti the contributing tokens are privatized at η × "
                       "--cti-multiplier (in clear for inf): the table's recovery is for a "
                       "uniform η, this release gives more away")
    return privacy


def _warn_collapse(customer, provider, rows, ds, limit: int = 1000) -> None:
    """Predict (the first ``limit`` of) the training rows, queries privatized afresh as at
    predict, and warn when the split model answers one class or no better than the majority
    class; the advice fits this run."""
    from rapt.split import predict_split

    probs = _remote(lambda: predict_split(customer, provider, rows[:limit]))
    cfg = customer.config
    extra = (() if cfg.unfreeze_bottom else ("--unfreeze-bottom",)) + ("a higher --lr",)
    warn_collapse(probs.argmax(-1).tolist(), ds.labels[:limit], ds.label_names,
                  when=f"after training (predictions on {min(limit, len(rows))} training rows)",
                  fixes=collapse_fixes(method=cfg.method, private=cfg.eta is not None,
                                       extra=extra))


def _sap_doc(cfg, backbone: str, ds, data: str, cti_tokens, privacy: dict | None,
             noise_seed: int | None, provider) -> dict:
    """``sap.json`` of a trained split model (the remote session is added by the caller): the
    release's privacy level only; what was measured on the rows goes beside the folder."""
    from rapt.artifacts import shareable_privacy

    return {"format": FORMAT, "version": VERSION, "config": cfg.to_dict(), "backbone": backbone,
            "label_names": ds.label_names, "num_labels": ds.num_labels, "dataset": str(data),
            "cti_tokens": cti_tokens, "privacy": shareable_privacy(privacy, backbone),
            "seeded": noise_seed is not None, "steps": provider.step}


def _labelled_data(data: str, split: str, limit: int | None, text_column: str | None,
                   label_column: str | None, **kw):
    """The training set, refused (exit 2) when empty, unlabelled or single-class."""
    ds = _data(data, split, limit, text_column, label_column, **kw)
    if len(ds) == 0:
        fail(f"{data}: no examples to train on")
    if ds.report.get("label_source") is None:
        fail(f"{data}: the examples have no labels (give --label-column)")
    if ds.num_labels < 2:
        fail(f"{data}: found {ds.num_labels} label value(s) {ds.label_names}; need at least 2")
    return ds


def _start_parties(bb, cfg, ds, client, url: str | None):
    """(encoded rows, customer, provider, remote session id or None), ready to train: the
    customer has run CTI (when asked) and holds the rows and labels; a remote provider has its
    session and, with a frozen bottom, the customer's release."""
    from rapt.split import encode_texts, setup_split

    try:
        rows = encode_texts(bb.tokenizer, ds.texts, cfg.max_length)
        if client is None:
            customer, provider = setup_split(bb, cfg, ds.num_labels, len(rows))
        else:
            customer = _remote(lambda: client.sap_customer(cfg, ds.num_labels))
    except ValueError as err:
        fail(str(err))
    if cfg.cti:
        res = customer.fit_cti(rows, ds.labels)
        ks = "/".join(map(str, res.k_per_class))
        typer.echo(f"CTI: {len(res.token_ids)} contributing tokens ({cfg.cti_rule} rule, "
                   f"k = {ks} per class, {100 * res.coverage:.2f}% of token occurrences)")
    customer.load(rows, ds.labels)
    sid = None
    if client is not None:
        sid = _remote(lambda: client.sap_session(cfg, len(rows)))
        typer.echo(f"session {sid} on {url}", err=True)
        provider = _remote(lambda: client.sap_provider(sid, customer))
        if not cfg.unfreeze_bottom:
            _remote(provider.upload_release)
    return rows, customer, provider, sid


def _train(customer, provider) -> list[dict]:
    """Run the split training with a progress bar on stderr; returns the per-step history."""
    from rapt.numfmt import loss
    from rapt.progress import progress_bar
    from rapt.split import train_split

    bar = progress_bar(total=provider.total_steps, desc="sap tune", unit="step")

    def progress(r: dict) -> None:
        bar.set_postfix(loss=loss(r["loss"]))
        bar.update(1)

    hist = _remote(lambda: train_split(customer, provider, progress=progress))
    bar.close()
    return hist


def _save_tensors(out: Path, customer, provider) -> list[int] | None:
    """Write ``provider.safetensors`` (only for an in-process ``provider``; None: the top stays
    on the service) and ``customer.safetensors`` into ``out``; returns the customer's
    contributing tokens for ``sap.json``."""
    from safetensors.torch import save_file

    if provider is not None:
        save_file(provider.trainable_state(), str(out / "provider.safetensors"))
    cstate = customer.state_dict()
    tensors = {f"head.{k}": v for k, v in cstate["head"].items()}
    tensors.update({f"bottom.{k}": v for k, v in cstate.get("bottom", {}).items()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "customer.safetensors"))
    return cstate["cti_tokens"]


def _client(url: str, key: str | None, bb, remote_backbone: str, no_privacy: bool = False):
    from rapt.client.client import ClientError, RaptClient

    try:
        return RaptClient(url, key, backbone=bb, remote_backbone=remote_backbone,
                          no_privacy=no_privacy)
    except ClientError as e:
        fail(str(e))


def _remote(fn):
    """Run fn; a service or client error becomes one line naming what failed (exit 2)."""
    from rapt.client.client import ClientError, ServiceError

    try:
        return fn()
    except (ClientError, ServiceError) as e:
        fail(str(e))


def _load_artifact(folder: Path, noise_seed: int | None, key: str | None = None,
                   precision: str | None = None):
    import torch
    from safetensors.torch import load_file

    from rapt.split import SplitConfig, load_top, setup_split

    if precision is not None and precision not in PRECISIONS:
        fail(f"--precision must be one of {', '.join(PRECISIONS)} (got {precision!r})")
    meta_path = folder / "sap.json"
    for p in (meta_path, folder / "customer.safetensors"):
        if not p.is_file():
            fail(f"{p}: missing (not a `rapt sap tune` folder?)")
    try:
        doc = json.loads(meta_path.read_text())
        if doc.get("format") != FORMAT:
            raise ValueError(f"field 'format' must be {FORMAT!r}")
        cfg = SplitConfig.from_dict({**doc["config"], "noise_seed": noise_seed,
                                     **({"precision": precision} if precision else {})})
    except (ValueError, KeyError, TypeError) as e:
        fail(f"{meta_path}: {e}")
    bb = load_backbone_or_fail(doc["backbone"])
    remote = doc.get("remote")
    if remote is None and not (folder / "provider.safetensors").is_file():
        fail(f"{folder / 'provider.safetensors'}: missing (not a `rapt sap tune` folder?)")
    if remote is None:
        customer, provider = setup_split(bb, cfg, int(doc["num_labels"]), 1)
    else:  # the top stays on the service: its session answers the queries
        client = _client(remote["url"], key, bb, remote["backbone"], cfg.eta is None)
        customer = _remote(lambda: client.sap_customer(cfg, int(doc["num_labels"])))
        provider = _remote(lambda: client.sap_provider(remote["session"]))
    try:
        if remote is None:
            load_top(provider.top, load_file(str(folder / "provider.safetensors")))
        ct = load_file(str(folder / "customer.safetensors"))
        customer.head.load_state_dict({k[5:]: v for k, v in ct.items() if k.startswith("head.")})
        bottom = {k[7:]: v for k, v in ct.items() if k.startswith("bottom.")}
        if bottom:
            customer.bottom.load_state_dict(bottom)
    except (ValueError, RuntimeError) as e:
        fail(f"{folder}: tensors do not fit this backbone and config ({e})")
    if doc.get("cti_tokens") is not None and cfg.cti:
        from rapt.privacy.cti import CTIResult

        empty = torch.zeros(0)
        customer.cti = CTIResult(0, list(doc["cti_tokens"]), [], 0.0, empty, empty, empty)
    return bb, doc, cfg, customer, provider


@sap_app.command("predict")
def sap_predict(
    artifact: Path = typer.Argument(..., help="folder written by `rapt sap tune`"),
    data: str = typer.Argument(..., help="dataset name or file with texts (labels optional)"),
    split: str = typer.Option("test"),
    limit: int | None = LIMIT,
    text_column: str | None = TEXT_COLUMN,
    label_column: str | None = LABEL_COLUMN,
    fmt: str | None = FORMAT_OPT,
    out: Path | None = typer.Option(None, help="write every prediction to this file, JSONL or "
                                    "CSV by its suffix (default: a summary and the first rows)"),
    noise_seed: int | None = NOISE_SEED,
    min_p: float = MIN_P,
    key: str | None = typer.Option(None, "--key", help="API key of a remote session (a folder "
                                   "from `rapt sap tune --url`; env RAPT_API_KEY)"),
    precision: str | None = with_help(PRECISION, "the customer's bottom (and a local top): "
                                      "fp32 | bf16 | auto (default: the artifact's)"),
) -> None:
    """Predict with a split model; queries are privatized afresh, as in training (SAP §4.5).
    A remote model's top answers from its service session."""
    from rapt.split import encode_texts, predict_split

    warn_if_seeded(noise_seed)
    check_out_or_fail(out)
    bb, doc, cfg, customer, provider = _load_artifact(artifact, noise_seed, key, precision)
    ds = _data(data, split, limit, text_column, label_column, label_names=doc["label_names"],
               fmt=fmt)
    if len(ds) == 0:
        fail(f"{data}: no texts")
    rows = encode_texts(bb.tokenizer, ds.texts, cfg.max_length)
    probs = _remote(lambda: predict_split(customer, provider, rows))
    privacy = customer.privacy_report(rows)  # a fresh draw at the queries' η: same mechanism
    if privacy is not None:
        echo_privacy(privacy, backbone=doc["backbone"], err=True, min_p=min_p,
                     what="query set")
    else:
        typer.echo(f"warning: {artifact} was trained with --no-privacy: queries are used in "
                   "clear text too", err=True)
    from rapt.predictions import Predictions

    labelled = ds.report.get("label_source") is not None
    preds = Predictions(doc["label_names"], probs.tolist(), texts=ds.texts,
                        gold=[e.label for e in ds.examples] if labelled else None)
    echo_predictions(preds, out, eta=cfg.eta, fixes=collapse_fixes(
        method=cfg.method, private=cfg.eta is not None, retune=True))


def _label_attack(ds, bb, cfg) -> None:
    """Train as the customer would (in this process) and run the provider's label inference
    on every ∂l/∂g it received; scored against the true labels."""
    import torch

    from rapt.attacks.label_inference import label_inference_attack
    from rapt.split import encode_texts, setup_split, train_split

    rows = encode_texts(bb.tokenizer, ds.texts, cfg.max_length)
    try:
        customer, provider = setup_split(bb, cfg, ds.num_labels, len(rows))
    except ValueError as err:
        fail(str(err))
    customer.load(rows, ds.labels)
    got: list = []  # (rows, ∂l/∂g) per step, as the provider receives them
    train_split(customer, provider, observe_grad=lambda idx, msg: got.append((idx, msg.grad)))
    r = label_inference_attack([g for _, g in got],
                               [torch.tensor([ds.labels[i] for i in idx]) for idx, _ in got],
                               num_classes=ds.num_labels)
    typer.echo(json.dumps({"attack": "label inference from ∂l/∂g",
                           "split_layer": cfg.split_layer, "eta": cfg.eta,
                           "privatize": cfg.privatize, "epochs": cfg.epochs,
                           "label_dp_epsilon": cfg.label_dp_epsilon, "steps": provider.step,
                           **r.as_dict()}))


@sap_app.command("attack")
def sap_attack(
    data: str = typer.Argument(..., help="dataset name or file whose texts are released"),
    backbone: str = typer.Option("minilm"),
    split_layer: int = typer.Option(0),
    eta: float | None = ETA,
    target_p: float | None = TARGET_P,
    target_ep: float | None = TARGET_EP,
    split: str = typer.Option("train"),
    limit: int = typer.Option(64, help="rows attacked, a random sample (seed 0) in file order"),
    text_column: str | None = TEXT_COLUMN,
    max_length: int = typer.Option(64),
    candidates: int = typer.Option(64, help="optimisation attack: candidates per position "
                                            "(0 = whole vocabulary)"),
    steps: int = typer.Option(100, help="optimisation attack: Adam steps"),
    noise_seed: int | None = typer.Option(None),
    privatize: str = _PRIVATIZE,
    labels: bool = typer.Option(False, "--labels", help="label inference instead: train "
                                "--epochs on the labelled rows, cluster the returned ∂l/∂g"),
    label_column: str | None = LABEL_COLUMN,
    epochs: int = typer.Option(1, help="--labels: training epochs the provider watches"),
    label_dp_epsilon: float | None = _LABEL_DP,
) -> None:
    """Embedding inversion on the bottom's (privatized) release, as the provider would run it:
    nearest neighbour through the embedding layer (split 0) or the optimisation attack of Song
    & Raghunathan (deeper splits). Prints EP = 1 − token accuracy. With ``--labels``: the
    label-inference attack on the loss gradients the customer returns (classes inferred,
    purity, accuracy under the best naming of the clusters)."""
    import torch

    from rapt.attacks.split_inversion import (
        candidate_hits,
        invert_by_optimization,
        invert_embedding_layer,
        score_inversion,
    )
    from rapt.privacy.mechanism import candidate_ids_from_tokenizer
    from rapt.split import encode_texts, setup_split, split_backbone

    warn_if_seeded(noise_seed)
    ds = (_labelled_data(data, split, limit, text_column, label_column) if labels
          else _data(data, split, limit, text_column, None))
    if len(ds) == 0:
        fail(f"{data}: no texts")
    bb = load_backbone_or_fail(backbone)
    e = _eta(bb, eta, target_p, target_ep)
    cfg = _config(split_layer=split_layer, eta=e, max_length=max_length, noise_seed=noise_seed,
                  privatize=privatize, epochs=epochs, label_dp_epsilon=label_dp_epsilon,
                  lr=2e-3, head_lr=1e-2)
    if labels:
        return _label_attack(ds, bb, cfg)
    try:
        customer, _ = setup_split(bb, cfg, 2, 1)
    except ValueError as err:
        fail(str(err))
    rows = encode_texts(bb.tokenizer, ds.texts, max_length)
    acts = customer.encode(rows)
    from rapt.split.customer import _pad

    orig, _ = _pad(rows, bb.tokenizer.pad_token_id)
    bottom = split_backbone(bb, split_layer)[0]
    cand = candidate_ids_from_tokenizer(bb.tokenizer, bb.embeddings.shape[0])
    seen = None
    if split_layer == 0:
        rec = invert_embedding_layer(bottom, acts.hidden, acts.mask, candidate_ids=cand)
    else:
        special = torch.tensor(bb.special_ids)
        known = torch.where(torch.isin(orig, special), orig, torch.full_like(orig, -1))
        rec, cands = invert_by_optimization(bottom, acts.hidden, acts.mask, known=known,
                                            candidate_ids=cand, k=candidates or None,
                                            steps=steps)
        seen = candidate_hits(orig, cands) if cands is not None else None
    r = score_inversion(rec, orig, acts.mask, bb.special_ids, seen)
    typer.echo(json.dumps({"split_layer": split_layer, "eta": e, "privatize": privatize,
                           "measured_p": customer.measured_p if e is not None else 0.0,
                           **r.as_dict()}))
    echo_table_line(backbone, e, err=True)
