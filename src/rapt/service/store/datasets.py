"""Datasets in the store: a row per dataset, its token ids and labels in a file; the per-key
storage quota."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from rapt.artifacts import write_private
from rapt.service.store.connection import StoreBase
from rapt.service.store.files import erase_file
from rapt.service.store.schema import api_keys, datasets, jobs, new_id, sap_sessions

log = logging.getLogger("rapt.service")
# The lock row that uploads hold shared and a reconciliation of the datasets folder exclusive.
DATASET_FILES = "dataset_files"
QUOTA_FIX = ("delete datasets with DELETE /v1/datasets/{id} or SAP sessions with "
             "DELETE /v1/sap/sessions/{id}")


class QuotaError(Exception):
    """A per-key storage quota would be exceeded (message names the quota)."""


class DatasetStore(StoreBase):
    """The ``datasets`` rows and their files."""

    def create_dataset(self, owner: str, backbone: str, input_ids: list[list[int]],
                       labels: list[int], num_labels: int, privacy: dict,
                       plain_ids: list[int] | None, *, max_count: int | None = None,
                       max_bytes: int | None = None) -> str:
        """Insert a dataset; raises QuotaError (nothing stored) when the owner's stored
        datasets would exceed ``max_count`` datasets or ``max_bytes`` bytes of data.

        The data goes to a temporary name inside the row's transaction and takes its own name
        after the commit, so a process killed at any point leaves a file that
        ``reconcile_dataset_files`` (run at start-up) can tell apart: a temporary file without
        a row is erased, one with a row is given its name."""
        did = new_id("ds")
        data = json.dumps({"input_ids": input_ids, "labels": labels}, separators=(",", ":"))
        try:
            self._insert_dataset(did, owner, backbone, input_ids, labels, num_labels, privacy,
                                 plain_ids, data, max_count, max_bytes)
        except BaseException:
            # A quota refusal, a failed write or a failed commit: no file without its row.
            erase_file(self._part_path(did))
            raise
        try:
            self._publish_data(did)
        except BaseException:
            self._drop_unpublished(did)
            raise
        return did

    def _insert_dataset(self, did: str, owner: str, backbone: str,
                        input_ids: list[list[int]], labels: list[int], num_labels: int,
                        privacy: dict, plain_ids: list[int] | None, data: str,
                        max_count: int | None, max_bytes: int | None) -> None:
        """The quota checks and the row, in one transaction; the data written inside it (to
        the temporary name), so a failed write stores no row."""
        size = len(data)  # ASCII JSON: characters are bytes
        c = datasets.c
        with self._tx() as conn:
            # The owner's key row is the quota's lock: two uploads of one key are checked
            # one after the other, on every backend.
            conn.execute(sa.select(api_keys.c.id).where(api_keys.c.id == owner)
                         .with_for_update())
            # Shared: uploads run together; a reconciliation waits until none is between
            # writing its file and committing its row.
            self._lock_row(conn, DATASET_FILES, shared=True)
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
            write_private(self._part_path(did), data.encode())

    def _publish_data(self, did: str) -> None:
        """Give a committed dataset's file its name (atomic); a reconciliation of another
        process may have done it already."""
        try:
            os.replace(self._part_path(did), self._data_path(did))
        except FileNotFoundError:
            if not self._data_path(did).exists():
                raise

    def _drop_unpublished(self, did: str) -> None:
        """Undo a committed dataset whose file could not take its name: no row without its
        file, no file without its row."""
        with self._tx() as conn:
            conn.execute(datasets.delete().where(datasets.c.id == did))
        for path in (self._part_path(did), self._data_path(did)):
            erase_file(path)

    def reconcile_dataset_files(self) -> dict[str, list[str]]:
        """Make the datasets folder match the rows after a crash (a killed process, a lost
        machine): a file without a live row (written before a commit that never came, or left
        by a delete or purge stopped before its erasure) is erased; a committed dataset still
        under its temporary name gets its name. Rows whose file is missing are reported (and
        logged), not deleted: jobs may name them. Runs under the lock that uploads share, so it
        never takes an upload in progress for a crashed one. Returns the names of the files
        erased and completed, and the ids of the rows without a file."""
        folder = self.files / "datasets"
        erased: list[str] = []
        completed: list[str] = []
        with self._tx() as conn:
            self._lock_row(conn, DATASET_FILES)
            live = set(conn.execute(sa.select(datasets.c.id).where(
                datasets.c.deleted.is_(None), datasets.c.data == "")).scalars())
            for f in sorted(p for p in folder.iterdir() if p.is_file()):
                name = f.name
                if (name.endswith(".json.part") and name[:-10] in live
                        and not self._data_path(name[:-10]).exists()):
                    os.replace(f, self._data_path(name[:-10]))
                    completed.append(name)
                elif not (name.endswith(".json") and name[:-5] in live):
                    erase_file(f)
                    erased.append(name)
            missing = sorted(d for d in live if not self._data_path(d).exists())
        for name in erased:
            log.warning("datasets folder: erased %s, which no dataset row owns (left by a "
                        "crash)", name)
        for name in completed:
            log.warning("datasets folder: %s was committed but kept its temporary name (a "
                        "crash after the commit); renamed", name)
        for did in missing:
            log.error("dataset %s has a row but no file in %s: its data is lost", did, folder)
        return {"erased": erased, "completed": completed, "missing": missing}

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

    def stored_bytes_by_owner(self) -> dict[str, int]:
        """``stored_bytes`` of every key that stores anything, in two grouped queries."""
        c, s = datasets.c, sap_sessions.c
        out: dict[str, int] = {}
        for r in self._rows(sa.select(c.owner, sa.func.sum(sa.func.coalesce(
                c.bytes, sa.func.length(c.data))).label("n"))
                .where(c.deleted.is_(None)).group_by(c.owner)):
            out[r["owner"]] = int(r["n"] or 0)
        for r in self._rows(sa.select(s.owner, sa.func.sum(s.release_bytes + s.state_bytes)
                                      .label("n")).group_by(s.owner)):
            out[r["owner"]] = out.get(r["owner"], 0) + int(r["n"] or 0)
        return out

    def _data_path(self, did: str) -> Path:
        """The file holding a dataset's token ids and labels (JSON)."""
        if not did.replace("_", "").isalnum():  # ids are ours; never a path from elsewhere
            raise ValueError(f"bad dataset id {did!r}")
        return self.files / "datasets" / f"{did}.json"

    def _part_path(self, did: str) -> Path:
        """The temporary name of a dataset's file until its row is committed."""
        return self._data_path(did).with_name(f"{did}.json.part")

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
