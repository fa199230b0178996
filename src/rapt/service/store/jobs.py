"""Jobs in the store, which are the queue: a job row is claimed by one worker with a conditional
update, held by its heartbeat (a lease), cancelled, released when its worker is found dead, and
finished with its prompt."""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa

from rapt.service.store.connection import StoreBase
from rapt.service.store.schema import api_keys, datasets, jobs, new_id, prompts


class QueueFullError(RuntimeError):
    """The job queue holds ``max_queued`` waiting jobs already (or this key its
    ``max_queued_per_key``)."""


class JobStore(StoreBase):
    """The ``jobs`` rows: the queue."""

    def create_job(self, owner: str, dataset_id: str, backbone: str, params: dict, *,
                   max_queued: int | None = None, max_queued_per_key: int | None = None
                   ) -> str:
        """Insert a queued job. With ``max_queued``, raises QueueFullError (nothing stored)
        when that many jobs wait already, or ``max_queued_per_key`` of this owner's (checked
        and inserted in one transaction, so concurrent API processes cannot overfill the
        queue). LookupError: the owner has no such dataset (any more)."""
        jid = new_id("job")
        with self._tx() as conn:
            d = datasets.c
            found = conn.execute(sa.select(d.id).where(
                d.id == dataset_id, d.owner == owner, d.deleted.is_(None))
                .with_for_update(read=True)).first()
            if found is None:
                raise LookupError(f"no dataset '{dataset_id}'")
            if max_queued is not None:
                self._lock_row(conn, "job_queue")
                n = conn.execute(sa.select(sa.func.count()).select_from(jobs)
                                 .where(jobs.c.state == "queued")).scalar()
                if n >= max_queued:
                    raise QueueFullError(
                        f"the job queue is full (limit max_queued_jobs={max_queued} waiting "
                        "jobs); retry when a job has finished")
            if max_queued_per_key is not None:
                self._lock_row(conn, "job_queue")
                n = conn.execute(sa.select(sa.func.count()).select_from(jobs).where(
                    jobs.c.state == "queued", jobs.c.owner == owner)).scalar()
                if n >= max_queued_per_key:
                    raise QueueFullError(
                        f"this key has {n} jobs waiting already (limit "
                        f"max_queued_jobs_per_key={max_queued_per_key}); retry when one has "
                        "started")
            conn.execute(jobs.insert().values(
                id=jid, owner=owner, dataset_id=dataset_id, backbone=backbone,
                params=json.dumps(params), state="queued", created=time.time()))
        return jid

    def delete_job(self, jid: str) -> None:
        self._exec(jobs.delete().where(jobs.c.id == jid, jobs.c.state == "queued"))

    @staticmethod
    def _job(row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row:
            row["params"] = json.loads(row["params"])
            row["stage"] = json.loads(row["stage"]) if row.get("stage") else None
        return row

    def get_job(self, jid: str, owner: str | None) -> dict[str, Any] | None:
        """A job by id; ``owner=None`` only for the worker, which acts for every owner."""
        q = sa.select(jobs).where(jobs.c.id == jid)
        if owner is not None:
            q = q.where(jobs.c.owner == owner)
        return self._job(self._one(q))

    def list_jobs(self, owner: str) -> list[dict[str, Any]]:
        return [self._job(r) for r in self._rows(
            sa.select(jobs).where(jobs.c.owner == owner).order_by(jobs.c.created))]

    def jobs_in_states(self, *states: str) -> list[dict[str, Any]]:
        return [self._job(r) for r in self._rows(
            sa.select(jobs).where(jobs.c.state.in_(states)).order_by(jobs.c.created))]

    def count_jobs(self, state: str) -> int:
        with self._tx() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(jobs)
                                    .where(jobs.c.state == state)).scalar())

    def job_counts(self) -> dict[str, int]:
        """Jobs per state, over all keys (one grouped query: what /metrics reports)."""
        return {r["state"]: int(r["n"]) for r in self._rows(
            sa.select(jobs.c.state, sa.func.count().label("n")).group_by(jobs.c.state))}

    def oldest_queued_created(self) -> float | None:
        """When the longest-waiting queued job was created (None: the queue is empty)."""
        row = self._one(sa.select(sa.func.min(jobs.c.created).label("t"))
                        .where(jobs.c.state == "queued"))
        return row["t"] if row else None

    def epsilon_by_owner(self) -> dict[str, float]:
        """Sum of the ε of each key's DP jobs that spent any (finished or running)."""
        return {r["owner"]: float(r["eps"]) for r in self._rows(
            sa.select(jobs.c.owner, sa.func.sum(jobs.c.epsilon).label("eps"))
            .where(jobs.c.epsilon.is_not(None)).group_by(jobs.c.owner))}

    def update_job(self, jid: str, **fields: Any) -> None:
        """Set columns of a job, whoever runs it (see ``update_claimed`` for workers)."""
        self._exec(jobs.update().where(jobs.c.id == jid).values(**fields))

    # -- the queue: claims, leases, cancellation ----------------------------------------------
    def claim_job(self, jid: str, worker: str) -> dict[str, Any] | None:
        """Claim one queued job for ``worker``; None when another worker was first (or the job
        is no longer queued). Atomic on both backends: the update only matches while the row
        is still 'queued', and the database applies one update to a row at a time."""
        with self._tx() as conn:
            n = conn.execute(jobs.update().where(jobs.c.id == jid, jobs.c.state == "queued")
                             .values(state="running", worker=worker, heartbeat=time.time(),
                                     attempts=jobs.c.attempts + 1)).rowcount
            if n != 1:
                return None
            return self._job(dict(conn.execute(sa.select(jobs).where(jobs.c.id == jid))
                                  .one()._mapping))

    def claim_next(self, worker: str, backbones: list[str] | None = None
                   ) -> dict[str, Any] | None:
        """Claim the next queued job (of one of ``backbones``) for ``worker``, or None.

        Fair between keys: the next job is that of the key with the fewest running jobs,
        then the key whose last job started longest ago (round robin), then the oldest, so
        one key queueing many jobs cannot hold the workers while another key waits.
        PostgreSQL skips rows another worker is claiming (FOR UPDATE SKIP LOCKED) instead of
        waiting on them; the conditional update makes the claim exact on every backend."""
        other = jobs.alias("other")
        running = (sa.select(sa.func.count()).select_from(other)
                   .where(other.c.owner == jobs.c.owner, other.c.state == "running")
                   .scalar_subquery())
        last_start = (sa.select(sa.func.coalesce(sa.func.max(other.c.started), 0.0))
                      .where(other.c.owner == jobs.c.owner).scalar_subquery())
        for _ in range(8):
            q = (sa.select(jobs.c.id).where(jobs.c.state == "queued")
                 .order_by(running, last_start, jobs.c.created).limit(1)
                 .with_for_update(skip_locked=True))
            if backbones is not None:
                q = q.where(jobs.c.backbone.in_(backbones))
            with self._tx() as conn:
                jid = conn.execute(q).scalar()
                if jid is None:
                    return None
                now = time.time()  # started now, for the round robin above
                n = conn.execute(
                    jobs.update().where(jobs.c.id == jid, jobs.c.state == "queued")
                    .values(state="running", worker=worker, heartbeat=now, started=now,
                            attempts=jobs.c.attempts + 1)).rowcount
                if n == 1:
                    return self._job(dict(conn.execute(sa.select(jobs).where(
                        jobs.c.id == jid)).one()._mapping))
        return None  # lost eight races in a row: the caller polls again

    def queued_jobs(self, backbones: list[str] | None = None) -> list[tuple[str, str]]:
        """(id, owner) of the queued jobs (of one of ``backbones``): what a worker checks
        before it asks a job to yield its time slice."""
        q = sa.select(jobs.c.id, jobs.c.owner).where(jobs.c.state == "queued")
        if backbones is not None:
            q = q.where(jobs.c.backbone.in_(backbones))
        return [(r["id"], r["owner"]) for r in self._rows(q)]

    def update_claimed(self, jid: str, worker: str, /, **fields: Any) -> bool:
        """Set columns of a job this worker still holds; False (nothing written) when the
        job's lease went to another worker or the job ended."""
        return self._exec(jobs.update().where(
            jobs.c.id == jid, jobs.c.worker == worker, jobs.c.state == "running")
            .values(**fields)) == 1

    def heartbeat(self, jid: str, worker: str) -> tuple[bool, bool]:
        """Renew this worker's lease on a running job: (still held, cancel requested)."""
        with self._tx() as conn:
            n = conn.execute(jobs.update().where(
                jobs.c.id == jid, jobs.c.worker == worker, jobs.c.state == "running")
                .values(heartbeat=time.time())).rowcount
            if n != 1:
                return False, False
            cancel = conn.execute(sa.select(jobs.c.cancel_requested)
                                  .where(jobs.c.id == jid)).scalar()
        return True, cancel is not None

    def request_cancel(self, jid: str) -> str:
        """Cancel a job: a queued one at once ('cancelled'); a running one is flagged for its
        worker, which stops at its next step ('running'). Returns the state it was in, or
        its final state when it had ended already."""
        with self._tx() as conn:
            now = time.time()
            if conn.execute(jobs.update().where(jobs.c.id == jid, jobs.c.state == "queued")
                            .values(state="cancelled", finished=now, worker=None,
                                    heartbeat=None)).rowcount == 1:
                return "cancelled"
            if conn.execute(jobs.update().where(jobs.c.id == jid, jobs.c.state == "running")
                            .values(cancel_requested=now)).rowcount == 1:
                return "running"
            return conn.execute(sa.select(jobs.c.state).where(jobs.c.id == jid)).scalar()

    def running_jobs(self) -> list[dict[str, Any]]:
        """id, worker, heartbeat, checkpoint (and its step) of every running job (for the
        stale check)."""
        c = jobs.c
        return self._rows(sa.select(c.id, c.worker, c.heartbeat, c.checkpoint, c.checkpoint_step)
                          .where(c.state == "running"))

    def release_stale(self, jid: str, worker: str | None, heartbeat: float | None, /,
                      **fields: Any) -> bool:
        """Take a running job from a worker found dead (its ``worker`` and ``heartbeat`` as
        seen): set ``fields`` (state 'queued' to resume it, or 'failed'). False when the
        worker renewed its lease meanwhile or another worker released it first."""
        c = jobs.c
        return self._exec(jobs.update().where(
            c.id == jid, c.state == "running", c.worker.is_not_distinct_from(worker),
            c.heartbeat.is_not_distinct_from(heartbeat)).values(**fields)) == 1

    def finish_job_with_prompt(self, jid: str, owner: str, backbone: str, num_labels: int,
                               method: str, reconstruction: bool, plain_ids: list[int] | None,
                               path: str, prompt_id: str, elapsed: float,
                               privacy: dict | None = None, *, worker: str | None = None,
                               channel: dict | None = None) -> bool:
        """Record the prompt (with the privacy declaration of the data it was tuned on and the
        channel model it was tuned through, if any) and mark the job succeeded in one
        transaction. With ``worker``, only while that worker
        still holds the job (False, nothing written, otherwise)."""
        now = time.time()
        with self._tx() as conn:
            q = jobs.update().where(jobs.c.id == jid)
            if worker is not None:
                q = q.where(jobs.c.worker == worker, jobs.c.state == "running")
            # A job whose cancel was requested (by its owner, or by revoking its key) after
            # its last step creates no prompt.
            live_key = sa.select(api_keys.c.id).where(api_keys.c.id == jobs.c.owner,
                                                      api_keys.c.revoked.is_(None)).exists()
            q = q.where(jobs.c.cancel_requested.is_(None), live_key)
            n = conn.execute(q.values(state="succeeded", prompt_id=prompt_id, finished=now,
                                      elapsed=elapsed, checkpoint=None, heartbeat=None)).rowcount
            if n != 1:
                return False
            conn.execute(prompts.insert().values(
                id=prompt_id, owner=owner, job_id=jid, backbone=backbone,
                num_labels=num_labels, method=method, reconstruction=int(reconstruction),
                plain_ids=json.dumps(plain_ids) if plain_ids is not None else None, path=path,
                created=now, privacy=json.dumps(privacy) if privacy is not None else None,
                channel=json.dumps(channel) if channel is not None else None))
        return True
