"""A copy of a SQLite store's files, as a broker killed at this moment would leave them."""

from __future__ import annotations

import shutil
from pathlib import Path

# The files a SQLite store keeps beside its database (the WAL, the claim log, the commit
# marker); ``-shm`` is SQLite's index of the WAL, rebuilt at open, so never copied.
SUFFIXES = ("", "-wal", "-claims", "-commits")


def copy_store(path: Path, folder: Path) -> Path:
    """Copy the database at ``path`` and its companion files into ``folder`` (made if
    need be, replacing an earlier copy); the copy's database path. Take it between
    commits (on the event loop, not during one) for a consistent copy."""
    folder.mkdir(exist_ok=True)
    copy = folder / path.name
    for suffix in SUFFIXES:
        source = path.with_name(path.name + suffix)
        target = copy.with_name(copy.name + suffix)
        if source.exists():
            shutil.copyfile(source, target)
        else:
            target.unlink(missing_ok=True)
    copy.with_name(copy.name + "-shm").unlink(missing_ok=True)
    return copy
