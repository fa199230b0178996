"""The store's connection: the URL of a target, the engine per backend (SQLite or
PostgreSQL), transactions, the migrations applied at open, and the plumbing every part of the
store shares."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import sqlalchemy as sa

from rapt.service.store.files import _private_dir, _private_file, erase_file
from rapt.service.store.schema import (
    MIGRATIONS,
    USER_TABLES,
    create_tables,
    locks,
    metadata,
    schema_version,
)


def sql(text: str, args: tuple | list = ()) -> sa.TextClause:
    """A plain SQL statement with ``?`` placeholders (the sqlite3 style) as a SQLAlchemy
    statement that runs on both backends, e.g. ``conn.execute(sql("SELECT x FROM t WHERE
    id=?", (i,)))``. Write portable SQL; prefer the Core expressions the store's parts use."""
    parts = text.split("?")
    if len(parts) - 1 != len(args):
        raise ValueError(f"{len(parts) - 1} placeholders, {len(args)} values: {text}")
    out = parts[0] + "".join(f":p{i}{p}" for i, p in enumerate(parts[1:]))
    return sa.text(out).bindparams(**{f"p{i}": v for i, v in enumerate(args)})


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


class StoreBase:
    """Thread-safe access to the store (SQLite: one writer at a time, serialized by a lock;
    PostgreSQL: a connection pool, rows locked by the statements that need it). The parts of
    the store (keys, datasets, jobs, prompts, SAP sessions) are mixins over this class."""

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

    def describe(self) -> str:
        return str(self.path) if self.path is not None else public_url(self.url)

    # -- plumbing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _tx(self) -> Iterator[sa.Connection]:
        """One transaction (committed on success, rolled back on any exception)."""
        with self._lock, self.engine.begin() as conn:
            yield conn

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

    def __enter__(self) -> Self:
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
    def _lock_row(conn: sa.Connection, name: str, shared: bool = False) -> None:
        """Hold the named lock row until the transaction ends, exclusive or ``shared``
        (PostgreSQL; a no-op read on SQLite, whose BEGIN IMMEDIATE serializes writers
        already)."""
        conn.execute(sa.select(locks.c.name).where(locks.c.name == name)
                     .with_for_update(read=shared))

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
