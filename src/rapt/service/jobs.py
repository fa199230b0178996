"""Job backends: where tuning jobs run.

* ``InProcessJobs`` (the default, what ``rapt serve`` and ``make demo`` use): the API process
  runs jobs in its own threads (``rapt.service.worker.JobWorker``).
* ``RayJobs`` (``rapt serve --jobs ray [--ray-address auto]``): jobs run in Ray actors, each a
  separate process (on any node of the Ray cluster) holding the backbones and running the same
  ``JobWorker`` loop and runner.

Both claim jobs from the store, which is the queue: progress, checkpoints and cancellation go
through it, so any worker (thread, actor, API process) can resume any job, and API processes
sharing one PostgreSQL store share one queue without running a job twice. An actor that dies
(killed, out of memory, its node lost) stops renewing its leases; Ray restarts it, and it or
any other worker takes its jobs back and resumes them from their last checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Protocol

from rapt.service.store import Store
from rapt.service.worker import JobRunner, JobWorker

log = logging.getLogger("rapt.service")


class JobBackend(Protocol):
    """What the API needs from a job backend (the job rows themselves live in the store)."""

    def start(self) -> None:
        """Start the workers (and take back jobs stranded by dead workers)."""

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the workers; running jobs go back to the queue with their checkpoint."""

    def submit(self, job_id: str) -> None:
        """A job was queued in the store: wake a worker."""

    def cancel(self, job_id: str) -> None:
        """Cancel a queued job now, a running one at its next step (through the store)."""

    def live_progress(self, job_id: str) -> dict[str, Any] | None:
        """Progress newer than the store's copy, when this process runs the job."""


InProcessJobs = JobWorker  # the in-process backend is the worker itself


class _RayWorker:
    """Body of the Ray actor: a store connection, the backbones, a ``JobWorker``."""

    def __init__(self, store_url: str, files: str, backbones: dict[str, Any], runner: Any,
                 device: str, worker_options: dict[str, Any],
                 channels: dict[str, str] | None = None):
        logging.basicConfig(level=logging.INFO)
        os.umask(0o077)  # the actor's files (checkpoints, prompts) are the tenants' data
        self.store = Store(store_url, files=files)
        loaded = {}
        for name, spec in backbones.items():
            if isinstance(spec, str):  # a name or path: loaded here, once per actor
                from rapt.models import load_backbone

                spec = load_backbone(spec, device=device)
            elif isinstance(spec, bytes):  # a loaded backbone the API process sent
                from ray import cloudpickle

                spec = cloudpickle.loads(spec)
            spec.model.eval()
            loaded[name] = spec
        if runner is None:
            from rapt.service.worker import default_runner

            runner = default_runner
        from rapt.service.channels import load_channels

        self.worker = JobWorker(self.store, loaded, runner,
                                channels=load_channels(channels or {}, loaded), **worker_options)
        self.worker.start()

    def worker_id(self) -> str:
        return self.worker.worker_id

    def wake(self) -> None:
        self.worker.wake()

    def stop(self, timeout: float = 30.0) -> None:
        self.worker.stop(timeout)
        self.store.close()


class RayJobs:
    """Tuning jobs in ``actors`` Ray actors (processes), each running a ``JobWorker`` over the
    same store. ``backbones``: name -> loaded Backbone (sent to the actors) or a name/path each
    actor loads itself. ``address``: a running cluster ('auto', 'ray://...'), or None to start
    a local Ray instance in this process. The store must be one every actor can open: a
    PostgreSQL URL across machines, or a SQLite file on one machine. ``channels``: backbone ->
    channel model folder (``rapt adapt``), loaded by each actor on its backbone."""

    def __init__(self, store: Store, backbones: dict[str, Any], runner: JobRunner | None, *,
                 max_queued: int, actors: int = 1, address: str | None = None,
                 actor_options: dict[str, Any] | None = None, device: str = "cpu",
                 threads: int = 1, progress_interval_s: float = 0.5, lease_s: float = 30.0,
                 heartbeat_s: float = 1.0, poll_s: float = 0.5, slice_s: float = 0.0,
                 init_options: dict[str, Any] | None = None,
                 channels: dict[str, str] | None = None):
        from ray import cloudpickle

        self.store = store
        # Serialized now, before the API's micro-batchers hook the models (a hook holds a lock,
        # which does not pickle); names and paths stay names, loaded by each actor.
        self.backbones = {n: b if isinstance(b, str) else cloudpickle.dumps(b)
                          for n, b in backbones.items()}
        self.runner = runner
        self.max_queued = max_queued
        self.n_actors, self.address, self.device = actors, address, device
        self.actor_options = {"num_cpus": 1, "max_restarts": -1, **(actor_options or {})}
        if device.startswith("cuda"):
            self.actor_options.setdefault("num_gpus", 1)
        self.worker_options = {"max_queued": max_queued, "threads": threads,
                               "progress_interval_s": progress_interval_s, "lease_s": lease_s,
                               "heartbeat_s": heartbeat_s, "poll_s": poll_s,
                               "slice_s": slice_s}
        self.init_options = init_options or {}
        self.channels = {n: str(f) for n, f in (channels or {}).items()}
        self.actors: list[Any] = []
        self._backbones_ref: Any = None
        self._started_ray = False

    def start(self) -> None:
        import ray

        if not ray.is_initialized():
            opts = {"include_dashboard": False, "log_to_driver": True, **self.init_options}
            if self.address:
                ray.init(address=self.address, **opts)
            else:
                ray.init(**opts)
            self._started_ray = True
        actor_cls = ray.remote(_RayWorker)
        files = str(self.store.files)
        # Held here for the backend's lifetime: Ray restarts a dead actor from its constructor
        # arguments, which must still be in the object store then (ray-project/ray#53727).
        self._backbones_ref = ray.put(self.backbones)
        self.actors = [
            actor_cls.options(**self.actor_options).remote(
                self.store.url, files, self._backbones_ref, self.runner, self.device,
                {**self.worker_options, "name": f"ray{i}"}, self.channels)
            for i in range(self.n_actors)]
        ids = ray.get([a.worker_id.remote() for a in self.actors], timeout=600)
        log.info("Ray job workers ready: %s", ", ".join(ids))

    def stop(self, timeout: float = 30.0) -> None:
        import ray

        if not self.actors:
            return
        refs = [a.stop.remote(timeout) for a in self.actors]
        try:
            ray.get(refs, timeout=timeout + 10)
        except Exception as e:  # a dead actor cannot stop; its leases expire
            log.warning("stopping Ray job workers: %s", e)
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []
        self._backbones_ref = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def submit(self, job_id: str) -> None:
        for a in self.actors:
            a.wake.remote()  # fire and forget: the actors poll the store anyway

    def has_room(self) -> bool:
        return self.store.count_jobs("queued") < self.max_queued

    def cancel(self, job_id: str) -> None:
        if self.store.request_cancel(job_id) == "cancelled":
            path = self.store.files / "checkpoints" / f"{job_id}.pt"
            for p in (path, path.with_suffix(".tmp")):
                p.unlink(missing_ok=True)
            self.store.update_job(job_id, checkpoint=None)

    def live_progress(self, job_id: str) -> dict[str, Any] | None:
        return None  # the actors write progress to the store every progress_interval_s

    def worker_ids(self, timeout: float = 60.0) -> list[str]:
        """The worker id of each actor (waits for a restarted actor to come back)."""
        import ray

        deadline = time.monotonic() + timeout
        while True:
            try:
                return ray.get([a.worker_id.remote() for a in self.actors],
                               timeout=max(1.0, deadline - time.monotonic()))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                # A restarting actor answers ActorUnavailableError until its new process is up
                # (tens of seconds on a loaded machine: Ray starts its workers niced).
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def make_job_backend(kind: str, store: Store, backbones: dict[str, Any],
                     runner: JobRunner | None, **options: Any) -> JobBackend:
    """``kind``: 'inprocess' or 'ray' (options as the classes take them)."""
    if kind == "inprocess":
        from rapt.service.worker import default_runner

        for k in ("actors", "address", "actor_options", "device", "init_options"):
            options.pop(k, None)
        return InProcessJobs(store, backbones, runner or default_runner, **options)
    if kind == "ray":
        return RayJobs(store, backbones, runner, **options)
    raise ValueError(f"unknown job backend '{kind}' (inprocess or ray)")
