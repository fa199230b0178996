"""Persistent store: keys, datasets, jobs and prompts in SQLite (default) or PostgreSQL.

One ``Store`` class, two backends chosen by the target it is opened on: a path or
``sqlite:///path`` (the embedded default: one file, WAL) or ``postgresql://user@host/db`` (a
multi-writer server several API and worker processes share). The queries are SQLAlchemy Core,
so the same statements run on both; the schema is the ``Table`` list in ``schema``, created and
upgraded by the numbered ``MIGRATIONS`` (applied once each, recorded in ``schema_version``).

Prompt tensors and dataset rows live in a folder beside the database (``files``:
``<db>.files`` for SQLite, given with ``files=`` for PostgreSQL, a shared filesystem when
several machines run jobs): ``datasets/<id>.json`` (token ids and labels, never in the
database, so deleting the file erases them), ``prompts/<id>`` safetensors folders and
``checkpoints/<job id>.pt``. A dataset's file takes its name only once its row is committed,
and the service's start-up erases files without a row (``reconcile_dataset_files``), so a
crash at any point leaves no tenant data that nothing lists. Every lookup of a user object
takes the owner's key id, so one key can never read another key's rows.

Jobs are the queue: a job row is claimed by one worker with a conditional update
(``state='queued'`` -> ``'running'``, the worker's id, a heartbeat), so two workers, threads or
processes or machines, never run the same job; a worker whose heartbeat stops (crash, killed
process, lost machine) loses its jobs to the next worker that looks (``stale_jobs`` /
``release_stale``), which resumes them from their checkpoint.

SQLite: the database file is created 0600 and the folders the store creates 0700: they hold
every tenant's data. Deleted rows are overwritten in the file (``secure_delete``) and the WAL
is checkpointed and truncated after every delete, so no copy stays in ``-wal`` either.

Keys: revoking one cancels its jobs and ends its split and console sessions; purging one deletes
everything it owns (``purge_key``).

The package, one part per module: ``schema`` (tables, migrations), ``files`` (private files,
erasure), ``connection`` (URL, engine, transactions: ``StoreBase``), and a mixin per kind of
row: ``keys``, ``datasets``, ``jobs`` (the queue), ``prompts``, ``sap`` (split sessions),
``sessions`` (console sign-ins).
"""

from __future__ import annotations

from pathlib import Path

from rapt.service.store.connection import StoreBase, public_url, sql, store_url
from rapt.service.store.datasets import QUOTA_FIX, DatasetStore, QuotaError
from rapt.service.store.files import erase_file, private_tree
from rapt.service.store.jobs import JobStore, QueueFullError
from rapt.service.store.keys import KeyStore, LastAdminKeyError
from rapt.service.store.prompts import PromptStore
from rapt.service.store.sap import SapStore
from rapt.service.store.schema import MIGRATIONS, USER_TABLES, new_id
from rapt.service.store.sessions import SessionStore

__all__ = [
    "MIGRATIONS",
    "QUOTA_FIX",
    "USER_TABLES",
    "LastAdminKeyError",
    "QueueFullError",
    "QuotaError",
    "Store",
    "erase_file",
    "new_id",
    "private_tree",
    "public_url",
    "sql",
    "store_url",
]


class Store(KeyStore, DatasetStore, JobStore, PromptStore, SapStore, SessionStore, StoreBase):
    """The store: keys, datasets, jobs, prompts, SAP sessions and console sessions over one
    connection (see
    ``StoreBase`` for the backends and their locking)."""

    def __init__(self, target: str | Path, files: str | Path | None = None):
        super().__init__(target, files)
        self._move_data_to_files()  # rows an earlier release kept in the database
