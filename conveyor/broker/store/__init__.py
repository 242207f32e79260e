"""Where the job table lives between runs: ``memory`` (nowhere) or ``sqlite`` (a file).

A store never decides anything: the engine decides, and a durable store writes down
what ``JobTable.take_changes()`` says was decided, then answers when it is on disk.

::

    Exception
     └── StoreError   the store cannot be opened or written; the message says why
"""

from __future__ import annotations

from ._base import Store, StoreError
from .memory import MemoryStore
from .sqlite import SqliteStore

__all__ = ["MemoryStore", "SqliteStore", "Store", "StoreError", "open_store"]


def open_store(kind: str, path: str, *, sync: str = "full", accept_loss: bool = False) -> Store:
    """The store ``kind`` names (``memory`` or ``sqlite``); raises ``StoreError``."""
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SqliteStore(path, sync=sync, accept_loss=accept_loss)
    raise StoreError(f"store: unknown store {kind!r} (choose memory or sqlite)")
