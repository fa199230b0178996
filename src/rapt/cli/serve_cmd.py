"""`rapt serve` (the provider service, API keys) and `rapt client ...` (the user side)."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from rapt.cli._app import (
    TEXT_PAIR_OPT,
    app,
    check_out_or_fail,
    collapse_fixes,
    echo_collapse,
    echo_data_notes,
    echo_predictions,
    echo_table_line,
    eta_for_target_ep,
    fail,
    flag_words,
    privacy_level,
    sub_app,
    warn_weak_privacy,
)
from rapt.cli.options import (
    ETA,
    LABEL_COLUMN,
    LABEL_NAMES,
    MIN_P,
    NO_PRIVACY,
    TARGET_EP,
    TARGET_P,
    TEXT_COLUMN,
    split_names,
    with_help,
)
from rapt.config import DEFAULT_PLAIN_TOKENS, LR_HELP, METHOD_DEFAULT_HELP, VIRTUAL_TOKENS_HELP
from rapt.config import tune_default as _d
from rapt.privacy.rule import DEFAULT_MIN_P

if TYPE_CHECKING:
    from rapt.service.limits import ServiceConfig

serve_app = sub_app(help="Run the provider service (HTTP API) or manage its API keys.",
                        invoke_without_command=True, no_args_is_help=False)
keys_app = sub_app(help="API keys of the service (stored hashed).", no_args_is_help=True)
client_app = sub_app(help="User side: privatize locally, then upload / tune / predict.",
                         no_args_is_help=True)
serve_app.add_typer(keys_app, name="keys")
app.add_typer(serve_app, name="serve")
app.add_typer(client_app, name="client")

DB_HELP = "SQLite file of the service (env RAPT_DB; default ./rapt-service.db)"
STORE_HELP = ("store URL instead of --db: sqlite:///path or postgresql://user@host/db (env "
              "RAPT_STORE); several `rapt serve` processes may share one PostgreSQL store")
CHANNEL_HELP = ("BACKBONE=FOLDER: the channel model `rapt adapt` built for a loaded backbone "
                "(repeat for several backbones). Jobs on privatized rows read them back through "
                "it before tuning, and their prompts' queries at predict (denoise-then-tune); "
                "refused at start-up if FOLDER is not one or was built on another backbone")
FILES_HELP = ("folder for prompt tensors and job checkpoints (env RAPT_FILES; default beside "
              "the SQLite file, ./rapt-service.files with PostgreSQL); shared by every worker")


def _db(db: Path | None, ctx: typer.Context | None = None) -> Path:
    """The database: ``--db`` given after the subcommand or before it (``rapt serve --db X
    keys add``), else $RAPT_DB, else ./rapt-service.db. Two different ``--db`` are an error."""
    from rapt.service.limits import default_db_path

    outer = (ctx.obj or {}).get("db") if ctx is not None and isinstance(ctx.obj, dict) else None
    if db is not None and outer is not None and Path(db).resolve() != Path(outer).resolve():
        fail(f"--db given twice with different files ({outer} before the subcommand, "
                    f"{db} after it); give it once")
    return db or outer or default_db_path()


def _store_target(db: Path | None, ctx: typer.Context | None, store: str | None = None,
                  files: Path | None = None) -> tuple[str | Path, Path | None]:
    """(store target, files folder): --store (here or before the subcommand) or $RAPT_STORE,
    else the SQLite file of ``_db``. --store and --db together are an error."""
    obj = (ctx.obj or {}) if ctx is not None and isinstance(ctx.obj, dict) else {}
    explicit = store or obj.get("store")
    db_given = db is not None or obj.get("db") is not None
    if explicit and db_given:
        fail("give either --db (a SQLite file) or --store (a URL), not both")
    url = explicit or (None if db_given else os.environ.get("RAPT_STORE") or None)
    files = files or obj.get("files") or (Path(os.environ["RAPT_FILES"])
                                          if os.environ.get("RAPT_FILES") else None)
    return (url if url else _db(db, ctx)), files


def _open_store(db: Path | None, ctx: typer.Context | None, store: str | None = None):
    from rapt.service.store import Store

    target, files = _store_target(db, ctx, store)
    try:
        return Store(target, files=files)
    except ValueError as e:
        fail(str(e))


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@serve_app.callback()
def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", help="interface to listen on"),
    port: int = typer.Option(8000, help="TCP port"),
    db: Path | None = typer.Option(None, help=DB_HELP),
    backbone: list[str] = typer.Option(["minilm"], help="backbone name or path to load "
                                       "(repeat for several)"),
    device: str = typer.Option("cpu"),
    job_threads: int = typer.Option(1, help="training jobs run at once"),
    job_slice_s: float = typer.Option(30.0, help="seconds a job runs while another key's job "
                                      "waits before it yields and requeues (0: never)"),
    max_upload_mb: float = typer.Option(32.0, help="largest request body, MiB"),
    max_seq_len: int = typer.Option(512, help="longest token row accepted"),
    max_queued_jobs: int = typer.Option(16, help="jobs that may wait for the worker"),
    max_queued_jobs_per_key: int = typer.Option(8, help="of those, jobs of one API key"),
    max_steps_per_job: int = typer.Option(100_000, help="optimizer steps one job may plan "
                                          "(checked when it is created)"),
    batch_wait_ms: float = typer.Option(0.0, help="extra micro-batching wait for more "
                                        "requests, ms (0: group what queued during a pass)"),
    max_batch_rows: int = typer.Option(64, help="rows per inference forward pass "
                                       "(1 = no micro-batching)"),
    mixed_passes: bool = typer.Option(True, "--mixed-passes/--per-prompt-passes",
                                      help="rows of different prompts share a forward pass "
                                      "(per-prompt: one pass per prompt, the reference)"),
    max_datasets_per_key: int = typer.Option(100, help="quota: stored datasets per API key"),
    max_dataset_mb_per_key: float = typer.Option(1024.0, help="quota: stored dataset data per "
                                                 "API key, MiB"),
    ssl_keyfile: Path | None = typer.Option(None, help="TLS private key (PEM); serve https "
                                            "with --ssl-certfile"),
    ssl_certfile: Path | None = typer.Option(None, help="TLS certificate chain (PEM)"),
    store: str | None = typer.Option(None, "--store", help=STORE_HELP),
    files: Path | None = typer.Option(None, "--files", help=FILES_HELP),
    jobs: str = typer.Option("inprocess", "--jobs", help="where tuning jobs run: inprocess "
                             "(threads of this process) or ray (Ray actors)"),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster to join "
                                           "('auto': the local one started with `ray start`); "
                                           "default: start a Ray instance in this process"),
    ray_actors: int = typer.Option(1, "--ray-actors", help="Ray actors running jobs (each a "
                                   "process holding the backbones; 1 CPU, or 1 GPU with "
                                   "--device cuda)"),
    lease_s: float = typer.Option(30.0, "--lease-s", help="a running job whose worker has not "
                                  "renewed its lease for this long is resumed by another"),
    channel: list[str] = typer.Option([], "--channel", help=CHANNEL_HELP),
) -> None:
    """Run the provider service: `rapt serve --port 8000 --db service.db --backbone minilm`.
    Create the first API key with `rapt serve --db service.db keys add NAME`. Scaled out:
    `rapt serve --store postgresql://... --files /shared/rapt --jobs ray`, as many processes
    as wanted behind one load balancer (docs/SCALING.md)."""
    ctx.ensure_object(dict).update(db=db, store=store, files=files)
    if ctx.invoked_subcommand is not None:
        return
    channels = _check_serve_options(jobs, ssl_keyfile, ssl_certfile, channel, backbone)
    import uvicorn

    from rapt.service import Limits, ServiceConfig, create_app

    os.umask(0o077)  # every file the service writes holds a tenant's data: 0600 / 0700

    target, files = _store_target(db, None, store, files)
    _check_store_url(target)
    cfg = ServiceConfig(db_path=target if isinstance(target, Path) else Path("rapt-service.db"),
                        store_url=None if isinstance(target, Path) else target,
                        files_dir=files, jobs=jobs, ray_address=ray_address,
                        ray_actors=ray_actors, lease_s=lease_s, channels=channels,
                        backbones=list(backbone), device=device, job_slice_s=job_slice_s,
                        job_threads=job_threads, batch_wait_ms=batch_wait_ms,
                        max_batch_rows=max_batch_rows, mixed_passes=mixed_passes,
                        limits=Limits(max_upload_bytes=int(max_upload_mb * 1024 * 1024),
                                      max_seq_len=max_seq_len,
                                      max_queued_jobs=max_queued_jobs,
                                      max_queued_jobs_per_key=max_queued_jobs_per_key,
                                      max_steps_per_job=max_steps_per_job,
                                      max_datasets_per_key=max_datasets_per_key,
                                      max_dataset_bytes_per_key=int(
                                          max_dataset_mb_per_key * 1024 * 1024)))
    _announce(cfg, host, port, tls=ssl_certfile is not None)
    no_loading_bars()
    tls = ({"ssl_keyfile": str(ssl_keyfile), "ssl_certfile": str(ssl_certfile)}
           if ssl_certfile else {})
    uvicorn.run(create_app(cfg), host=host, port=port, log_level="info", **tls)


def _check_serve_options(jobs: str, ssl_keyfile: Path | None, ssl_certfile: Path | None,
                         channel: list[str], backbones: list[str]) -> dict[str, str]:
    """Exit 2 on a --jobs backend that is unknown or not installed, an incomplete TLS pair, or
    a --channel that is malformed, for a backbone not loaded, not a channel model, or built on
    another backbone; -> {backbone: channel folder}."""
    if jobs not in ("inprocess", "ray"):
        fail(f"--jobs {jobs}: give inprocess or ray")
    if jobs == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            fail("--jobs ray needs Ray: pip install 'rapt[scale]'")
    if (ssl_keyfile is None) != (ssl_certfile is None):
        fail("TLS needs both --ssl-keyfile and --ssl-certfile")
    for f in (ssl_keyfile, ssl_certfile):
        if f is not None and not f.is_file():
            fail(f"{f}: no such file (--ssl-keyfile / --ssl-certfile)")
    from rapt.service.channels import ChannelError, check_channel_folder, parse_channel_specs

    try:
        channels = parse_channel_specs(channel)
        for name, folder in channels.items():
            if name not in backbones:
                raise ChannelError(f"--channel {name}={folder}: backbone {name!r} is not "
                                   f"loaded (--backbone: {', '.join(backbones)}); add "
                                   f"--backbone {name}")
            check_channel_folder(folder, name)
    except ChannelError as e:
        fail(str(e))
    return channels


def _check_store_url(target: str | Path) -> None:
    """Exit 2 on a store URL that ``rapt.service.store`` cannot open (a Path is a SQLite file)."""
    if isinstance(target, Path):
        return
    from rapt.service.store import store_url

    try:
        store_url(target)
    except ValueError as e:
        fail(str(e))


def _announce(cfg: ServiceConfig, host: str, port: int, tls: bool) -> None:
    """Say on stderr where the service keeps its data and where it listens; warn when plain
    http leaves the machine."""
    scheme = "https" if tls else "http"
    if cfg.store_url:
        from rapt.service.store import public_url, store_url

        where = f"store {public_url(store_url(cfg.store_url))}, files {cfg.data_dir}"
    else:
        where = f"db {cfg.db_path}"
    typer.echo(f"rapt service: {where}, jobs {cfg.jobs}, backbones {', '.join(cfg.backbones)}; "
               f"{scheme}://{host}:{port}/docs", err=True)
    for name, folder in cfg.channels.items():
        typer.echo(f"channel model for {name}: {folder} (jobs on privatized rows read them "
                   "back through it unless use_channel is false)", err=True)
    if scheme == "http" and not _loopback(host):
        typer.echo(f"WARNING: serving plain http on {host}: API keys and data cross the network "
                   "readable; use --ssl-keyfile/--ssl-certfile or a TLS-terminating proxy",
                   err=True)


@keys_app.command("add")
def keys_add(ctx: typer.Context,
             name: str = typer.Argument(..., help="a label for the key's owner"),
             admin: bool = typer.Option(False, "--admin", help="an operator key: may also read "
                                        "/v1/stats (counters over all tenants)"),
             db: Path | None = typer.Option(None, help=DB_HELP),
             store: str | None = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Create an API key and print it once (only its SHA-256 hash is stored)."""
    from rapt.service import auth

    st = _open_store(db, ctx, store)
    key = auth.new_key()
    kid = st.add_key(name, auth.hash_key(key), admin=admin)
    st.close()
    typer.echo(f"created {'admin ' if admin else ''}key {kid} for '{name}' in {st.describe()}; "
               "it is shown only this once:", err=True)
    typer.echo(key)


@keys_app.command("list")
def keys_list(ctx: typer.Context, db: Path | None = typer.Option(None, help=DB_HELP),
              store: str | None = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """List key ids, names, creation dates, admin and revoked marks (never the keys)."""
    import datetime

    def when(t: float) -> str:
        return datetime.datetime.fromtimestamp(t).isoformat(" ", "seconds")

    store = _open_store(db, ctx, store)
    for k in store.list_keys():
        marks = (["admin"] if k["admin"] else []) + (
            [f"revoked {when(k['revoked'])}"] if k["revoked"] else [])
        typer.echo("\t".join([k["id"], k["name"], when(k["created"]), *marks]))
    store.close()


def _on_key(ctx: typer.Context, db: Path | None, store_url: str | None, action: str,
            key: str) -> dict:
    """Run the store's ``action`` (``revoke_key`` / ``purge_key``) on ``key``; an unknown key
    or a bad state is the user's error (exit 2), and the store is closed either way."""
    store = _open_store(db, ctx, store_url)
    try:
        return getattr(store, action)(key)
    except (LookupError, ValueError) as e:
        fail(str(e))
    finally:
        store.close()


@keys_app.command("revoke")
def keys_revoke(ctx: typer.Context,
                key: str = typer.Argument(..., help="key id (from `keys list`) or name"),
                db: Path | None = typer.Option(None, help=DB_HELP),
                store: str | None = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Revoke a key: the service refuses it from the next request on, its queued jobs are
    cancelled, its running ones stop at their next step (no prompt), its split sessions are
    deleted. Its datasets and prompts stay until `keys purge`."""
    row = _on_key(ctx, db, store, "revoke_key", key)
    typer.echo(f"revoked key {row['id']} ('{row['name']}'): {len(row['cancelled'])} queued "
               f"job(s) cancelled, {len(row['stopping'])} running job(s) stopping, "
               f"{row['sessions']} split session(s) deleted", err=True)


@keys_app.command("purge")
def keys_purge(ctx: typer.Context,
               key: str = typer.Argument(..., help="key id (from `keys list`) or name"),
               yes: bool = typer.Option(False, "--yes", help="do not ask for confirmation"),
               db: Path | None = typer.Option(None, help=DB_HELP),
               store: str | None = typer.Option(None, "--store", help=STORE_HELP)) -> None:
    """Revoke a key and delete everything it owns: datasets, jobs, prompts, split sessions
    and their files. The key's row stays, revoked. Cannot be undone."""
    if not yes:
        typer.confirm(f"delete everything key '{key}' owns?", abort=True)
    row = _on_key(ctx, db, store, "purge_key", key)
    typer.echo(f"purged key {row['id']} ('{row['name']}'): {row['datasets']} dataset(s), "
               f"{row['jobs']} job(s), {row['prompts']} prompt(s), {row['sessions']} split "
               "session(s) deleted", err=True)


# -- client ----------------------------------------------------------------------------------
URL_OPT = typer.Option(None, "--url", help="service URL (env RAPT_URL)")
KEY_OPT = typer.Option(None, "--key", help="API key (env RAPT_API_KEY)")
ETA_OPT = ETA
TARGET_P_OPT = TARGET_P
TARGET_EP_OPT = TARGET_EP
JSON_OPT = typer.Option(False, "--json-report", help="also print one JSON line with the privacy "
                        "report (η, measured P, nearest-neighbour inversion success); it stays "
                        "on this machine")
NOPRIV_OPT = with_help(NO_PRIVACY, "send token ids unprivatized (the default is P ≈ 0.6, or "
                       "for predict the η recorded with the prompt's training data)")
BB_OPT = typer.Option("minilm", "--backbone",
                      help="local copy of the service's backbone (tokenizer + embeddings)")
PAD_OPT = typer.Option(None, "--pad-to-bucket", min=1, help="pad every row sent to a multiple "
                       "of this many tokens, so the wire shows length buckets, not lengths "
                       "(the service strips the padding: the provider still learns lengths)")
MIN_P_OPT = MIN_P


def _client(url, key, backbone="minilm", eta=None, no_privacy=False, seed=None,
            min_p=DEFAULT_MIN_P,
            target_p=None, plain_tokens=DEFAULT_PLAIN_TOKENS, pad_to_bucket=None):
    from rapt.client.client import ClientError, RaptClient

    no_loading_bars()
    try:
        with _privacy_warnings():
            return RaptClient(url, key, backbone=backbone, eta=eta, target_p=target_p,
                              no_privacy=no_privacy, seed=seed, min_p=min_p,
                              plain_tokens=plain_tokens, pad_to_bucket=pad_to_bucket)
    except ClientError as e:
        fail(str(e))


def no_loading_bars() -> None:
    """Silence transformers' "Loading weights" bar: the client and the service load a backbone
    as a detail of their work, and the bar would sit among their own lines (or flood a log)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a dependency
        return
    hf_logging.disable_progress_bar()


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

    from rapt.privacy.attack_table import strongest_at
    from rapt.privacy.mechanism import privacy_line

    r = c.last_privacy
    table = None
    if r and r["no_privacy"]:
        typer.echo(f"{r['what']}: {r['rows']} rows sent in clear text (--no-privacy): no "
                   "privacy", err=True)
    elif r:
        src = r.get("eta_source") or ""
        note = (f" (η recorded on the service with {src})" if src.startswith("prompt")
                else " (the default level)" if src == "default" else "")
        typer.echo(f"{r['what']}: {r['rows']} rows privatized; {privacy_line(r)}{note}",
                   err=True)
        echo_table_line(c.backbone.name, r["eta"], err=True)
        warn_weak_privacy(r, backbone=c.backbone.name, min_p=r.get("min_p"),
                          what={"upload": "training data", "predict": "query set"}[r["what"]])
        table = asdict(strongest_at(c.backbone.name, r["eta"]))
    if json_report and r:
        typer.echo(json.dumps({"privacy": r, "attack_table": table}))


@client_app.command("upload")
def client_upload(
    file: str = typer.Argument(..., help="labelled CSV / TSV / JSONL file (or a built-in name)"),
    eta: float | None = ETA_OPT, no_privacy: bool = NOPRIV_OPT, backbone: str = BB_OPT,
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
    url: str | None = URL_OPT, key: str | None = KEY_OPT,
) -> None:
    """Privatize FILE here and upload only the privatized token ids; prints the dataset id,
    and on stderr η, the measured P and the nearest-neighbour inversion success."""
    from rapt.data import load_dataset

    # the client warns of --no-privacy itself, before anything is sent
    target_p = privacy_level(eta, target_p, target_ep, no_privacy, clear=None)
    if target_ep is not None:
        eta = eta_for_target_ep(backbone, target_ep)
    c = _client(url, key, backbone, eta, no_privacy, seed, min_p, target_p=target_p,
                plain_tokens=plain_len, pad_to_bucket=pad_to_bucket)
    data = _guard(lambda: load_dataset(file, text_column=text_column, label_column=label_column,
                                       text_pair_column=text_pair_column, limit=limit))
    echo_data_notes(data)
    ds = _guard(lambda: c.upload(data, reconstruction=reconstruction, max_length=max_length))
    typer.echo(ds)
    _echo_privacy(c, json_report)


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
    dp_epsilon: float | None = typer.Option(None, help="PromptDPSGD: target ε (at δ = "
                                            "min(1e-5, 1/(10·N)) for N rows)"),
    dp_noise: float | None = typer.Option(None, help="PromptDPSGD: noise multiplier σ"),
    dp_clip: float | None = typer.Option(None, help="PromptDPSGD: per-example clipping norm C "
                                         "(default 1)"),
    wait: bool = typer.Option(False, help="poll with a progress bar until the job ends"),
    url: str | None = URL_OPT, key: str | None = KEY_OPT,
) -> None:
    """Start a tuning job on an uploaded dataset; prints the job id (and waits with --wait)."""
    c = _client(url, key)
    dp = None
    if dp_epsilon is not None or dp_noise is not None:
        dp = {k: v for k, v in (("target_epsilon", dp_epsilon), ("noise_multiplier", dp_noise),
                                ("max_grad_norm", dp_clip)) if v is not None}
    job = _guard(lambda: c.tune(dataset_id, method=method, reconstruction=reconstruction,
                                epochs=epochs, lr=lr, batch_size=batch_size,
                                num_virtual_tokens=num_virtual_tokens, max_length=max_length,
                                seed=seed, dp=dp))
    typer.echo(job)
    _echo_job_setup(c, job, dataset_id, given_method=method is not None, dp=dp is not None)
    if wait:
        st = _guard(lambda: c.wait(job))
        info = _guard(lambda: c.prompt(st["prompt_id"])) if st["state"] == "succeeded" else {}
        if info.get("head"):
            typer.echo(f"head: {info['head']}", err=True)
        typer.echo(json.dumps(st, indent=1))
        if st["state"] != "succeeded":
            raise typer.Exit(1)
        _echo_training_check(c, st, info)


def _echo_job_setup(c, job: str, dataset_id: str, *, given_method: bool, dp: bool) -> None:
    """Stderr, as `rapt tune` prints them: the job's method (and that it is the default) and
    the privacy of the rows it trains on, as their upload declared it."""
    st = _guard(lambda: c.status(job))
    typer.echo(f"method: {st['method']}" + ("" if given_method else " (default" + (
        " under DP" if dp else "") + "; --method prompt | prefix | lora)"), err=True)
    decl = _guard(lambda: c.dataset(dataset_id)).get("privacy") or {}
    if decl.get("mechanism") == "dchi-text2text":
        typer.echo(f"privacy: η = {decl['eta']:.4g} (declared with dataset {dataset_id} at "
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


@client_app.command("predict")
def client_predict(
    prompt_id: str,
    inputs: list[str] = typer.Argument(..., help="a file of queries, or query texts"),
    eta: float | None = with_help(ETA, "dχ-privacy parameter η used to privatize the queries "
                                  "locally (default: the η recorded on the service with the "
                                  "prompt's training data)"),
    no_privacy: bool = NOPRIV_OPT, backbone: str = BB_OPT,
    min_p: float = MIN_P_OPT, json_report: bool = JSON_OPT,
    text_column: str | None = with_help(TEXT_COLUMN, "text column/key of a query file"),
    text_pair_column: str | None = TEXT_PAIR_OPT, pad_to_bucket: int | None = PAD_OPT,
    label_column: str | None = with_help(LABEL_COLUMN, "gold labels of a query file, if any: "
                                         "accuracy and a confusion table are printed"),
    label_names: str | None = with_help(LABEL_NAMES, "comma-separated label names in id order "
                                        "(default: those recorded on this machine when the "
                                        "prompt's dataset was uploaded from it)"),
    out: Path | None = typer.Option(None, "--out", help="write every prediction to this file, "
                                    "JSONL or CSV by its suffix (default: a summary and the "
                                    "first rows)"),
    url: str | None = URL_OPT, key: str | None = KEY_OPT,
) -> None:
    """Privatize each query here, classify it with a tuned prompt; prints a summary and the
    first rows (or writes them all with --out), by label name, and on stderr η, the measured P
    and the nearest-neighbour inversion success."""
    from rapt.data import load_dataset
    from rapt.predictions import Predictions

    check_out_or_fail(out)
    c = _client(url, key, backbone, eta, no_privacy, min_p=min_p, pad_to_bucket=pad_to_bucket)
    names = split_names(label_names) or _guard(lambda: c.label_names_for(prompt_id))
    src = inputs[0] if len(inputs) == 1 and os.path.exists(inputs[0]) else inputs
    if not isinstance(src, list):
        src = _guard(lambda: load_dataset(src, text_column=text_column, label_names=names,
                                          text_pair_column=text_pair_column,
                                          label_column=label_column))
        echo_data_notes(src)
    pred = _guard(lambda: c.predict(prompt_id, src, label_names=names))
    if pred.label_names is None:
        typer.echo("note: no label names recorded for this prompt on this machine (its dataset "
                   "was uploaded elsewhere): labels are shown as ids; pass --label-names",
                   err=True)
    preds = _guard(lambda: Predictions(
        pred.label_names or [str(i) for i in range(len(pred.probabilities[0]))],
        pred.probabilities, texts=pred.texts, text_pairs=pred.text_pairs, gold=pred.gold))
    info = c.prompt(prompt_id)
    echo_predictions(preds, out, eta=c.eta, fixes=collapse_fixes(
        method=info.get("method"), retune=True,
        private=(info.get("privacy") or {}).get("mechanism") == "dchi-text2text"))
    _echo_privacy(c, json_report)
