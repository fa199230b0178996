"""API keys in the store: add, look up, revoke (cancelling the key's jobs and deleting its SAP
sessions) and purge (deleting everything the key owns)."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from rapt.service.store.connection import StoreBase
from rapt.service.store.schema import (
    api_keys,
    console_sessions,
    datasets,
    jobs,
    new_id,
    prompts,
    sap_sessions,
)

# A key's name is a label people read in lists and type to confirm a revoke or a purge.
MAX_KEY_NAME = 100  # characters


class LastAdminKeyError(ValueError):
    """Revoking this key would leave no live admin key: nobody could use the operator routes
    (revoke, purge, stats) over HTTP any more."""


class KeyStore(StoreBase):
    """The ``api_keys`` rows."""

    def add_key(self, name: str, key_hash: str, admin: bool = False) -> str:
        kid = new_id("key")
        self._exec(api_keys.insert().values(id=kid, name=name, key_hash=key_hash,
                                            created=time.time(), admin=int(admin)))
        return kid

    def check_key_name(self, name: str) -> None:
        """ValueError saying why ``name`` cannot name a new key: empty, longer than
        ``MAX_KEY_NAME`` characters, holding a control character, or the name of a live key
        (a revoke or purge by name must find one key)."""
        if not name.strip():
            raise ValueError("give the new key a name")
        if len(name) > MAX_KEY_NAME:
            raise ValueError(f"a key name has at most {MAX_KEY_NAME} characters; this one has "
                             f"{len(name)}")
        if any(not ch.isprintable() for ch in name):
            raise ValueError("a key name holds printable characters only (no tab, newline or "
                             "other control character)")
        c = api_keys.c
        if self._one(sa.select(c.id).where(c.name == name, c.revoked.is_(None))) is not None:
            raise ValueError(f"a live key is named '{name}' already; choose another name (or "
                             "revoke that key first)")

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
        prompt), its split sessions deleted, its console sessions ended. Returns (cancelled job
        ids, running job ids, session folders to remove). LastAdminKeyError (nothing changed)
        for the last live admin key."""
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
        conn.execute(console_sessions.delete().where(console_sessions.c.key_id == kid))
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
