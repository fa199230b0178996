"""Persistent store: SQLite (WAL) for keys, datasets, jobs and prompts.

Prompt tensors live beside the database as safetensors folders (``<db>.files/prompts/<id>``),
job checkpoints as ``<db>.files/checkpoints/<job id>.pt``. Every lookup of a user object takes
the owner's key id, so one key can never read another key's rows.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, key_hash TEXT NOT NULL UNIQUE,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS datasets (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL REFERENCES api_keys(id), backbone TEXT NOT NULL,
    n_examples INTEGER NOT NULL, num_labels INTEGER NOT NULL, max_row_len INTEGER NOT NULL,
    privacy TEXT NOT NULL, plain_ids TEXT, data TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL REFERENCES api_keys(id),
    dataset_id TEXT NOT NULL REFERENCES datasets(id), backbone TEXT NOT NULL,
    params TEXT NOT NULL, state TEXT NOT NULL, step INTEGER NOT NULL DEFAULT 0,
    total_steps INTEGER, loss REAL, epoch REAL, epsilon REAL,
    elapsed REAL NOT NULL DEFAULT 0,
    started REAL, finished REAL, checkpoint TEXT, resumed_from_step INTEGER,
    prompt_id TEXT, error TEXT, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS prompts (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL REFERENCES api_keys(id),
    job_id TEXT NOT NULL REFERENCES jobs(id), backbone TEXT NOT NULL,
    num_labels INTEGER NOT NULL, method TEXT NOT NULL, reconstruction INTEGER NOT NULL,
    plain_ids TEXT, path TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
"""

TABLES = ("api_keys", "datasets", "jobs", "prompts")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


class Store:
    """Thread-safe access to the SQLite file (one connection, serialized by a lock)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.files = self.path.with_name(self.path.name + ".files")
        (self.files / "prompts").mkdir(parents=True, exist_ok=True)
        (self.files / "checkpoints").mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30.0,
                                   isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _exec(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._db.execute(sql, args)

    def _one(self, sql: str, args: tuple = ()) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(sql, args).fetchone()
        return dict(row) if row is not None else None

    def counts(self) -> dict[str, int]:
        """Row count per table (tests compare these before/after a rejected request)."""
        return {t: self._one(f"SELECT COUNT(*) AS n FROM {t}")["n"] for t in TABLES}

    # -- keys -------------------------------------------------------------------------------
    def add_key(self, name: str, key_hash: str) -> str:
        kid = new_id("key")
        self._exec("INSERT INTO api_keys VALUES (?,?,?,?)", (kid, name, key_hash, time.time()))
        return kid

    def owner_of_hash(self, key_hash: str) -> str | None:
        row = self._one("SELECT id FROM api_keys WHERE key_hash=?", (key_hash,))
        return row["id"] if row else None

    def list_keys(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT id, name, created FROM api_keys ORDER BY created")
            return [dict(r) for r in rows.fetchall()]

    # -- datasets ---------------------------------------------------------------------------
    def create_dataset(self, owner: str, backbone: str, input_ids: list[list[int]],
                       labels: list[int], num_labels: int, privacy: dict,
                       plain_ids: list[int] | None) -> str:
        did = new_id("ds")
        data = json.dumps({"input_ids": input_ids, "labels": labels}, separators=(",", ":"))
        self._exec(
            "INSERT INTO datasets VALUES (?,?,?,?,?,?,?,?,?,?)",
            (did, owner, backbone, len(labels), num_labels, max(map(len, input_ids)),
             json.dumps(privacy), json.dumps(plain_ids) if plain_ids is not None else None,
             data, time.time()))
        return did

    def get_dataset(self, did: str, owner: str) -> dict[str, Any] | None:
        row = self._one("SELECT id, owner, backbone, n_examples, num_labels, max_row_len, "
                        "privacy, plain_ids, created FROM datasets WHERE id=? AND owner=?",
                        (did, owner))
        if row:
            row["privacy"] = json.loads(row["privacy"])
            row["plain_ids"] = json.loads(row["plain_ids"]) if row["plain_ids"] else None
        return row

    def dataset_data(self, did: str) -> dict[str, Any]:
        """input_ids, labels, num_labels, plain_ids of a dataset (worker use: the owner was
        checked when the job was created)."""
        row = self._one("SELECT data, num_labels, plain_ids FROM datasets WHERE id=?", (did,))
        if row is None:
            raise KeyError(f"dataset {did} is gone")
        out = json.loads(row["data"])
        out["num_labels"] = int(row["num_labels"])
        out["plain_ids"] = json.loads(row["plain_ids"]) if row["plain_ids"] else None
        return out

    # -- jobs -------------------------------------------------------------------------------
    def create_job(self, owner: str, dataset_id: str, backbone: str, params: dict) -> str:
        jid = new_id("job")
        self._exec("INSERT INTO jobs (id, owner, dataset_id, backbone, params, state, created) "
                   "VALUES (?,?,?,?,?,?,?)",
                   (jid, owner, dataset_id, backbone, json.dumps(params), "queued", time.time()))
        return jid

    def delete_job(self, jid: str) -> None:
        self._exec("DELETE FROM jobs WHERE id=? AND state='queued'", (jid,))

    def _job(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row:
            row["params"] = json.loads(row["params"])
        return row

    def get_job(self, jid: str, owner: str | None) -> dict[str, Any] | None:
        """A job by id; ``owner=None`` only for the worker, which acts for every owner."""
        if owner is None:
            return self._job(self._one("SELECT * FROM jobs WHERE id=?", (jid,)))
        return self._job(self._one("SELECT * FROM jobs WHERE id=? AND owner=?", (jid, owner)))

    def list_jobs(self, owner: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM jobs WHERE owner=? ORDER BY created",
                                    (owner,)).fetchall()
        return [self._job(dict(r)) for r in rows]

    def jobs_in_states(self, *states: str) -> list[dict[str, Any]]:
        q = ",".join("?" * len(states))
        with self._lock:
            rows = self._db.execute(f"SELECT * FROM jobs WHERE state IN ({q}) ORDER BY created",
                                    states).fetchall()
        return [self._job(dict(r)) for r in rows]

    def update_job(self, jid: str, **fields: Any) -> None:
        cols = ", ".join(f"{k}=?" for k in fields)
        self._exec(f"UPDATE jobs SET {cols} WHERE id=?", (*fields.values(), jid))

    def finish_job_with_prompt(self, jid: str, owner: str, backbone: str, num_labels: int,
                               method: str, reconstruction: bool, plain_ids: list[int] | None,
                               path: str, prompt_id: str, elapsed: float) -> None:
        """Record the prompt and mark the job succeeded in one transaction."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO prompts VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (prompt_id, owner, jid, backbone, num_labels, method, int(reconstruction),
                     json.dumps(plain_ids) if plain_ids is not None else None, path, now))
                self._db.execute(
                    "UPDATE jobs SET state='succeeded', prompt_id=?, finished=?, elapsed=?, "
                    "checkpoint=NULL WHERE id=?", (prompt_id, now, elapsed, jid))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # -- prompts ----------------------------------------------------------------------------
    def get_prompt(self, pid: str, owner: str) -> dict[str, Any] | None:
        row = self._one("SELECT * FROM prompts WHERE id=? AND owner=?", (pid, owner))
        if row:
            row["plain_ids"] = json.loads(row["plain_ids"]) if row["plain_ids"] else None
            row["reconstruction"] = bool(row["reconstruction"])
        return row
