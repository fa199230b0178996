"""`rapt serve`: run the provider service (HTTP API); where its store is, for `rapt serve keys`
too."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from rapt.cli._app import app, fail, no_loading_bars, sub_app

if TYPE_CHECKING:
    from rapt.service.limits import ServiceConfig

serve_app = sub_app(help="Run the provider service (HTTP API) or manage its API keys.",
                    invoke_without_command=True, no_args_is_help=False)
app.add_typer(serve_app, name="serve")

DB_HELP = "SQLite file of the service (env RAPT_DB; default ./rapt-service.db)"
STORE_HELP = ("store URL instead of --db: sqlite:///path or postgresql://user@host/db (env "
              "RAPT_STORE); several `rapt serve` processes may share one PostgreSQL store")
CHANNEL_HELP = ("BACKBONE=FOLDER: the channel model `rapt adapt` built for a loaded backbone "
                "(repeat for several backbones). Jobs on privatized rows read them back through "
                "it before tuning, and their prompts' queries at predict (denoise-then-tune); "
                "refused at start-up if FOLDER is not one or was built on another backbone")
AUTH_FAILURES_HELP = ("failed API keys and console sign-ins one client address may send in "
                      "--auth-window-s; past it, 429 with Retry-After (0: no limit)")
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


def store_target(db: Path | None, ctx: typer.Context | None, store: str | None = None,
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
    max_auth_failures: int = typer.Option(20, help=AUTH_FAILURES_HELP),
    auth_window_s: float = typer.Option(300.0, help="the window of --max-auth-failures, s"),
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
    from rapt.service import Limits, ServiceConfig

    os.umask(0o077)  # every file the service writes holds a tenant's data: 0600 / 0700

    target, files = store_target(db, None, store, files)
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
                                          max_dataset_mb_per_key * 1024 * 1024),
                                      max_auth_failures=max_auth_failures,
                                      auth_failure_window_s=auth_window_s))
    _run(cfg, host, port, ssl_keyfile, ssl_certfile)


def _run(cfg: ServiceConfig, host: str, port: int, ssl_keyfile: Path | None,
         ssl_certfile: Path | None) -> None:
    """Say where the service is, and serve it (https with a key and certificate)."""
    import uvicorn

    from rapt.service import create_app

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
               f"API docs {scheme}://{host}:{port}/docs, console {scheme}://{host}:{port}/console",
               err=True)
    for name, folder in cfg.channels.items():
        typer.echo(f"channel model for {name}: {folder} (jobs on privatized rows read them "
                   "back through it unless use_channel is false)", err=True)
    if scheme == "http" and not _loopback(host):
        typer.echo(f"WARNING: serving plain http on {host}: API keys and data cross the network "
                   "readable; use --ssl-keyfile/--ssl-certfile or a TLS-terminating proxy",
                   err=True)
