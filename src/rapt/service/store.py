"""Persistent store: keys, datasets, jobs and prompts in SQLite (default) or PostgreSQL.

One ``Store`` class, two backends chosen by the target it is opened on: a path or
``sqlite:///path`` (the embedded default: one file, WAL) or ``postgresql://user@host/db`` (a
multi-writer server several API and worker processes share). The queries are SQLAlchemy Core,
so the same statements run on both; the schema is the ``Table`` list below, created and
upgraded by the numbered ``MIGRATIONS`` (applied once each, recorded in ``schema_version``).

Prompt tensors and dataset rows live in a folder beside the database (``files``:
``<db>.files`` for SQLite, given with ``files=`` for PostgreSQL, a shared filesystem when
several machines run jobs): ``datasets/<id>.json`` (token ids and labels, never in the
database, so deleting the file erases them), ``prompts/<id>`` safetensors folders and
``checkpoints/<job id>.pt``. Every lookup of a user object takes the owner's key id, so one key
can never read another key's rows.

Jobs are the queue: a job row is claimed by one worker with a conditional update
(``state='queued'`` -> ``'running'``, the worker's id, a heartbeat), so two workers, threads or
processes or machines, never run the same job; a worker whose heartbeat stops (crash, killed
process, lost machine) loses its jobs to the next worker that looks (``stale_jobs`` /
``release_stale``), which resumes them from their checkpoint.

SQLite: the database file is created 0600 and the folders the store creates 0700: they hold
every tenant's data. Deleted rows are overwritten in the file (``secure_delete``) and the WAL
is checkpointed and truncated after every delete, so no copy stays in ``-wal`` either.

Keys: revoking one cancels its jobs and deletes its split sessions; purging one deletes
everything it owns (``purge_key``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Column, Double, Index, Integer, Text

# -- schema: every table in one place ---------------------------------------------------------
# To add a table: define it here, list it in USER_TABLES if `counts()` should report it, and
# append a Migration that creates it (see MIGRATIONS below).
metadata = sa.MetaData()

api_keys = sa.Table(
    "api_keys", metadata,
    Column("id", Text, primary_key=True), Column("name", Text, nullable=False),
    Column("key_hash", Text, nullable=False, unique=True),
    Column("created", Double, nullable=False),
    Column("admin", Integer, nullable=False, server_default="0"), Column("revoked", Double))

datasets = sa.Table(
    "datasets", metadata,
    Column("id", Text, primary_key=True),
    Column("owner", Text, sa.ForeignKey("api_keys.id"), nullable=False),
    Column("backbone", Text, nullable=False), Column("n_examples", Integer, nullable=False),
    Column("num_labels", Integer, nullable=False), Column("max_row_len", Integer, nullable=False),
    Column("privacy", Text, nullable=False), Column("plain_ids", Text),
    Column("data", Text, nullable=False), Column("created", Double, nullable=False),
    Column("bytes", Integer), Column("deleted", Double))

jobs = sa.Table(
    "jobs", metadata,
    Column("id", Text, primary_key=True),
    Column("owner", Text, sa.ForeignKey("api_keys.id"), nullable=False),
    Column("dataset_id", Text, sa.ForeignKey("datasets.id"), nullable=False),
    Column("backbone", Text, nullable=False), Column("params", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("step", Integer, nullable=False, server_default="0"),
    Column("total_steps", Integer), Column("loss", Double), Column("epoch", Double),
    Column("epsilon", Double), Column("elapsed", Double, nullable=False, server_default="0"),
    Column("started", Double), Column("finished", Double), Column("checkpoint", Text),
    Column("resumed_from_step", Integer), Column("prompt_id", Text), Column("error", Text),
    Column("created", Double, nullable=False),
    # Leases (migration 2): the worker running the job, its last heartbeat, how many times
    # the job was claimed, and a cancel request for whichever worker runs it.
    Column("worker", Text), Column("heartbeat", Double),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("cancel_requested", Double),
    Index("jobs_state", "state"))

prompts = sa.Table(
    "prompts", metadata,
    Column("id", Text, primary_key=True),
    Column("owner", Text, sa.ForeignKey("api_keys.id"), nullable=False),
    Column("job_id", Text, sa.ForeignKey("jobs.id"), nullable=False),
    Column("backbone", Text, nullable=False), Column("num_labels", Integer, nullable=False),
    Column("method", Text, nullable=False), Column("reconstruction", Integer, nullable=False),
    Column("plain_ids", Text), Column("path", Text, nullable=False),
    Column("created", Double, nullable=False), Column("privacy", Text),
    # The provider's channel model the prompt was tuned through (migration 5):
    # fingerprint and provenance as JSON; NULL: none.
    Column("channel", Text))

# SAP split sessions. The session's top state and the frozen release live as files
# under <files>/sap/<id>/; last_step mirrors the state file.
sap_sessions = sa.Table(
    "sap_sessions", metadata,
    Column("id", Text, primary_key=True),
    Column("owner", Text, sa.ForeignKey("api_keys.id"), nullable=False),
    Column("backbone", Text, nullable=False), Column("config", Text, nullable=False),
    Column("n_examples", Integer, nullable=False), Column("total_steps", Integer, nullable=False),
    Column("last_step", Integer, nullable=False), Column("rows_received", Integer, nullable=False),
    Column("path", Text, nullable=False), Column("created", Double, nullable=False),
    Column("updated", Double, nullable=False),
    # Bytes of its files (migration 6), which count in the owner's storage quota with the
    # datasets: the release chunks uploaded, and the saved state (top tensors, optimizer).
    Column("release_bytes", Integer, nullable=False, server_default="0"),
    Column("state_bytes", Integer, nullable=False, server_default="0"))

# Named rows locked (SELECT ... FOR UPDATE) to serialize a check-then-insert across processes
# on PostgreSQL; SQLite's write transactions are serialized already.
locks = sa.Table("locks", metadata, Column("name", Text, primary_key=True))

schema_version = sa.Table(
    "schema_version", metadata,
    Column("version", Integer, primary_key=True), Column("name", Text, nullable=False),
    Column("applied", Double, nullable=False))

USER_TABLES = ("api_keys", "datasets", "jobs", "prompts", "sap_sessions")
TABLES = USER_TABLES  # the name older callers import


# -- migrations: ordered, each applied once, each idempotent -----------------------------------
def create_tables(*names: str) -> Callable[[sa.Connection], None]:
    """A migration step creating the named tables (and their indexes) if missing."""
    def step(conn: sa.Connection) -> None:
        metadata.create_all(conn, tables=[metadata.tables[n] for n in names], checkfirst=True)
    return step


def add_columns(table: str, *names: str) -> Callable[[sa.Connection], None]:
    """A migration step adding the named columns (as defined above) where missing."""
    def step(conn: sa.Connection) -> None:
        have = {c["name"] for c in sa.inspect(conn).get_columns(table)}
        for name in names:
            if name in have:
                continue
            col = metadata.tables[table].c[name]
            ddl = f"ALTER TABLE {table} ADD COLUMN {name} {col.type.compile(conn.dialect)}"
            if col.server_default is not None:
                ddl += f" DEFAULT {col.server_default.arg}"
            if not col.nullable:
                ddl += " NOT NULL"
            conn.exec_driver_sql(ddl)
    return step


def insert_rows(table: str, *rows: dict) -> Callable[[sa.Connection], None]:
    def step(conn: sa.Connection) -> None:
        t = metadata.tables[table]
        for row in rows:
            pk = sa.and_(*(c == row[c.name] for c in t.primary_key.columns))
            if conn.execute(sa.select(sa.literal(1)).select_from(t).where(pk)).first() is None:
                conn.execute(t.insert().values(**row))
    return step


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    steps: tuple[Callable[[sa.Connection], None], ...]


MIGRATIONS: tuple[Migration, ...] = (
    # SQLite files of earlier releases hold these tables, maybe without the columns added
    # after the first release (unversioned then): both are brought up to date here.
    Migration(1, "keys, datasets, jobs, prompts", (
        create_tables("api_keys", "datasets", "jobs", "prompts"),
        add_columns("api_keys", "admin", "revoked"),
        add_columns("datasets", "bytes", "deleted"),
        add_columns("prompts", "privacy"))),
    Migration(2, "job leases (worker, heartbeat, attempts, cancel_requested), locks", (
        add_columns("jobs", "worker", "heartbeat", "attempts", "cancel_requested"),
        create_tables("locks"),
        insert_rows("locks", {"name": "job_queue"}))),
    Migration(3, "SAP split sessions", (create_tables("sap_sessions"),)),
    # Dataset rows move to files (``Store._move_data_to_files``, run at every open, since a
    # migration step has no files folder); records kept for the jobs that name a deleted
    # dataset lose their sizes too.
    Migration(4, "dataset data in files; deleted datasets keep no sizes", (
        lambda conn: conn.execute(datasets.update().where(datasets.c.deleted.is_not(None))
                                  .values(n_examples=0, num_labels=0, max_row_len=0, bytes=0,
                                          data="", privacy="{}", plain_ids=None)),)),
    Migration(5, "the channel model a prompt was tuned through", (
        add_columns("prompts", "channel"),)),
    Migration(6, "SAP session file sizes, for the per-key storage quota", (
        add_columns("sap_sessions", "release_bytes", "state_bytes"),)),
)


def sql(text: str, args: tuple | list = ()) -> sa.TextClause:
    """A plain SQL statement with ``?`` placeholders (the sqlite3 style) as a SQLAlchemy
    statement that runs on both backends, e.g. ``conn.execute(sql("SELECT x FROM t WHERE
    id=?", (i,)))``. Write portable SQL; prefer the Core expressions used below."""
    parts = text.split("?")
    if len(parts) - 1 != len(args):
        raise ValueError(f"{len(parts) - 1} placeholders, {len(args)} values: {text}")
    out = parts[0] + "".join(f":p{i}{p}" for i, p in enumerate(parts[1:]))
    return sa.text(out).bindparams(**{f"p{i}": v for i, v in enumerate(args)})


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


QUOTA_FIX = ("delete datasets with DELETE /v1/datasets/{id} or SAP sessions with "
             "DELETE /v1/sap/sessions/{id}")


class QuotaError(Exception):
    """A per-key storage quota would be exceeded (message names the quota)."""


class LastAdminKeyError(ValueError):
    """Revoking this key would leave no live admin key: nobody could use the operator routes
    (revoke, purge, stats) over HTTP any more."""


class QueueFullError(RuntimeError):
    """The job queue holds ``max_queued`` waiting jobs already (or this key its
    ``max_queued_per_key``)."""


def _private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) 0700; a folder that exists keeps its mode."""
    if not path.exists():
        _private_dir(path.parent)
        path.mkdir(mode=0o700, exist_ok=True)


def _private_file(path: Path) -> None:
    """Create ``path`` 0600 if missing, and tighten it to 0600 if it exists."""
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    os.chmod(path, 0o600)


def private_tree(path: Path) -> None:
    """Tighten a folder the service wrote (a saved prompt) to 0700 folders and 0600 files,
    whatever the umask of the code that wrote it."""
    path = Path(path)
    if path.is_dir():
        for root, _dirs, files in os.walk(path):
            os.chmod(root, 0o700)
            for f in files:
                os.chmod(os.path.join(root, f), 0o600)
    elif path.exists():
        os.chmod(path, 0o600)


def write_private(path: Path, data: bytes) -> None:
    """Write a new file 0600 from its creation (no window with a looser mode)."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def erase_file(path: Path) -> None:
    """Overwrite a file with zeros before unlinking it (best effort: a journaling or
    copy-on-write filesystem may keep old blocks), so a plain read of the freed blocks finds
    nothing; a missing file is fine."""
    try:
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.write(b"\0" * size)
            f.flush()
            os.fsync(f.fileno())
        os.unlink(path)
    except FileNotFoundError:
        pass


def store_url(target: str | Path) -> str:
    """The SQLAlchemy URL of a store target: a path (SQLite), ``sqlite:///path`` or
    ``postgresql://...`` (driven by psycopg 3)."""
    s = str(target)
    if s.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + s.split("://", 1)[1]
    if s.startswith("postgresql+"):
        return s
    if s.startswith("sqlite:///"):
        s = s[len("sqlite:///"):]
    elif "://" in s:
        raise ValueError(f"store '{s}': give a file path, sqlite:///path or postgresql://...")
    return "sqlite:///" + str(Path(s).expanduser().resolve())


def public_url(url: str) -> str:
    """The URL without its password (for logs)."""
    return sa.make_url(url).render_as_string(hide_password=True)


class Store:
    """Thread-safe access to the store (SQLite: one writer at a time, serialized by a lock;
    PostgreSQL: a connection pool, rows locked by the statements that need it)."""

    def __init__(self, target: str | Path, files: str | Path | None = None):
        self.url = store_url(target)
        self.dialect = sa.make_url(self.url).get_backend_name()
        if self.dialect == "sqlite":
            self.path: Path | None = Path(self.url[len("sqlite:///"):])
            _private_dir(self.path.parent)
            _private_file(self.path)
            for suffix in ("-wal", "-shm"):  # SQLite creates these with the file's mode
                side = self.path.with_name(self.path.name + suffix)
                if side.exists():
                    os.chmod(side, 0o600)
            default_files = self.path.with_name(self.path.name + ".files")
            self._lock: Any = threading.RLock()
            self.engine = sa.create_engine(
                self.url, poolclass=sa.pool.StaticPool,
                connect_args={"check_same_thread": False, "timeout": 30.0})

            @sa.event.listens_for(self.engine, "connect")
            def _connect(dbapi_conn: Any, _rec: Any) -> None:
                dbapi_conn.isolation_level = None  # transactions are ours (BEGIN below)
                for pragma in ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=30000",
                               "secure_delete=ON"):
                    dbapi_conn.execute(f"PRAGMA {pragma}")

            @sa.event.listens_for(self.engine, "begin")
            def _begin(conn: sa.Connection) -> None:
                # IMMEDIATE: take the write lock at BEGIN, so a read-then-write transaction
                # never fails to upgrade when another process wrote in between.
                conn.exec_driver_sql("BEGIN IMMEDIATE")
        elif self.dialect == "postgresql":
            self.path = None
            default_files = Path(os.environ.get("RAPT_FILES", "rapt-service.files"))
            self._lock = contextlib.nullcontext()
            self.engine = sa.create_engine(self.url, pool_size=4, max_overflow=8,
                                           pool_pre_ping=True)
        else:
            raise ValueError(f"store backend '{self.dialect}' is not supported "
                             "(sqlite or postgresql)")
        self.files = Path(files).expanduser().resolve() if files else default_files
        for d in (self.files, self.files / "prompts", self.files / "checkpoints",
                  self.files / "datasets"):
            _private_dir(d)
        os.chmod(self.files, 0o700)
        self.migrate()
        self._move_data_to_files()

    def describe(self) -> str:
        return str(self.path) if self.path is not None else public_url(self.url)

    # -- plumbing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _tx(self) -> Iterator[sa.Connection]:
        """One transaction (committed on success, rolled back on any exception)."""
        with self._lock, self.engine.begin() as conn:
            yield conn

    def _transaction(self):  # the name older code used
        return self._tx()

    def migrate(self) -> None:
        """Apply the migrations this store has not seen, in order, in one transaction."""
        with self._tx() as conn:
            if self.dialect == "postgresql":  # two processes starting at once: one migrates
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(7216071)"))
            create_tables("schema_version")(conn)
            done = set(conn.execute(sa.select(schema_version.c.version)).scalars())
            for m in MIGRATIONS:
                if m.version in done:
                    continue
                for step in m.steps:
                    step(conn)
                conn.execute(schema_version.insert().values(
                    version=m.version, name=m.name, applied=time.time()))

    def schema_version(self) -> int:
        with self._tx() as conn:
            return int(conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar())

    def close(self) -> None:
        with self._lock:
            self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # The three helpers below take a Core statement, or SQL text with ``?`` placeholders and
    # its values (see ``sql``), and run it in a transaction of its own.
    def _rows(self, stmt: Any, args: tuple = ()) -> list[dict[str, Any]]:
        stmt = sql(stmt, args) if isinstance(stmt, str) else stmt
        with self._tx() as conn:
            return [dict(r._mapping) for r in conn.execute(stmt)]

    def _one(self, stmt: Any, args: tuple = ()) -> dict[str, Any] | None:
        stmt = sql(stmt, args) if isinstance(stmt, str) else stmt
        with self._tx() as conn:
            row = conn.execute(stmt).first()
        return dict(row._mapping) if row is not None else None

    def _exec(self, stmt: Any, args: tuple = ()) -> int:
        """Run one statement in its own transaction; returns the rows it changed."""
        stmt = sql(stmt, args) if isinstance(stmt, str) else stmt
        with self._tx() as conn:
            return conn.execute(stmt).rowcount

    @staticmethod
    def _lock_row(conn: sa.Connection, name: str) -> None:
        """Hold the named lock row until the transaction ends (PostgreSQL; a no-op read on
        SQLite, whose BEGIN IMMEDIATE serializes writers already)."""
        conn.execute(sa.select(locks.c.name).where(locks.c.name == name).with_for_update())

    def checkpoint_wal(self) -> None:
        """SQLite: copy the WAL into the database and truncate it to 0 bytes, so rows deleted
        (and overwritten, ``secure_delete``) in the file leave no copy in ``-wal``. A reader
        of another process holding an old snapshot can make it partial; the next delete
        retries. PostgreSQL: nothing (its WAL is the server's)."""
        if self.dialect != "sqlite":
            return
        with self._lock:
            raw = self.engine.raw_connection()
            try:
                raw.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                raw.close()

    def _remove(self, *paths: str | Path | None) -> None:
        """Erase files and folders this store made (anything outside ``files`` is left)."""
        root = self.files.resolve()
        for p in paths:
            if not p:
                continue
            p = Path(p).resolve()
            if root not in p.parents:
                continue
            if p.is_dir():
                for f in p.rglob("*"):
                    if f.is_file():
                        erase_file(f)
                shutil.rmtree(p, ignore_errors=True)
            else:
                erase_file(p)
                erase_file(p.with_suffix(".tmp"))

    def counts(self) -> dict[str, int]:
        """Row count per table (tests compare these before/after a rejected request)."""
        with self._tx() as conn:
            return {t: int(conn.execute(sa.select(sa.func.count()).select_from(
                metadata.tables[t])).scalar()) for t in USER_TABLES}

    # -- keys -------------------------------------------------------------------------------
    def add_key(self, name: str, key_hash: str, admin: bool = False) -> str:
        kid = new_id("key")
        self._exec(api_keys.insert().values(id=kid, name=name, key_hash=key_hash,
                                            created=time.time(), admin=int(admin)))
        return kid

    def owner_of_hash(self, key_hash: str) -> str | None:
        """The key id of a valid (not revoked) key."""
        row = self._one(sa.select(api_keys.c.id).where(api_keys.c.key_hash == key_hash,
                                                       api_keys.c.revoked.is_(None)))
        return row["id"] if row else None

    def is_admin(self, kid: str) -> bool:
        row = self._one(sa.select(api_keys.c.admin).where(api_keys.c.id == kid,
                                                          api_keys.c.revoked.is_(None)))
        return bool(row and row["admin"])

    def list_keys(self) -> list[dict[str, Any]]:
        c = api_keys.c
        return self._rows(sa.select(c.id, c.name, c.created, c.admin, c.revoked)
                          .order_by(c.created))

    @staticmethod
    def _find_key(conn: sa.Connection, ref: str, live_only: bool) -> dict[str, Any]:
        """The key with id ``ref``, else the one key named ``ref`` (a live one when
        ``live_only``). LookupError: none; ValueError: the name is ambiguous."""
        c = api_keys.c
        by_name = c.name == ref
        if live_only:
            by_name = sa.and_(by_name, c.revoked.is_(None))
        rows = [dict(r._mapping) for r in conn.execute(
            sa.select(c.id, c.name, c.revoked).where(sa.or_(c.id == ref, by_name))
            .with_for_update())]
        rows = [r for r in rows if r["id"] == ref] or rows
        if not rows:
            raise LookupError(f"no key with id or name '{ref}' (see `keys list`)")
        if len(rows) > 1:
            raise ValueError(f"several keys are named '{ref}' "
                             f"({', '.join(r['id'] for r in rows)}); give the key id")
        return rows[0]

    def find_key_id(self, ref: str, live_only: bool) -> str:
        """The id of the key ``ref`` names (see ``_find_key``)."""
        with self._tx() as conn:
            return self._find_key(conn, ref, live_only)["id"]

    @staticmethod
    def _keep_an_admin(conn: sa.Connection, kid: str) -> None:
        """LastAdminKeyError when ``kid`` is the only live admin key. The live admin rows are
        locked (PostgreSQL), so two admins revoking each other at once cannot both pass."""
        c = api_keys.c
        live = set(conn.execute(sa.select(c.id).where(c.admin != 0, c.revoked.is_(None))
                                .with_for_update()).scalars())
        if live == {kid}:
            raise LastAdminKeyError(
                f"key '{kid}' is the last live admin key: revoking it would lock every "
                "operator out of the admin routes; add another first (`rapt serve keys add "
                "NAME --admin`), then revoke this one")

    def check_revocable(self, kid: str) -> None:
        """LastAdminKeyError when revoking ``kid`` would leave no live admin key (checked
        again, under lock, by ``revoke_key`` and ``purge_key``)."""
        with self._tx() as conn:
            self._keep_an_admin(conn, kid)

    def _revoke(self, conn: sa.Connection, kid: str) -> tuple[list[str], list[str], list[str]]:
        """Revoke key ``kid`` in ``conn``'s transaction: its queued jobs are cancelled, its
        running ones flagged for their worker (which stops at its next step and creates no
        prompt), its split sessions deleted. Returns (cancelled job ids, running job ids,
        session folders to remove). LastAdminKeyError (nothing changed) for the last live
        admin key."""
        c, j, s = api_keys.c, jobs.c, sap_sessions.c
        self._keep_an_admin(conn, kid)
        now = time.time()
        conn.execute(api_keys.update().where(c.id == kid, c.revoked.is_(None))
                     .values(revoked=now))
        queued = list(conn.execute(sa.select(j.id).where(
            j.owner == kid, j.state == "queued")).scalars())
        conn.execute(jobs.update().where(j.owner == kid, j.state == "queued").values(
            state="cancelled", finished=now, worker=None, heartbeat=None, checkpoint=None))
        running = list(conn.execute(sa.select(j.id).where(
            j.owner == kid, j.state == "running")).scalars())
        conn.execute(jobs.update().where(j.owner == kid, j.state == "running",
                                         j.cancel_requested.is_(None))
                     .values(cancel_requested=now))
        folders = list(conn.execute(sa.select(s.path).where(s.owner == kid)).scalars())
        conn.execute(sap_sessions.delete().where(s.owner == kid))
        return queued, running, folders

    def revoke_key(self, ref: str) -> dict[str, Any]:
        """Revoke the key with id ``ref``, or the one live key named ``ref``; returns its row
        with ``cancelled`` (queued jobs cancelled), ``stopping`` (running jobs asked to stop)
        and ``sessions`` (split sessions deleted). Its datasets and prompts stay until
        ``purge_key``. Raises LookupError (no such key) or ValueError (ambiguous name, or
        LastAdminKeyError: the last live admin key)."""
        with self._tx() as conn:
            row = self._find_key(conn, ref, live_only=True)
            queued, running, folders = self._revoke(conn, row["id"])
        self._remove(*folders, *(self.files / "checkpoints" / f"{q}.pt" for q in queued))
        if folders:
            self.checkpoint_wal()
        return {**row, "cancelled": queued, "stopping": running, "sessions": len(folders)}

    def purge_key(self, ref: str) -> dict[str, Any]:
        """Revoke the key with id or name ``ref`` (revoked already or not) and delete
        everything it owns: datasets (files erased), jobs (checkpoints erased), prompts
        (folders erased) and split sessions. The key's row stays, revoked, without data.
        Returns the row with the number of objects deleted per kind. A job still running
        loses its row, so its worker stops at its next step and saves nothing."""
        j, d, pr = jobs.c, datasets.c, prompts.c
        with self._tx() as conn:
            row = self._find_key(conn, ref, live_only=False)
            kid = row["id"]
            _, running, folders = self._revoke(conn, kid)
            prompt_dirs = list(conn.execute(sa.select(pr.path).where(pr.owner == kid)).scalars())
            job_ids = list(conn.execute(sa.select(j.id).where(j.owner == kid)).scalars())
            ds_ids = list(conn.execute(sa.select(d.id).where(d.owner == kid)).scalars())
            # Prompts name jobs, jobs name datasets: deleted in that order. Another key's
            # rows never name this key's (a job's dataset is its owner's).
            conn.execute(prompts.delete().where(pr.owner == kid))
            conn.execute(jobs.delete().where(j.owner == kid))
            conn.execute(datasets.delete().where(d.owner == kid))
        self._remove(*folders, *prompt_dirs,
                     *(self.files / "checkpoints" / f"{i}.pt" for i in job_ids),
                     *(self._data_path(i) for i in ds_ids))
        self.checkpoint_wal()
        return {**row, "datasets": len(ds_ids), "jobs": len(job_ids),
                "prompts": len(prompt_dirs), "sessions": len(folders), "stopping": running}

    def owned_sap_sessions(self, owner: str) -> list[str]:
        """Ids of a key's split sessions."""
        return [r["id"] for r in self._rows(sa.select(sap_sessions.c.id)
                                            .where(sap_sessions.c.owner == owner))]

    # -- datasets ---------------------------------------------------------------------------
    def create_dataset(self, owner: str, backbone: str, input_ids: list[list[int]],
                       labels: list[int], num_labels: int, privacy: dict,
                       plain_ids: list[int] | None, *, max_count: int | None = None,
                       max_bytes: int | None = None) -> str:
        """Insert a dataset; raises QuotaError (nothing stored) when the owner's stored
        datasets would exceed ``max_count`` datasets or ``max_bytes`` bytes of data."""
        did = new_id("ds")
        data = json.dumps({"input_ids": input_ids, "labels": labels}, separators=(",", ":"))
        try:
            self._insert_dataset(did, owner, backbone, input_ids, labels, num_labels, privacy,
                                 plain_ids, data, max_count, max_bytes)
        except BaseException:
            # A quota refusal, a failed write or a failed commit: no file without its row.
            erase_file(self._data_path(did))
            raise
        return did

    def _insert_dataset(self, did: str, owner: str, backbone: str,
                        input_ids: list[list[int]], labels: list[int], num_labels: int,
                        privacy: dict, plain_ids: list[int] | None, data: str,
                        max_count: int | None, max_bytes: int | None) -> None:
        """The quota checks and the row, in one transaction; the file written inside it, so
        a failed write stores no row."""
        size = len(data)  # ASCII JSON: characters are bytes
        c = datasets.c
        with self._tx() as conn:
            # The owner's key row is the quota's lock: two uploads of one key are checked
            # one after the other, on every backend.
            conn.execute(sa.select(api_keys.c.id).where(api_keys.c.id == owner)
                         .with_for_update())
            n = int(conn.execute(sa.select(sa.func.count()).select_from(datasets).where(
                c.owner == owner, c.deleted.is_(None))).scalar())
            used = self._stored_bytes(conn, owner)
            if max_count is not None and n + 1 > max_count:
                raise QuotaError(f"this key already stores {n} datasets; the quota is "
                                 f"max_datasets_per_key={max_count} (delete some with "
                                 "DELETE /v1/datasets/{id})")
            if max_bytes is not None and used + size > max_bytes:
                raise QuotaError(f"this dataset ({size} bytes) and the {used} bytes this key "
                                 f"already stores (datasets and SAP sessions) exceed the quota "
                                 f"max_dataset_bytes_per_key={max_bytes} ({QUOTA_FIX})")
            conn.execute(datasets.insert().values(
                id=did, owner=owner, backbone=backbone, n_examples=len(labels),
                num_labels=num_labels, max_row_len=max(map(len, input_ids)),
                privacy=json.dumps(privacy),
                plain_ids=json.dumps(plain_ids) if plain_ids is not None else None,
                data="", created=time.time(), bytes=size))
            write_private(self._data_path(did), data.encode())

    @staticmethod
    def _stored_bytes(conn: sa.Connection, owner: str) -> int:
        """Bytes a key stores, as its storage quota counts them: its datasets' data and its
        SAP sessions' files (releases and saved state)."""
        c, s = datasets.c, sap_sessions.c
        ds = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(
            sa.func.coalesce(c.bytes, sa.func.length(c.data))), 0))
            .where(c.owner == owner, c.deleted.is_(None))).scalar()
        sap = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(
            s.release_bytes + s.state_bytes), 0)).where(s.owner == owner)).scalar()
        return int(ds) + int(sap)

    def stored_bytes(self, owner: str) -> int:
        """See ``_stored_bytes``."""
        with self._tx() as conn:
            return self._stored_bytes(conn, owner)

    def _data_path(self, did: str) -> Path:
        """The file holding a dataset's token ids and labels (JSON)."""
        if not did.replace("_", "").isalnum():  # ids are ours; never a path from elsewhere
            raise ValueError(f"bad dataset id {did!r}")
        return self.files / "datasets" / f"{did}.json"

    def _move_data_to_files(self) -> None:
        """Move dataset rows that an earlier release kept in the database (``data`` column)
        into files, then erase them from the database and its WAL."""
        c = datasets.c
        moved = False
        while True:
            with self._tx() as conn:
                row = conn.execute(sa.select(c.id, c.data).where(c.data != "").limit(1)
                                   .with_for_update()).first()
                if row is None:
                    break
                write_private(self._data_path(row.id), row.data.encode())
                conn.execute(datasets.update().where(c.id == row.id).values(
                    data="", bytes=len(row.data.encode())))
                moved = True
        if moved:
            self.checkpoint_wal()

    _DATASET_COLS = ("id", "owner", "backbone", "n_examples", "num_labels", "max_row_len",
                     "privacy", "plain_ids", "created")

    @staticmethod
    def _dataset(row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row:
            row["privacy"] = json.loads(row["privacy"])
            row["plain_ids"] = json.loads(row["plain_ids"]) if row["plain_ids"] else None
        return row

    def _dataset_select(self) -> sa.Select:
        return sa.select(*(datasets.c[n] for n in self._DATASET_COLS))

    def get_dataset(self, did: str, owner: str) -> dict[str, Any] | None:
        c = datasets.c
        return self._dataset(self._one(self._dataset_select().where(
            c.id == did, c.owner == owner, c.deleted.is_(None))))

    def list_datasets(self, owner: str) -> list[dict[str, Any]]:
        c = datasets.c
        rows = self._rows(self._dataset_select().where(c.owner == owner, c.deleted.is_(None))
                          .order_by(c.created))
        return [self._dataset(r) for r in rows]

    def delete_dataset(self, did: str, owner: str) -> list[str]:
        """Erase a dataset. Returns the ids of queued or running jobs that still use it (then
        nothing is deleted). Its file is overwritten and removed, and the WAL truncated. A
        dataset that finished jobs name stays as a bare record (id, owner, backbone, dates)
        without data, privacy declaration or sizes."""
        c, j = datasets.c, jobs.c
        with self._tx() as conn:
            # Locked: a job created meanwhile (create_job reads this row FOR SHARE) waits.
            if conn.execute(sa.select(c.id).where(c.id == did, c.owner == owner)
                            .with_for_update()).first() is None:
                return []  # not this owner's: nothing to delete
            active = list(conn.execute(sa.select(j.id).where(
                j.dataset_id == did, j.state.in_(("queued", "running")))).scalars())
            if active:
                return active
            used = conn.execute(sa.select(j.id).where(j.dataset_id == did).limit(1)).first()
            if used:
                conn.execute(datasets.update().where(c.id == did, c.owner == owner).values(
                    data="", privacy="{}", plain_ids=None, bytes=0, n_examples=0,
                    num_labels=0, max_row_len=0, deleted=time.time()))
            else:
                conn.execute(datasets.delete().where(c.id == did, c.owner == owner))
        erase_file(self._data_path(did))
        self.checkpoint_wal()
        return []

    def dataset_data(self, did: str) -> dict[str, Any]:
        """input_ids, labels, num_labels, plain_ids of a dataset (worker use: the owner was
        checked when the job was created)."""
        c = datasets.c
        row = self._one(sa.select(c.num_labels, c.plain_ids)
                        .where(c.id == did, c.deleted.is_(None)))
        path = self._data_path(did)
        if row is None or not path.exists():
            raise LookupError(f"dataset {did} was deleted")
        out = json.loads(path.read_bytes())
        out["num_labels"] = int(row["num_labels"])
        out["plain_ids"] = json.loads(row["plain_ids"]) if row["plain_ids"] else None
        return out

    # -- jobs -------------------------------------------------------------------------------
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
        """id, worker, heartbeat, checkpoint of every running job (for the stale check)."""
        c = jobs.c
        return self._rows(sa.select(c.id, c.worker, c.heartbeat, c.checkpoint)
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

    # -- prompts ----------------------------------------------------------------------------
    @staticmethod
    def _prompt(row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row:
            row["plain_ids"] = json.loads(row["plain_ids"]) if row["plain_ids"] else None
            row["reconstruction"] = bool(row["reconstruction"])
            row["privacy"] = json.loads(row["privacy"]) if row.get("privacy") else None
            row["channel"] = json.loads(row["channel"]) if row.get("channel") else None
        return row

    def get_prompt(self, pid: str, owner: str) -> dict[str, Any] | None:
        return self._prompt(self._one(sa.select(prompts).where(prompts.c.id == pid,
                                                               prompts.c.owner == owner)))

    def list_prompts(self, owner: str) -> list[dict[str, Any]]:
        return [self._prompt(r) for r in self._rows(
            sa.select(prompts).where(prompts.c.owner == owner).order_by(prompts.c.created))]

    def delete_prompt(self, pid: str, owner: str) -> str | None:
        """Delete the row; returns the folder of its files (None when there was no such
        prompt). The caller removes the folder."""
        with self._tx() as conn:
            path = conn.execute(sa.select(prompts.c.path).where(
                prompts.c.id == pid, prompts.c.owner == owner).with_for_update()).scalar()
            if path is None:
                return None
            conn.execute(prompts.delete().where(prompts.c.id == pid))
        return path

    # --- SAP split sessions ---
    def create_sap_session(self, owner: str, backbone: str, config: dict, n_examples: int,
                           total_steps: int, *, max_count: int | None = None) -> str:
        """Insert a split session (its files go under ``sap_dir``); raises QuotaError when the
        owner already has ``max_count`` sessions."""
        sid = new_id("sap")
        now = time.time()
        with self._tx() as conn:
            # The owner's key row is the quota's lock, as for datasets (PostgreSQL).
            conn.execute(sa.select(api_keys.c.id).where(api_keys.c.id == owner)
                         .with_for_update())
            n = int(conn.execute(sa.select(sa.func.count()).select_from(sap_sessions).where(
                sap_sessions.c.owner == owner)).scalar())
            if max_count is not None and n + 1 > max_count:
                raise QuotaError(f"this key already has {n} SAP sessions; the quota is "
                                 f"max_sap_sessions_per_key={max_count} (delete some with "
                                 "DELETE /v1/sap/sessions/{id})")
            conn.execute(sap_sessions.insert().values(
                id=sid, owner=owner, backbone=backbone, config=json.dumps(config),
                n_examples=n_examples, total_steps=total_steps, last_step=-1, rows_received=0,
                path=str(self.sap_dir(sid)), created=now, updated=now))
        return sid

    def sap_dir(self, sid: str) -> Path:
        """The folder of a session's files (created 0700 on first use)."""
        d = self.files / "sap" / sid
        _private_dir(d)
        return d

    def get_sap_session(self, sid: str, owner: str) -> dict[str, Any] | None:
        row = self._one(sa.select(sap_sessions).where(sap_sessions.c.id == sid,
                                                      sap_sessions.c.owner == owner))
        if row:
            row["config"] = json.loads(row["config"])
        return row

    def add_sap_release(self, sid: str, owner: str, size: int, rows_received: int,
                        write: Callable[[], None], *, max_bytes: int | None = None) -> None:
        """Record a release chunk of ``size`` bytes (and the rows the session then has),
        calling ``write()`` to store its file inside the transaction; raises QuotaError
        (nothing written) when the owner's stored bytes would exceed ``max_bytes``."""
        s = sap_sessions.c
        with self._tx() as conn:
            # The owner's key row is the quota's lock, as for datasets.
            conn.execute(sa.select(api_keys.c.id).where(api_keys.c.id == owner)
                         .with_for_update())
            used = self._stored_bytes(conn, owner)
            if max_bytes is not None and used + size > max_bytes:
                raise QuotaError(f"this release chunk ({size} bytes) and the {used} bytes this "
                                 f"key already stores (datasets and SAP sessions) exceed the "
                                 f"quota max_dataset_bytes_per_key={max_bytes} ({QUOTA_FIX})")
            write()
            conn.execute(sap_sessions.update().where(s.id == sid, s.owner == owner).values(
                release_bytes=s.release_bytes + size, rows_received=rows_received,
                updated=time.time()))

    def update_sap_session(self, sid: str, **fields: Any) -> None:
        """Set columns (last_step, rows_received); ``updated`` is set to now."""
        fields["updated"] = time.time()
        self._exec(sap_sessions.update().where(sap_sessions.c.id == sid).values(**fields))

    def delete_sap_session(self, sid: str, owner: str) -> str | None:
        """Delete the row; returns the folder of its files (None when there was none)."""
        with self._tx() as conn:
            path = conn.execute(sa.select(sap_sessions.c.path).where(
                sap_sessions.c.id == sid, sap_sessions.c.owner == owner).with_for_update()
            ).scalar()
            if path is None:
                return None
            conn.execute(sap_sessions.delete().where(sap_sessions.c.id == sid))
        return path
