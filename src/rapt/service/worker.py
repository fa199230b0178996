"""Background job worker: a bounded queue of tuning jobs run by a small thread pool.

The job runner is injected (a callable) so tests can swap the trainer; the default calls
``rapt.trainer.tune``. Progress and checkpoints go to the store; at startup, jobs that a restart
interrupted are resumed from their last checkpoint, or marked failed with the reason. A job
that ends (succeeded, failed or cancelled) leaves no checkpoint on disk.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import shutil
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from rapt.service.store import Store, new_id

log = logging.getLogger("rapt.service")


@dataclass
class TrainData:
    """What a runner gets: privatized ids (specials included), labels, public plain tokens."""

    input_ids: list[list[int]]
    labels: list[int]
    num_labels: int
    plain_ids: list[int] | None


class JobRunner(Protocol):
    def __call__(self, backbone: Any, data: TrainData, params: dict[str, Any], *,
                 progress: Callable[[dict], None], should_stop: Callable[[], bool],
                 checkpoint: Callable[[dict], None], resume: dict | None) -> Any:
        """Train and return an object with ``save(folder)`` (a TunedPrompt)."""
        ...


def tune_config(params: dict[str, Any]) -> Any:
    """A ``rapt.trainer.TuneConfig`` from a job's validated parameters (raises ValueError)."""
    from rapt.trainer import TuneConfig

    fields = {f.name for f in dataclasses.fields(TuneConfig)}
    kwargs = {k: v for k, v in params.items() if k in fields and k != "dp"}
    if params.get("dp"):
        from rapt.dp import DPConfig

        dp_fields = {f.name for f in dataclasses.fields(DPConfig)}
        kwargs["dp"] = DPConfig(**{k: v for k, v in params["dp"].items()
                                   if k in dp_fields and v is not None})
    return TuneConfig(**kwargs)


def default_runner(backbone: Any, data: TrainData, params: dict[str, Any], *,
                   progress: Callable[[dict], None], should_stop: Callable[[], bool],
                   checkpoint: Callable[[dict], None], resume: dict | None) -> Any:
    """Run ``rapt.trainer.tune`` with the job's validated parameters."""
    from rapt.trainer import tune

    config = tune_config(params)
    if not config.checkpoint_every and config.dp is None:
        # About ten checkpoints per job, so a restart loses little work.
        steps = math.ceil(len(data.labels) / config.batch_size) * config.epochs
        config.checkpoint_every = max(1, math.ceil(steps / 10))
    # Rows of a dataset with plain tokens hold them whether or not the job reconstructs them;
    # the trainer needs them to keep the task head off those positions.
    return tune(backbone, data.input_ids, data.labels, data.num_labels, config,
                plain_ids=data.plain_ids,
                progress=progress, should_stop=should_stop, checkpoint=checkpoint,
                resume=resume)


class QueueFullError(RuntimeError):
    pass


class JobWorker:
    """Runs queued jobs in ``threads`` background threads; at most ``max_queued`` waiting."""

    def __init__(self, store: Store, backbones: dict[str, Any], runner: JobRunner, *,
                 max_queued: int, threads: int = 1, progress_interval_s: float = 0.5):
        self.store = store
        self.backbones = backbones
        self.runner = runner
        self.max_queued = max_queued
        self.progress_interval_s = progress_interval_s
        self._queue: collections.deque[str] = collections.deque()
        self._cond = threading.Condition()
        self._cancel: dict[str, threading.Event] = {}
        self._shutdown = threading.Event()
        self._threads = [threading.Thread(target=self._loop, name=f"rapt-job-{i}", daemon=True)
                         for i in range(threads)]
        self._live: dict[str, dict[str, Any]] = {}  # job id -> latest progress, not yet stored

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self.recover()
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask running jobs to stop at their next step; they stay 'running' in the store so
        that the next start resumes them from their last checkpoint."""
        self._shutdown.set()
        with self._cond:
            self._cond.notify_all()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout)

    def recover(self) -> None:
        """Requeue jobs a previous process left queued or running."""
        for job in self.store.jobs_in_states("queued", "running"):
            if job["state"] == "running":
                ck = job["checkpoint"]
                if not ck or not Path(ck).exists():
                    self.store.update_job(
                        job["id"], state="failed", finished=time.time(),
                        error="interrupted by a server restart before its first checkpoint; "
                              "submit the job again")
                    continue
                self.store.update_job(job["id"], state="queued")
                log.info("resuming job %s from %s", job["id"], ck)
            self._queue.append(job["id"])

    # -- API used by the routes -------------------------------------------------------------
    def submit(self, job_id: str) -> None:
        with self._cond:
            if len(self._queue) >= self.max_queued:
                raise QueueFullError(
                    f"the job queue is full (limit max_queued_jobs={self.max_queued} waiting "
                    "jobs); retry when a job has finished")
            self._queue.append(job_id)
            self._cond.notify()

    def has_room(self) -> bool:
        with self._cond:
            return len(self._queue) < self.max_queued

    def cancel(self, job_id: str) -> None:
        """Queued jobs are cancelled now; running ones stop at their next step."""
        with self._cond:
            if job_id in self._queue:
                self._queue.remove(job_id)
                self.store.update_job(job_id, state="cancelled", finished=time.time())
                self._drop_checkpoint(job_id)  # a job resumed after a restart has one
                return
            self._cancel.setdefault(job_id, threading.Event()).set()

    def _checkpoint_path(self, job_id: str) -> Path:
        return self.store.files / "checkpoints" / f"{job_id}.pt"

    def _drop_checkpoint(self, job_id: str) -> None:
        """Delete a finished job's checkpoint (model and optimizer state of its data)."""
        path = self._checkpoint_path(job_id)
        for p in (path, path.with_suffix(".tmp")):
            p.unlink(missing_ok=True)
        self.store.update_job(job_id, checkpoint=None)

    def live_progress(self, job_id: str) -> dict[str, Any] | None:
        return self._live.get(job_id)

    # -- the worker thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._shutdown.is_set():
            with self._cond:
                while not self._queue and not self._shutdown.is_set():
                    self._cond.wait(0.5)
                if self._shutdown.is_set():
                    return
                job_id = self._queue.popleft()
            try:
                self._run(job_id)
            except Exception:  # the worker must survive any job
                log.exception("job %s crashed the worker loop", job_id)

    def _run(self, job_id: str) -> None:
        store = self.store
        job = store.get_job(job_id, None)
        if job is None or job["state"] != "queued":
            return
        params = job["params"]
        cancel = self._cancel.setdefault(job_id, threading.Event())
        resume = None
        if job["checkpoint"] and Path(job["checkpoint"]).exists():
            try:
                # The file is the server's own; weights_only still refuses code objects.
                resume = torch.load(job["checkpoint"], weights_only=True)
            except Exception as e:
                store.update_job(job_id, state="failed", finished=time.time(),
                                 error=f"could not read the checkpoint to resume from: {e}")
                self._drop_checkpoint(job_id)
                return
        elapsed_before = float(job["elapsed"] or 0.0)
        t0 = time.monotonic()
        start_step = int(resume.get("step", 0)) if resume is not None else None
        store.update_job(job_id, state="running", started=time.time(),
                         resumed_from_step=start_step)
        last_write = [0.0]

        def progress(info: dict) -> None:
            now = time.monotonic()
            rec = {"step": int(info.get("step", 0)),
                   "total_steps": info.get("total_steps"),
                   "loss": float(info["loss"]) if info.get("loss") is not None else None,
                   "epoch": float(info["epoch"]) if info.get("epoch") is not None else None,
                   "epsilon": (float(info["epsilon"]) if info.get("epsilon") is not None
                               else None),
                   "elapsed": elapsed_before + now - t0}
            self._live[job_id] = rec
            if now - last_write[0] >= self.progress_interval_s:
                last_write[0] = now
                store.update_job(job_id, **rec)

        def checkpoint(state: dict) -> None:
            path = self._checkpoint_path(job_id)
            tmp = path.with_suffix(".tmp")
            torch.save(state, tmp)
            os.replace(tmp, path)  # atomic: a crash mid-write keeps the previous checkpoint
            live = self._live.get(job_id, {})
            store.update_job(job_id, checkpoint=str(path),
                             **{k: v for k, v in live.items() if k != "elapsed"},
                             elapsed=elapsed_before + time.monotonic() - t0)

        def should_stop() -> bool:
            return cancel.is_set() or self._shutdown.is_set()

        try:
            # Prompt/prefix tuning share the frozen backbone with inference (no mode change);
            # LoRA/full train a private copy inside the tuner.
            if job["backbone"] not in self.backbones:
                raise LookupError(f"backbone '{job['backbone']}' is not loaded by this server")
            backbone = self.backbones[job["backbone"]]
            d = store.dataset_data(job["dataset_id"])
            train = TrainData(d["input_ids"], d["labels"], d["num_labels"], d["plain_ids"])
            result = self.runner(backbone, train, params, progress=progress,
                                 should_stop=should_stop, checkpoint=checkpoint, resume=resume)
        except Exception as e:
            log.error("job %s failed:\n%s", job_id, traceback.format_exc())
            store.update_job(job_id, state="failed", finished=time.time(),
                             elapsed=elapsed_before + time.monotonic() - t0,
                             error=f"{type(e).__name__}: {e}")
            self._drop_checkpoint(job_id)
            return
        finally:
            live = self._live.pop(job_id, None)
            if live:
                store.update_job(job_id, **{k: v for k, v in live.items() if k != "elapsed"})
        elapsed = elapsed_before + time.monotonic() - t0
        meta = getattr(result, "meta", None)
        stopped = meta.get("stopped", True) if isinstance(meta, dict) else should_stop()
        if cancel.is_set():
            store.update_job(job_id, state="cancelled", finished=time.time(), elapsed=elapsed)
            self._drop_checkpoint(job_id)
            return
        if self._shutdown.is_set() and stopped:
            ck = store.get_job(job_id, None)["checkpoint"]
            if ck and Path(ck).exists():  # stays 'running': resumed from it at the next start
                store.update_job(job_id, elapsed=elapsed)
            else:  # nothing saved yet: run it again from the start
                store.update_job(job_id, state="queued", step=0, loss=None, epoch=None,
                                 epsilon=None, elapsed=0.0, started=None)
            return
        prompt_id = new_id("pr")
        folder = store.files / "prompts" / prompt_id
        try:
            result.save(folder)
            store.finish_job_with_prompt(
                job_id, job["owner"], job["backbone"], train.num_labels,
                params.get("method", "prompt"), bool(params.get("reconstruction")),
                train.plain_ids,
                str(folder), prompt_id, elapsed, privacy=params.get("privacy"))
        except Exception as e:
            shutil.rmtree(folder, ignore_errors=True)
            store.update_job(job_id, state="failed", finished=time.time(), elapsed=elapsed,
                             error=f"could not save the tuned prompt: {type(e).__name__}: {e}")
        self._drop_checkpoint(job_id)
