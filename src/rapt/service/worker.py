"""Background job worker: tuning jobs claimed from the store, run by a small thread pool.

The job runner is injected (a callable) so tests can swap the trainer; the default tunes
through ``rapt.pipeline.Customization``. Jobs are claimed from the store (the queue),
progress and checkpoints go to the store; jobs that a restart or a crashed worker interrupted
are resumed from their last checkpoint by any worker, or marked failed with the reason. A job
that ends (succeeded, failed or cancelled) leaves no checkpoint on disk. The same worker runs
inside Ray actors (``rapt.service.jobs``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import shutil
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from rapt.config import tune_config
from rapt.service.channels import recorded_channel
from rapt.service.store import QueueFullError, Store, erase_file, new_id, private_tree

log = logging.getLogger("rapt.service")


@dataclass
class TrainData:
    """What a runner gets: privatized ids (specials included), labels, public plain tokens,
    and the provider's channel model to read the rows back with before tuning (a
    ``rapt.channel.denoiser.Denoiser``; None: tune on the rows as uploaded)."""

    input_ids: list[list[int]]
    labels: list[int]
    num_labels: int
    plain_ids: list[int] | None
    channel: Any = None


class JobRunner(Protocol):
    def __call__(self, backbone: Any, data: TrainData, params: dict[str, Any], *,
                 progress: Callable[[dict], None], should_stop: Callable[[], bool],
                 checkpoint: Callable[[dict], None], resume: dict | None) -> Any:
        """Train and return an object with ``save(folder)`` (a TunedPrompt)."""
        ...


def planned_steps(params: dict[str, Any], n_examples: int) -> int:
    """Optimizer steps a job over ``n_examples`` rows will take, as the trainer plans them
    (:func:`rapt.tuning.tune.planned_steps`; ValueError, naming the field, for a DP batch larger
    than the dataset)."""
    from rapt.tuning.tune import planned_steps as steps_of

    return steps_of(tune_config(params), n_examples)


def default_runner(backbone: Any, data: TrainData, params: dict[str, Any], *,
                   progress: Callable[[dict], None], should_stop: Callable[[], bool],
                   checkpoint: Callable[[dict], None], resume: dict | None) -> Any:
    """Tune with the job's validated parameters (:meth:`rapt.pipeline.Customization.tune`),
    reading the rows back through ``data.channel`` first when there is one (the prompt's meta
    then records it, as `rapt tune --channel` does). No privatizer: the rows arrived
    privatized; the job's privacy declaration stays ``params["privacy"]``."""
    from rapt.pipeline import Customization, Encoding

    config = tune_config(params)
    if not config.checkpoint_every:
        # About ten checkpoints per job, so a restart loses little work; DP jobs too (a resumed
        # DP run counts the steps already taken and draws fresh noise for the rest).
        steps = planned_steps(params, len(data.labels))
        config.checkpoint_every = max(1, math.ceil(steps / 10))
    # Rows of a dataset with plain tokens hold them whether or not the job reconstructs them;
    # the trainer needs them to keep the task head off those positions.
    custom = Customization(backbone, Encoding(config.max_length, data.plain_ids), config,
                           channel=data.channel)
    tuned = custom.tune(data.input_ids, data.labels, data.num_labels, progress=progress,
                        should_stop=should_stop, checkpoint=checkpoint, resume=resume)
    tuned.meta["channel"] = custom.channel_meta()
    # The service holds no label names (they stay with the customer): ids stand in for them.
    tuned.meta["training_check"] = custom.training_check(
        data.input_ids, data.labels, [f"label {i}" for i in range(data.num_labels)])
    return tuned


# run_loop checkpoints once more when should_stop() ends a run, so a job stopped for its time
# slice resumes where it stopped (JobWorker yields only jobs that do).
default_runner.checkpoints_when_stopped = True  # type: ignore[attr-defined]


class _Stopped(Exception):
    """A job stopped (cancel, lost lease, shutdown) while its output denoiser was fitted."""


def fit_output_denoiser_for_job(backbone: Any, data: TrainData, tuned: Any,
                                params: dict[str, Any],
                                progress: Callable[[int, int], None]) -> tuple[Any, dict]:
    """The output denoiser of a job's ``tuned`` prompt (rapt.pipeline.fit_output_denoiser):
    public text of every built-in family (the service does not know the dataset's task),
    privatized at the η and search mode the dataset declared, read through the job's channel
    model when it had one. -> (denoiser, record)."""
    from rapt.pipeline import Customization
    from rapt.pipeline import user_side as pipeline
    from rapt.privacy.nn_search import MODES

    decl = params.get("privacy") or {}
    # the declared search mode when it is one rapt has (a declaration is free text)
    mode = decl.get("nn_mode") if decl.get("nn_mode") in MODES else None
    custom = Customization.create(backbone, eta=float(decl["eta"]), channel=data.channel,
                                  **({"privatizer_mode": mode} if mode else {}))
    return pipeline.fit_output_denoiser(custom, tuned, pipeline.output_denoiser_corpus("user"),
                                        seed=int(params.get("seed", 0)),
                                        rows=pipeline.OUTPUT_DENOISER_ROWS, progress=progress)


__all__ = ["JobRunner", "JobWorker", "QueueFullError", "TrainData", "default_runner",
           "planned_steps"]


def _epochs_done(info: dict, epochs: Any) -> float | None:
    """Epochs completed so far, fractional (``step / total_steps × epochs``): a finished
    one-epoch job reads 1.0, not the 0-based index of the epoch its last step was in."""
    step, total = info.get("step"), info.get("total_steps")
    if epochs and step is not None and total:
        return round(float(epochs) * int(step) / int(total), 4)
    return float(info["epoch"]) if info.get("epoch") is not None else None


@dataclass
class _Run:
    """A claimed job while this worker runs it: its cancel and lost-lease flags, the state to
    resume from, and the clock (seconds; ``elapsed_before``: earlier runs of the job)."""

    job: dict[str, Any]
    cancel: threading.Event  # a cancel was requested (here or through any API process)
    lost: threading.Event  # another worker took the lease: write nothing more
    resume: dict | None
    elapsed_before: float
    t0: float = field(default_factory=time.monotonic)
    last_write: float = 0.0  # monotonic time of the last progress written to the store
    # Its time slice is over and another key's job waits: stop at the next step and go to
    # the back of the queue (resumed from the checkpoint written when it stops).
    yielding: threading.Event = field(default_factory=threading.Event)
    checkpointed: bool = False  # a checkpoint was written during this claim

    @property
    def id(self) -> str:
        return self.job["id"]

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.t0


def _resume_step(job: dict[str, Any]) -> dict[str, int]:
    """The fields that make a requeued job's status show the step it resumes from (its
    checkpoint's), not the later progress its interrupted run wrote; none when unknown."""
    at = job.get("checkpoint_step")
    return {"step": int(at), "resumed_from_step": int(at)} if at is not None else {}


class JobWorker:
    """Runs queued jobs in ``threads`` background threads (the in-process job backend).

    The queue is the store: each thread claims the oldest queued job atomically, so several
    workers (threads, API processes, Ray actors, machines) can share one store without running
    a job twice. A heartbeat thread renews the leases of the jobs this worker runs and picks up
    cancel requests made through any API process; jobs whose worker stopped renewing (a crash,
    a killed process) are taken back and resumed from their last checkpoint by whichever
    worker notices first. ``max_queued`` bounds the jobs waiting in the whole store.

    Time slices (``slice_s`` > 0): a job that has run ``slice_s`` seconds since it was claimed
    while a job of another key waits (seen on two heartbeats in a row) stops at its next step,
    checkpoints and goes back to the queue; ``Store.claim_next`` then serves the key that
    waited (round robin across keys), so one key's long job delays another key's job by about
    one slice, not by its whole run. Only jobs whose runner checkpoints when stopped yield."""

    def __init__(self, store: Store, backbones: dict[str, Any], runner: JobRunner, *,
                 max_queued: int, threads: int = 1, progress_interval_s: float = 0.5,
                 lease_s: float = 30.0, heartbeat_s: float = 1.0, poll_s: float = 0.5,
                 name: str = "", channels: dict[str, Any] | None = None,
                 slice_s: float = 0.0):
        self.store = store
        self.backbones = backbones
        # backbone -> rapt.service.channels.Channel: the channel models jobs may record
        self.channels = dict(channels or {})
        self.runner = runner
        self.max_queued = max_queued
        self.progress_interval_s = progress_interval_s
        self.lease_s, self.heartbeat_s, self.poll_s = lease_s, heartbeat_s, poll_s
        self.slice_s = slice_s
        self._runs: dict[str, _Run] = {}  # running here, for the time-slice check
        self._waiting: set[str] = set()  # other keys' queued jobs seen at the last check
        self._no_yield: set[str] = set()  # jobs that yielded without a checkpoint: never again
        # host:pid:random, so a worker on this host can tell a dead process's leases at once.
        self.worker_id = (f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
                          + (f":{name}" if name else ""))
        self._cond = threading.Condition()
        self._wake = 0
        self._cancel: dict[str, threading.Event] = {}  # running here: cancel requested
        self._lost: dict[str, threading.Event] = {}  # running here: lease taken by another
        self._shutdown = threading.Event()
        self._threads = [threading.Thread(target=self._loop, name=f"rapt-job-{i}", daemon=True)
                         for i in range(threads)]
        self._beat = threading.Thread(target=self._heartbeats, name="rapt-job-heartbeat",
                                      daemon=True)
        self._live: dict[str, dict[str, Any]] = {}  # job id -> latest progress, not yet stored

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self.recover()
        for t in self._threads:
            t.start()
        self._beat.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask running jobs to stop at their next step; those with a checkpoint go back to the
        queue (any worker resumes them), the others are queued to run again from the start."""
        self._shutdown.set()
        with self._cond:
            self._cond.notify_all()
        for t in [*self._threads, self._beat]:
            if t.is_alive():
                t.join(timeout)

    def recover(self) -> None:
        """Take back the jobs of workers that stopped renewing their lease (see
        ``reap_stale``); queued jobs need nothing: the queue is the store."""
        self.reap_stale()

    def _dead(self, job: dict[str, Any], now: float) -> bool:
        hb, w = job["heartbeat"], job["worker"]
        if hb is None or w is None or hb < now - self.lease_s:
            return True
        host, _, rest = w.partition(":")
        pid = rest.split(":", 1)[0]
        if host == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return True  # a process of this host that is gone: no need to wait
            except PermissionError:
                pass
        return False

    def reap_stale(self) -> list[str]:
        """Running jobs whose worker is gone: requeued to resume from their checkpoint, or
        failed with the reason when they had none. Returns the ids taken back."""
        now = time.time()
        taken = []
        for job in self.store.running_jobs():
            if job["worker"] == self.worker_id or not self._dead(job, now):
                continue
            ck = job["checkpoint"]
            if ck and Path(ck).exists():
                fields = {"state": "queued", "worker": None, "heartbeat": None,
                          **_resume_step(job)}
                log.info("job %s: worker %s is gone; resuming from %s", job["id"],
                         job["worker"], ck)
            else:
                fields = {"state": "failed", "finished": time.time(), "worker": None,
                          "heartbeat": None,
                          "error": "interrupted (server restart or crash of its worker) before "
                                   "its first checkpoint; submit the job again"}
            if self.store.release_stale(job["id"], job["worker"], job["heartbeat"], **fields):
                taken.append(job["id"])
                if fields["state"] == "failed":
                    self._drop_checkpoint(job["id"])
        if taken:
            self.wake()
        return taken

    # -- API used by the routes -------------------------------------------------------------
    def wake(self) -> None:
        with self._cond:
            self._wake += 1
            self._cond.notify_all()

    def submit(self, job_id: str) -> None:
        """The job row is queued in the store already: wake a thread to claim it."""
        self.wake()

    def has_room(self) -> bool:
        return self.store.count_jobs("queued") < self.max_queued

    def cancel(self, job_id: str) -> None:
        """Queued jobs are cancelled now; running ones (here or in another worker) stop at
        their next step."""
        if self.store.request_cancel(job_id) == "cancelled":
            self._drop_checkpoint(job_id)  # a job resumed after a restart has one
            return
        ev = self._cancel.get(job_id)
        if ev is not None:
            ev.set()

    def _checkpoint_path(self, job_id: str) -> Path:
        return self.store.files / "checkpoints" / f"{job_id}.pt"

    def _drop_checkpoint(self, job_id: str) -> None:
        """Delete a finished job's checkpoint (model and optimizer state of its data)."""
        path = self._checkpoint_path(job_id)
        for p in (path, path.with_suffix(".tmp")):
            p.unlink(missing_ok=True)
        self.store.update_job(job_id, checkpoint=None)

    def _end(self, job_id: str, **fields: Any) -> bool:
        """Give a job this worker holds its final state (failed or cancelled) with its
        checkpoint erased *first*: a client that sees the job ended never finds its file on
        disk (the other order left a window between the two). False, and the file kept, when
        the lease went to another worker, which resumes from it."""
        if not self.store.update_claimed(job_id, self.worker_id, heartbeat=time.time()):
            return False
        self._erase_checkpoint(job_id)
        return self.store.update_claimed(job_id, self.worker_id, checkpoint=None, **fields)

    def _erase_checkpoint(self, job_id: str) -> None:
        path = self._checkpoint_path(job_id)
        for p in (path, path.with_suffix(".tmp")):
            erase_file(p)

    def live_progress(self, job_id: str) -> dict[str, Any] | None:
        return self._live.get(job_id)

    # -- the worker threads -----------------------------------------------------------------
    def _heartbeats(self) -> None:
        last_reap = time.monotonic()
        while not self._shutdown.wait(self.heartbeat_s):
            for job_id in list(self._lost):
                try:
                    held, cancel = self.store.heartbeat(job_id, self.worker_id)
                except Exception:
                    log.exception("heartbeat of job %s failed", job_id)
                    continue
                if not held and job_id in self._lost:
                    self._lost[job_id].set()
                if cancel and job_id in self._cancel:
                    self._cancel[job_id].set()
            try:
                self._end_slices()
            except Exception:
                log.exception("checking time slices failed")
            if time.monotonic() - last_reap >= min(self.lease_s / 2, 5.0):
                last_reap = time.monotonic()
                try:
                    self.reap_stale()
                except Exception:
                    log.exception("checking for stale jobs failed")

    def _end_slices(self) -> None:
        """Ask the longest-running job whose slice is over to yield, when a job of another key
        has waited since the previous check (a job an idle worker claims at once is no
        reason to yield)."""
        over = [r for r in list(self._runs.values())
                if self.slice_s > 0 and not r.yielding.is_set() and r.id not in self._no_yield
                and time.monotonic() - r.t0 >= self.slice_s
                and (r.checkpointed or getattr(self.runner, "checkpoints_when_stopped", False))]
        if not over:
            self._waiting = set()
            return
        waiting = self.store.queued_jobs(list(self.backbones))
        seen, self._waiting = self._waiting, {jid for jid, _ in waiting}
        for run in sorted(over, key=lambda r: r.t0):
            if any(jid in seen and owner != run.job["owner"] for jid, owner in waiting):
                log.info("job %s: time slice of %.0f s over and another key's job waits; "
                         "it goes to the back of the queue", run.id, self.slice_s)
                run.yielding.set()
                return

    def _loop(self) -> None:
        while not self._shutdown.is_set():
            with self._cond:
                seen = self._wake
            try:
                job = self.store.claim_next(self.worker_id, list(self.backbones))
            except Exception:
                log.exception("claiming a job failed")
                job = None
            if job is None:
                with self._cond:
                    if self._wake == seen and not self._shutdown.is_set():
                        self._cond.wait(self.poll_s)
                continue
            try:
                self._run(job)
            except Exception:  # the worker must survive any job
                log.exception("job %s crashed the worker loop", job["id"])
            finally:
                self._cancel.pop(job["id"], None)
                self._lost.pop(job["id"], None)
                self._runs.pop(job["id"], None)

    def _run(self, job: dict[str, Any]) -> None:
        """Run a job this worker has claimed (state 'running', its lease): train, then save the
        prompt, or leave the job cancelled, failed, requeued or to the worker that took it."""
        run = self._start(job)
        if run is None:
            return
        trained = self._train(run)
        if trained is None or self._ended_without_prompt(run, trained[1]):
            return
        extra = None
        if run.job["params"].get("output_denoiser"):
            extra = self._fit_output_denoiser(run, *trained)
            if extra is None:
                return
        self._publish(run, *trained, extra)

    def _start(self, job: dict[str, Any]) -> _Run | None:
        """The job's run state, its checkpoint read for resuming and its start recorded; None
        when it ended here (an unreadable checkpoint fails it) or the lease is gone."""
        store, me, job_id = self.store, self.worker_id, job["id"]
        cancel = self._cancel.setdefault(job_id, threading.Event())
        lost = self._lost.setdefault(job_id, threading.Event())
        if job["cancel_requested"] is not None:
            cancel.set()
        resume = None
        if job["checkpoint"] and Path(job["checkpoint"]).exists():
            try:
                # The file is the server's own; weights_only still refuses code objects.
                resume = torch.load(job["checkpoint"], weights_only=True)
            except Exception as e:
                self._end(job_id, state="failed", finished=time.time(),
                          error=f"could not read the checkpoint to resume from: {e}")
                return None
        run = _Run(job, cancel, lost, resume, float(job["elapsed"] or 0.0))
        start_step = int(resume.get("step", 0)) if resume is not None else None
        # stage: a stage an earlier run of the job reached is not this run's (yet); step: the
        # one the run starts from, not the last progress an earlier run wrote after it
        at = {"step": start_step} if start_step is not None else {}
        if not store.update_claimed(job_id, me, started=time.time(),
                                    resumed_from_step=start_step, stage=None, **at):
            return None
        self._runs[job_id] = run
        return run

    def _progress(self, run: _Run, info: dict) -> None:
        """The trainer's progress: kept live here, written to the store at most every
        ``progress_interval_s``; a refused write means the lease is lost."""
        now = time.monotonic()
        rec = {"step": int(info.get("step", 0)),
               "total_steps": info.get("total_steps"),
               "loss": float(info["loss"]) if info.get("loss") is not None else None,
               "epoch": _epochs_done(info, run.job["params"].get("epochs")),
               "epsilon": (float(info["epsilon"]) if info.get("epsilon") is not None
                           else None),
               "elapsed": run.elapsed_before + now - run.t0}
        self._live[run.id] = rec
        if now - run.last_write >= self.progress_interval_s:
            run.last_write = now
            if not self.store.update_claimed(run.id, self.worker_id, **rec):
                run.lost.set()

    def _checkpoint(self, run: _Run, state: dict) -> None:
        """Save the trainer's state atomically (0600) and record it with the latest progress."""
        if run.lost.is_set():  # another worker holds the job now: its file, not ours
            return
        path = self._checkpoint_path(run.id)
        ck_step = state.get("step")
        tmp = path.with_suffix(".tmp")
        # 0600 from creation: the state holds what was learnt from the tenant's data.
        with os.fdopen(os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600), "wb") as f:
            torch.save(state, f)
        os.replace(tmp, path)  # atomic: a crash mid-write keeps the previous checkpoint
        run.checkpointed = True
        live = self._live.get(run.id, {})
        if not self.store.update_claimed(run.id, self.worker_id, checkpoint=str(path),
                                         checkpoint_step=(int(ck_step) if ck_step is not None
                                                          else None),
                                         **{k: v for k, v in live.items() if k != "elapsed"},
                                         elapsed=run.elapsed()):
            run.lost.set()
            if self.store.get_job(run.id, None) is None:  # purged meanwhile: leave nothing
                erase_file(path)

    def _should_stop(self, run: _Run) -> bool:
        return (run.cancel.is_set() or run.lost.is_set() or self._shutdown.is_set()
                or run.yielding.is_set())

    def _train(self, run: _Run) -> tuple[TrainData, Any] | None:
        """(the job's data, the runner's result); None when it failed (recorded)."""
        store, me, job = self.store, self.worker_id, run.job
        try:
            # Prompt/prefix tuning share the frozen backbone with inference (no mode change);
            # LoRA/full train a private copy inside the tuner.
            if job["backbone"] not in self.backbones:
                raise LookupError(f"backbone '{job['backbone']}' is not loaded by this server")
            backbone = self.backbones[job["backbone"]]
            # The channel model the job was created with, or a clear failure when this worker
            # holds another one (or none) for its backbone.
            ch = recorded_channel(self.channels, job["backbone"], job["params"].get("channel"),
                                  f"job '{run.id}'")
            d = store.dataset_data(job["dataset_id"])
            train = TrainData(d["input_ids"], d["labels"], d["num_labels"], d["plain_ids"],
                              ch.model if ch is not None else None)
            result = self.runner(
                backbone, train, job["params"], progress=partial(self._progress, run),
                should_stop=partial(self._should_stop, run),
                checkpoint=partial(self._checkpoint, run), resume=run.resume)
        except Exception as e:
            log.error("job %s failed:\n%s", run.id, traceback.format_exc())
            self._live.pop(run.id, None)
            self._end(run.id, state="failed", finished=time.time(), elapsed=run.elapsed(),
                      error=f"{type(e).__name__}: {e}", heartbeat=None)
            return None
        finally:
            live = self._live.pop(run.id, None)
            if live:
                store.update_claimed(run.id, me,
                                     **{k: v for k, v in live.items() if k != "elapsed"})
        return train, result

    def _ended_without_prompt(self, run: _Run, result: Any) -> bool:
        """Settle a run that stopped early: lease lost (left to the new worker), cancelled, or
        stopped by shutdown (requeued: resumed from its checkpoint, else from the start).
        False when the result is a prompt to save."""
        store, me, job_id = self.store, self.worker_id, run.id
        if run.lost.is_set():
            log.warning("job %s: this worker lost its lease; left to its new worker", job_id)
            return True
        elapsed = run.elapsed()
        meta = getattr(result, "meta", None)
        stopped = meta.get("stopped", True) if isinstance(meta, dict) else self._should_stop(run)
        if run.cancel.is_set():
            self._end(job_id, state="cancelled", finished=time.time(), elapsed=elapsed,
                      heartbeat=None)
            return True
        if (self._shutdown.is_set() or run.yielding.is_set()) and stopped:
            if run.yielding.is_set() and not run.checkpointed:
                self._no_yield.add(job_id)  # it would lose its work at every slice
            ck = store.get_job(job_id, None)["checkpoint"]
            if ck and Path(ck).exists():  # back to the queue: any worker resumes it
                store.update_claimed(job_id, me, state="queued", worker=None, heartbeat=None,
                                     elapsed=elapsed, **_resume_step(store.get_job(job_id,
                                                                                   None)))
            else:  # nothing saved yet: run it again from the start
                store.update_claimed(job_id, me, state="queued", worker=None, heartbeat=None,
                                     step=0, loss=None, epoch=None, epsilon=None, elapsed=0.0,
                                     started=None)
            return True
        return False

    def _fit_output_denoiser(self, run: _Run, train: TrainData,
                             result: Any) -> tuple[Any, dict] | None:
        """After training: the prompt's output denoiser fitted on public text at the dataset's
        η (:func:`fit_output_denoiser`, the provider's cost), its progress as the job's stage.
        -> (denoiser, record); None when the job ended here: failed (recorded), cancelled, its
        lease lost, or stopped by shutdown (requeued: resumed from its checkpoint). A time
        slice does not interrupt it: the prompt is trained, the rest is short."""
        store, me = self.store, self.worker_id
        last = [0.0]

        def progress(done: int, total: int) -> None:
            if run.cancel.is_set() or run.lost.is_set() or self._shutdown.is_set():
                raise _Stopped
            now = time.monotonic()
            if now - last[0] >= self.progress_interval_s or done >= total:
                last[0] = now
                stage = {"name": "output_denoiser", "done": done, "total": total,
                         "started": started}
                if not store.update_claimed(run.id, me, stage=json.dumps(stage)):
                    run.lost.set()

        started = time.time()
        try:
            return fit_output_denoiser_for_job(self.backbones[run.job["backbone"]], train,
                                               result, run.job["params"], progress)
        except _Stopped:
            if not run.lost.is_set():  # back in the queue it is no longer in that stage
                store.update_claimed(run.id, me, stage=None)
        except Exception as e:
            log.error("job %s: output denoiser failed:\n%s", run.id, traceback.format_exc())
            self._end(run.id, state="failed", finished=time.time(), elapsed=run.elapsed(),
                      heartbeat=None, error=f"the prompt was tuned but its output denoiser "
                      f"could not be fitted: {type(e).__name__}: {e}; submit the job again, "
                      "or without output_denoiser")
            return None
        self._ended_without_prompt(run, None)
        return None

    def _publish(self, run: _Run, train: TrainData, result: Any,
                 denoiser: tuple[Any, dict] | None = None) -> None:
        """Save the tuned prompt (with its output ``denoiser`` and record, when the job fitted
        one) and finish the job with it, exactly once: a lease lost or a cancel that came
        while it saved leaves no prompt."""
        store, me, job, job_id = self.store, self.worker_id, run.job, run.id
        params = job["params"]
        elapsed = run.elapsed()
        prompt_id = new_id("pr")
        folder = store.files / "prompts" / prompt_id
        try:
            result.save(folder)
            if denoiser is not None:  # the files `rapt tune --output-denoiser` writes in OUT
                from rapt.artifacts import write_output_denoiser

                write_output_denoiser(folder, *denoiser)
            private_tree(folder)  # whatever modes the saver used: 0700 / 0600
            live = self._live.get(job_id)
            if live:  # the last step's progress, which the write interval may have held back
                store.update_claimed(job_id, me, **{k: v for k, v in live.items()
                                                    if k != "elapsed"})
            # As in _end: the checkpoint goes before the job can show succeeded.
            if store.update_claimed(job_id, me, heartbeat=time.time()):
                self._erase_checkpoint(job_id)
            done = store.finish_job_with_prompt(
                job_id, job["owner"], job["backbone"], train.num_labels,
                params.get("method", "prompt"), bool(params.get("reconstruction")),
                train.plain_ids,
                str(folder), prompt_id, elapsed, privacy=params.get("privacy"), worker=me,
                channel=params.get("channel"))
        except Exception as e:
            shutil.rmtree(folder, ignore_errors=True)
            self._end(job_id, state="failed", finished=time.time(), elapsed=elapsed,
                      heartbeat=None, error=f"could not save the tuned prompt: "
                                            f"{type(e).__name__}: {e}")
            return
        if not done:  # the lease went to another worker, or a cancel came, while it saved
            shutil.rmtree(folder, ignore_errors=True)
            row = store.get_job(job_id, None)
            if row is None:  # purged with its key: nothing of it may stay
                erase_file(self._checkpoint_path(job_id))
            elif row["cancel_requested"] is not None:
                self._end(job_id, state="cancelled", finished=time.time(), elapsed=elapsed,
                          heartbeat=None)
            return
        self._drop_checkpoint(job_id)
