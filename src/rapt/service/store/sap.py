"""SAP split sessions in the store: the rows, their folders under ``<files>/sap/<id>/``, and the
release chunks counted in the owner's storage quota."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from rapt.service.store.connection import StoreBase
from rapt.service.store.datasets import QUOTA_FIX, QuotaError
from rapt.service.store.files import _private_dir
from rapt.service.store.schema import api_keys, new_id, sap_sessions


class SapStore(StoreBase):
    """The ``sap_sessions`` rows and their folders."""

    def owned_sap_sessions(self, owner: str) -> list[str]:
        """Ids of a key's split sessions."""
        return [r["id"] for r in self._rows(sa.select(sap_sessions.c.id)
                                            .where(sap_sessions.c.owner == owner))]

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
