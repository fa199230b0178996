"""Tuned prompts in the store: the rows (the safetensors folders are the caller's)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from rapt.service.store.connection import StoreBase
from rapt.service.store.schema import prompts


class PromptStore(StoreBase):
    """The ``prompts`` rows."""

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
