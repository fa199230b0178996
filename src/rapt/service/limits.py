"""Service configuration: resource limits and server settings."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Limits:
    """Hard limits; exceeding one is a 4xx whose detail names the limit and its value."""

    max_upload_bytes: int = 32 * 1024 * 1024  # request body size, bytes
    max_examples: int = 200_000  # rows per uploaded dataset
    max_seq_len: int = 512  # token ids per row (uploads and inference)
    max_queued_jobs: int = 16  # jobs waiting for the worker (running ones not counted)
    max_queued_jobs_per_key: int = 8  # of those, waiting jobs of one API key
    # Optimizer steps one job may plan (checked at creation): a tiny DP sample rate or batch
    # would otherwise hold a worker for days.
    max_steps_per_job: int = 100_000
    max_predict_rows: int = 512  # rows per inference request
    max_inference_queue: int = 4096  # rows waiting for the micro-batcher
    max_datasets_per_key: int = 100  # stored datasets per API key (deleted ones not counted)
    # Stored bytes per key: datasets' token ids + labels (JSON) and SAP sessions' files
    # (uploaded releases, saved state), all counted together.
    max_dataset_bytes_per_key: int = 1 << 30
    max_sap_sessions_per_key: int = 16  # SAP split sessions per API key
    max_sap_release_bytes: int = 1 << 30  # a frozen-bottom session's uploaded release, bytes
    # SAP sessions held in memory (the top's copy and the release); idle ones beyond these are
    # dropped (reloaded from their files when used), busy ones make a new one wait (429).
    max_sap_live_sessions: int = 8  # in all
    max_sap_live_sessions_per_key: int = 2  # of one key
    max_sap_live_bytes: int = 4 << 30  # their tops' and releases' bytes, in all
    # Failed API keys and console sign-ins per client address in any auth_failure_window_s
    # seconds; past it, requests with a key and sign-ins get 429 with Retry-After (0: none).
    max_auth_failures: int = 20
    auth_failure_window_s: float = 300.0


@dataclass
class ServiceConfig:
    """Everything `rapt serve` needs; ``backbones`` are names or paths loaded once at startup."""

    db_path: Path = Path("rapt-service.db")
    backbones: list[str] = field(default_factory=lambda: ["minilm"])
    limits: Limits = field(default_factory=Limits)
    job_threads: int = 1  # concurrent training jobs
    # A running job that has had this many seconds while another key's job waits stops at its
    # next step, checkpoints and goes to the back of the queue (0: jobs run to the end).
    job_slice_s: float = 30.0
    batch_wait_ms: float = 0.0  # extra wait for more requests (0: take what queued up
    # while the previous pass ran, which adds no latency)
    max_batch_rows: int = 64  # rows per inference forward pass
    # False: one pass per distinct prompt in a micro-batch (the reference path, and what the
    # service did before mixed prefix/LoRA passes); kept selectable for benchmarks.
    mixed_passes: bool = True
    device: str = "cpu"
    progress_interval_s: float = 0.5  # minimum time between progress writes to the store
    # Scale-out (docs/SCALING.md): a store URL (sqlite:///path or postgresql://...) instead of
    # db_path, the folder for prompt tensors and checkpoints (shared by every worker; default
    # beside the SQLite file), and the job backend.
    store_url: str | None = None
    files_dir: Path | None = None
    jobs: str = "inprocess"  # or "ray"
    ray_address: str | None = None  # None: a local Ray instance; "auto": the running cluster
    ray_actors: int = 1  # Ray actors (job processes), each holding the backbones
    ray_actor_options: dict = field(default_factory=dict)  # e.g. {"num_cpus": 0.5}
    lease_s: float = 30.0  # a running job whose worker has not renewed its lease this long is
    # taken back and resumed from its checkpoint by another worker
    heartbeat_s: float = 1.0  # lease renewal (and cancel polling) interval
    # A console session ends after this many seconds without a request, and this many after
    # its sign-in whatever its use.
    console_idle_s: float = 30 * 60
    console_session_s: float = 12 * 3600
    # Backbone name -> folder of its channel model from `rapt adapt`: jobs on
    # privatized rows and their prompts' queries are read back through it.
    channels: dict[str, str] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        """Folder holding prompt tensors and job checkpoints (beside a SQLite database)."""
        if self.files_dir is not None:
            return Path(self.files_dir)
        if self.store_url and not self.store_url.startswith("sqlite:///"):
            return Path(os.environ.get("RAPT_FILES", "rapt-service.files"))
        p = Path(self.store_url[len("sqlite:///"):] if self.store_url else self.db_path)
        return p.with_name(p.name + ".files")


def default_db_path() -> Path:
    return Path(os.environ.get("RAPT_DB", "rapt-service.db"))
