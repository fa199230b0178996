"""The store's schema: every table in one place, the numbered migrations that create and
upgrade them (applied once each, recorded in ``schema_version``), and row ids."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

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
    # The stage after the training steps the job is in (migration 7): JSON {name, done,
    # total, started}; NULL: none.
    Column("stage", Text),
    # The step its checkpoint holds (migration 10): where it resumes after a crash, while
    # ``step`` may hold a later step's progress.
    Column("checkpoint_step", Integer),
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

# Console sign-ins (migration 9): the SHA-256 of a session's random token (the browser's
# cookie holds the token, never the API key), the key it acts for, when it began and when it
# was last used (idle and absolute expiry).
console_sessions = sa.Table(
    "console_sessions", metadata,
    Column("token_hash", Text, primary_key=True),
    Column("key_id", Text, sa.ForeignKey("api_keys.id"), nullable=False),
    Column("created", Double, nullable=False), Column("last_seen", Double, nullable=False),
    Index("console_sessions_key", "key_id"))

# Named rows locked (SELECT ... FOR UPDATE) to serialize a check-then-insert across processes
# on PostgreSQL; SQLite's write transactions are serialized already.
locks = sa.Table("locks", metadata, Column("name", Text, primary_key=True))

schema_version = sa.Table(
    "schema_version", metadata,
    Column("version", Integer, primary_key=True), Column("name", Text, nullable=False),
    Column("applied", Double, nullable=False))

USER_TABLES = ("api_keys", "datasets", "jobs", "prompts", "sap_sessions")


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
    Migration(7, "a job's stage after training (the output denoiser's fit)", (
        add_columns("jobs", "stage"),)),
    Migration(8, "the lock between dataset uploads and the datasets folder's reconciliation", (
        insert_rows("locks", {"name": "dataset_files"}),)),
    Migration(9, "console sessions", (create_tables("console_sessions"),)),
    Migration(10, "the step a job's checkpoint holds", (add_columns("jobs", "checkpoint_step"),)),
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"
