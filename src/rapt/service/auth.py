"""API keys: random secrets shown once, stored only as SHA-256 hashes."""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "rapt_"


def new_key() -> str:
    """A fresh API key: 256 random bits, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """SHA-256 hex digest. A fast hash suffices: keys are 256-bit random, not passwords."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()

