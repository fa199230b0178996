"""Persistent store (see :mod:`rapt.service.store.connection`)."""

from rapt.service.store.connection import (
    MIGRATIONS,
    QUOTA_FIX,
    USER_TABLES,
    LastAdminKeyError,
    QueueFullError,
    QuotaError,
    Store,
    erase_file,
    new_id,
    private_tree,
    public_url,
    sql,
    store_url,
    write_private,
)

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
    "write_private",
]
