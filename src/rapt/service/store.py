"""Persistent store: SQLite (WAL) for keys, datasets, jobs and prompts.

Prompt tensors live beside the database as safetensors folders (``<db>.files/prompts/<id>``),
job checkpoints as ``<db>.files/checkpoints/<job id>.pt``. Every lookup of a user object takes
the owner's key id, so one key can never read another key's rows.

The database file is created 0600 and the folders the store creates 0700: they hold every
tenant's data. Deleted rows are overwritten in the file (``secure_delete``).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, key_hash TEXT NOT NULL UNIQUE,
    created REAL NOT NULL, admin INTEGER NOT NULL DEFAULT 0, revoked REAL);
CREATE TABLE IF NOT EXISTS datasets (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL REFERENCES api_keys(id), backbone TEXT NOT NULL,
    n_examples INTEGER NOT NULL, num_labels INTEGER NOT NULL, max_row_len INTEGER NOT NULL,
    privacy TEXT NOT NULL, plain_ids TEXT, data TEXT NOT NULL, created REAL NOT NULL,
    bytes INTEGER, deleted REAL);
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
    plain_ids TEXT, path TEXT NOT NULL, created REAL NOT NULL, privacy TEXT);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
"""

# SAP split sessions (issue 11): one statement of its own. The session's top state and the
# frozen release live as files under <db>.files/sap/<id>/; last_step mirrors the state file.
SAP_SCHEMA = """
CREATE TABLE IF NOT EXISTS sap_sessions (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL REFERENCES api_keys(id), backbone TEXT NOT NULL,
    config TEXT NOT NULL, n_examples INTEGER NOT NULL, total_steps INTEGER NOT NULL,
    last_step INTEGER NOT NULL, rows_received INTEGER NOT NULL, path TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL);
"""

TABLES = ("api_keys", "datasets", "jobs", "prompts", "sap_sessions")

# Columns added after the first release: (table, column, type), added to older files on open.
MIGRATIONS = (("api_keys", "admin", "INTEGER NOT NULL DEFAULT 0"),
              ("api_keys", "revoked", "REAL"),
              ("datasets", "bytes", "INTEGER"),
              ("datasets", "deleted", "REAL"),
              ("prompts", "privacy", "TEXT"))


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


class QuotaError(Exception):
    """A per-key storage quota would be exceeded (message names the quota)."""


def _private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) 0700; a folder that exists keeps its mode."""
    if not path.exists():
        _private_dir(path.parent)
        path.mkdir(mode=0o700, exist_ok=True)


def _private_file(path: Path) -> None:
    """Create ``path`` 0600 if missing, and tighten it to 0600 if it exists."""
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    os.chmod(path, 0o600)


class Store:
    """Thread-safe access to the SQLite file (one connection, serialized by a lock)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        _private_dir(self.path.parent)
        self.files = self.path.with_name(self.path.name + ".files")
        for d in (self.files, self.files / "prompts", self.files / "checkpoints"):
            _private_dir(d)
        os.chmod(self.files, 0o700)
        _private_file(self.path)
        for suffix in ("-wal", "-shm"):  # SQLite creates these with the database file's mode
            side = self.path.with_name(self.path.name + suffix)
            if side.exists():
                os.chmod(side, 0o600)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30.0,
                                   isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._db.execute("PRAGMA secure_delete=ON")
        self._db.executescript(SCHEMA)
        self._db.executescript(SAP_SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        with self._lock:
            for table, column, kind in MIGRATIONS:
                have = {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def _transaction(self):
        """``with self._transaction():`` one write transaction (BEGIN IMMEDIATE ... COMMIT)."""
        return _Transaction(self)

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
    def add_key(self, name: str, key_hash: str, admin: bool = False) -> str:
        kid = new_id("key")
        self._exec("INSERT INTO api_keys (id, name, key_hash, created, admin) "
                   "VALUES (?,?,?,?,?)", (kid, name, key_hash, time.time(), int(admin)))
        return kid

    def owner_of_hash(self, key_hash: str) -> str | None:
        """The key id of a valid (not revoked) key."""
        row = self._one("SELECT id FROM api_keys WHERE key_hash=? AND revoked IS NULL",
                        (key_hash,))
        return row["id"] if row else None

    def is_admin(self, kid: str) -> bool:
        row = self._one("SELECT admin FROM api_keys WHERE id=? AND revoked IS NULL", (kid,))
        return bool(row and row["admin"])

    def list_keys(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT id, name, created, admin, revoked FROM api_keys "
                                    "ORDER BY created")
            return [dict(r) for r in rows.fetchall()]

    def revoke_key(self, ref: str) -> dict[str, Any]:
        """Revoke the key with id ``ref``, or the one live key named ``ref``; returns its row.
        Raises LookupError (no such key) or ValueError (the name is ambiguous)."""
        with self._lock:
            rows = [dict(r) for r in self._db.execute(
                "SELECT id, name, revoked FROM api_keys WHERE id=? OR (name=? AND revoked IS "
                "NULL)", (ref, ref)).fetchall()]
            exact = [r for r in rows if r["id"] == ref]
            rows = exact or rows
            if not rows:
                raise LookupError(f"no key with id or name '{ref}' (see `keys list`)")
            if len(rows) > 1:
                raise ValueError(f"several keys are named '{ref}' "
                                 f"({', '.join(r['id'] for r in rows)}); give the key id")
            if rows[0]["revoked"] is None:
                self._db.execute("UPDATE api_keys SET revoked=? WHERE id=?",
                                 (time.time(), rows[0]["id"]))
            return rows[0]

    # -- datasets ---------------------------------------------------------------------------
    def create_dataset(self, owner: str, backbone: str, input_ids: list[list[int]],
                       labels: list[int], num_labels: int, privacy: dict,
                       plain_ids: list[int] | None, *, max_count: int | None = None,
                       max_bytes: int | None = None) -> str:
        """Insert a dataset; raises QuotaError (nothing stored) when the owner's stored
        datasets would exceed ``max_count`` datasets or ``max_bytes`` bytes of data."""
        did = new_id("ds")
        data = json.dumps({"input_ids": input_ids, "labels": labels}, separators=(",", ":"))
        size = len(data)  # ASCII JSON: characters are bytes
        with self._transaction() as db:
            n, used = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(COALESCE(bytes, LENGTH(data))), 0) FROM datasets "
                "WHERE owner=? AND deleted IS NULL", (owner,)).fetchone()
            if max_count is not None and n + 1 > max_count:
                raise QuotaError(f"this key already stores {n} datasets; the quota is "
                                 f"max_datasets_per_key={max_count} (delete some with "
                                 "DELETE /v1/datasets/{id})")
            if max_bytes is not None and used + size > max_bytes:
                raise QuotaError(f"this dataset ({size} bytes) and the {used} bytes this key "
                                 f"already stores exceed the quota max_dataset_bytes_per_key="
                                 f"{max_bytes} (delete some with DELETE /v1/datasets/{{id}})")
            db.execute(
                "INSERT INTO datasets (id, owner, backbone, n_examples, num_labels, "
                "max_row_len, privacy, plain_ids, data, created, bytes) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (did, owner, backbone, len(labels), num_labels, max(map(len, input_ids)),
                 json.dumps(privacy), json.dumps(plain_ids) if plain_ids is not None else None,
                 data, time.time(), size))
        return did

    _DATASET_COLS = ("id, owner, backbone, n_examples, num_labels, max_row_len, privacy, "
                     "plain_ids, created")

    @staticmethod
    def _dataset(row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row:
            row["privacy"] = json.loads(row["privacy"])
            row["plain_ids"] = json.loads(row["plain_ids"]) if row["plain_ids"] else None
        return row

    def get_dataset(self, did: str, owner: str) -> dict[str, Any] | None:
        return self._dataset(self._one(
            f"SELECT {self._DATASET_COLS} FROM datasets WHERE id=? AND owner=? AND deleted IS "
            "NULL", (did, owner)))

    def list_datasets(self, owner: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {self._DATASET_COLS} FROM datasets WHERE owner=? AND deleted IS NULL "
                "ORDER BY created", (owner,)).fetchall()
        return [self._dataset(dict(r)) for r in rows]

    def delete_dataset(self, did: str, owner: str) -> list[str]:
        """Erase a dataset. Returns the ids of queued or running jobs that still use it (then
        nothing is deleted). A dataset that finished jobs name stays as an empty record (its
        jobs refer to it); its data and privacy declaration are erased all the same."""
        with self._transaction() as db:
            active = [r[0] for r in db.execute(
                "SELECT id FROM jobs WHERE dataset_id=? AND state IN ('queued', 'running')",
                (did,)).fetchall()]
            if active:
                return active
            used = db.execute("SELECT 1 FROM jobs WHERE dataset_id=? LIMIT 1",
                              (did,)).fetchone()
            if used:
                db.execute("UPDATE datasets SET data='', privacy='{}', plain_ids=NULL, bytes=0, "
                           "deleted=? WHERE id=? AND owner=?", (time.time(), did, owner))
            else:
                db.execute("DELETE FROM datasets WHERE id=? AND owner=?", (did, owner))
        return []

    def dataset_data(self, did: str) -> dict[str, Any]:
        """input_ids, labels, num_labels, plain_ids of a dataset (worker use: the owner was
        checked when the job was created)."""
        row = self._one("SELECT data, num_labels, plain_ids FROM datasets WHERE id=? AND "
                        "deleted IS NULL", (did,))
        if row is None:
            raise LookupError(f"dataset {did} was deleted")
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
                               path: str, prompt_id: str, elapsed: float,
                               privacy: dict | None = None) -> None:
        """Record the prompt (with the privacy declaration of the data it was tuned on) and
        mark the job succeeded in one transaction."""
        now = time.time()
        with self._transaction() as db:
            db.execute(
                "INSERT INTO prompts (id, owner, job_id, backbone, num_labels, method, "
                "reconstruction, plain_ids, path, created, privacy) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (prompt_id, owner, jid, backbone, num_labels, method, int(reconstruction),
                 json.dumps(plain_ids) if plain_ids is not None else None, path, now,
                 json.dumps(privacy) if privacy is not None else None))
            db.execute(
                "UPDATE jobs SET state='succeeded', prompt_id=?, finished=?, elapsed=?, "
                "checkpoint=NULL WHERE id=?", (prompt_id, now, elapsed, jid))

    # -- prompts ----------------------------------------------------------------------------
    @staticmethod
    def _prompt(row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row:
            row["plain_ids"] = json.loads(row["plain_ids"]) if row["plain_ids"] else None
            row["reconstruction"] = bool(row["reconstruction"])
            row["privacy"] = json.loads(row["privacy"]) if row.get("privacy") else None
        return row

    def get_prompt(self, pid: str, owner: str) -> dict[str, Any] | None:
        return self._prompt(self._one("SELECT * FROM prompts WHERE id=? AND owner=?",
                                      (pid, owner)))

    def list_prompts(self, owner: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM prompts WHERE owner=? ORDER BY created",
                                    (owner,)).fetchall()
        return [self._prompt(dict(r)) for r in rows]

    def delete_prompt(self, pid: str, owner: str) -> str | None:
        """Delete the row; returns the folder of its files (None when there was no such
        prompt). The caller removes the folder."""
        with self._transaction() as db:
            row = db.execute("SELECT path FROM prompts WHERE id=? AND owner=?",
                             (pid, owner)).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM prompts WHERE id=?", (pid,))
        return row[0]

    # --- SAP split sessions (issue 11) ---
    def create_sap_session(self, owner: str, backbone: str, config: dict, n_examples: int,
                           total_steps: int, *, max_count: int | None = None) -> str:
        """Insert a split session (its files go under ``sap_dir``); raises QuotaError when the
        owner already has ``max_count`` sessions."""
        sid = new_id("sap")
        now = time.time()
        with self._transaction() as db:
            (n,) = db.execute("SELECT COUNT(*) FROM sap_sessions WHERE owner=?",
                              (owner,)).fetchone()
            if max_count is not None and n + 1 > max_count:
                raise QuotaError(f"this key already has {n} SAP sessions; the quota is "
                                 f"max_sap_sessions_per_key={max_count} (delete some with "
                                 "DELETE /v1/sap/sessions/{id})")
            db.execute(
                "INSERT INTO sap_sessions (id, owner, backbone, config, n_examples, total_steps, "
                "last_step, rows_received, path, created, updated) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (sid, owner, backbone, json.dumps(config), n_examples, total_steps, -1, 0,
                 str(self.sap_dir(sid)), now, now))
        return sid

    def sap_dir(self, sid: str) -> Path:
        """The folder of a session's files (created 0700 on first use)."""
        d = self.files / "sap" / sid
        _private_dir(d)
        return d

    def get_sap_session(self, sid: str, owner: str) -> dict[str, Any] | None:
        row = self._one("SELECT * FROM sap_sessions WHERE id=? AND owner=?", (sid, owner))
        if row:
            row["config"] = json.loads(row["config"])
        return row

    def update_sap_session(self, sid: str, **fields: Any) -> None:
        """Set columns (last_step, rows_received); ``updated`` is set to now."""
        fields["updated"] = time.time()
        cols = ", ".join(f"{k}=?" for k in fields)
        self._exec(f"UPDATE sap_sessions SET {cols} WHERE id=?", (*fields.values(), sid))

    def delete_sap_session(self, sid: str, owner: str) -> str | None:
        """Delete the row; returns the folder of its files (None when there was none)."""
        with self._transaction() as db:
            row = db.execute("SELECT path FROM sap_sessions WHERE id=? AND owner=?",
                             (sid, owner)).fetchone()
            if row is None:
                return None
            db.execute("DELETE FROM sap_sessions WHERE id=?", (sid,))
        return row[0]


class _Transaction:
    """Holds the store's lock and one IMMEDIATE transaction; rolls back on any exception."""

    def __init__(self, store: Store):
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.store._lock.acquire()
        try:
            self.store._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.store._lock.release()
            raise
        return self.store._db

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        try:
            self.store._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
        finally:
            self.store._lock.release()
