"""The store's files beside the database: created private (0700 folders, 0600 files: written
with :func:`rapt.artifacts.write_private`), erased by overwriting before unlinking."""

from __future__ import annotations

import os
from pathlib import Path


def _private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) 0700; a folder that exists keeps its mode."""
    if not path.exists():
        _private_dir(path.parent)
        path.mkdir(mode=0o700, exist_ok=True)


def _private_file(path: Path) -> None:
    """Create ``path`` 0600 if missing, and tighten it to 0600 if it exists."""
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    os.chmod(path, 0o600)


def private_tree(path: Path) -> None:
    """Tighten a folder the service wrote (a saved prompt) to 0700 folders and 0600 files,
    whatever the umask of the code that wrote it."""
    path = Path(path)
    if path.is_dir():
        for root, _dirs, files in os.walk(path):
            os.chmod(root, 0o700)
            for f in files:
                os.chmod(os.path.join(root, f), 0o600)
    elif path.exists():
        os.chmod(path, 0o600)


def erase_file(path: Path) -> None:
    """Overwrite a file with zeros before unlinking it (best effort: a journaling or
    copy-on-write filesystem may keep old blocks), so a plain read of the freed blocks finds
    nothing; a missing file is fine."""
    try:
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.write(b"\0" * size)
            f.flush()
            os.fsync(f.fileno())
        os.unlink(path)
    except FileNotFoundError:
        pass
