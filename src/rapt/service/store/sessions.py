"""Console sessions in the store: a row per sign-in, keyed by the SHA-256 of its random token,
ended by sign-out, by idle or absolute expiry, and by revoking or purging its key."""

from __future__ import annotations

import sqlalchemy as sa

from rapt.service.store.connection import StoreBase
from rapt.service.store.schema import api_keys, console_sessions


class SessionStore(StoreBase):
    """The ``console_sessions`` rows (times in seconds, from the caller's clock)."""

    def create_session(self, key_id: str, token_hash: str, now: float, idle_s: float,
                       max_s: float) -> None:
        """A new session of key ``key_id``; expired sessions of every key are deleted on the
        way (a sign-in is rare enough to carry that housekeeping)."""
        s = console_sessions.c
        with self._tx() as conn:
            conn.execute(console_sessions.delete().where(sa.or_(
                s.last_seen < now - idle_s, s.created < now - max_s)))
            conn.execute(console_sessions.insert().values(
                token_hash=token_hash, key_id=key_id, created=now, last_seen=now))

    def session_owner(self, token_hash: str, now: float, idle_s: float,
                      max_s: float) -> str | None:
        """The key id of a live session, whose last use becomes ``now``; None for an unknown
        or ended session, one idle for more than ``idle_s`` or begun more than ``max_s`` ago
        (deleted then), or one of a revoked key."""
        s, k = console_sessions.c, api_keys.c
        with self._tx() as conn:
            row = conn.execute(sa.select(s.key_id, s.created, s.last_seen, k.revoked)
                               .join(api_keys, k.id == s.key_id)
                               .where(s.token_hash == token_hash)
                               .with_for_update(of=console_sessions)).first()
            if row is None:
                return None
            if (row.revoked is not None or now - row.last_seen > idle_s
                    or now - row.created > max_s):
                conn.execute(console_sessions.delete().where(s.token_hash == token_hash))
                return None
            conn.execute(console_sessions.update().where(s.token_hash == token_hash)
                         .values(last_seen=max(now, row.last_seen)))
            return row.key_id

    def end_session(self, token_hash: str) -> None:
        self._exec(console_sessions.delete().where(console_sessions.c.token_hash == token_hash))

    def count_sessions(self, key_id: str) -> int:
        """Live or not yet cleaned-up sessions of a key (for operators and tests)."""
        with self._tx() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(console_sessions)
                                    .where(console_sessions.c.key_id == key_id)).scalar())
