"""The store interface every backend implements."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Protocol

from ..engine import Changes, JobTable

__all__ = ["Store", "StoreError"]


class StoreError(Exception):
    """The store cannot be opened, read or written. The broker must not go on."""


class Store(Protocol):
    """What the server needs from a store.

    ``load`` once at start; then, when ``durable``, ``commit_now`` or else ``commit``
    each batch of changes (one call at a time, in order) and release the replies that
    depend on it once it is durable (when the call returns ``True``, the future it
    returned ends, or ``commit`` returns); ``close`` at the end.
    """

    name: str
    durable: bool
    # Whether a commit waits on the disk (an fsync by another process or thread).
    slow_commits: bool

    def load(
        self,
        *,
        clock: Callable[[], float],
        rng: random.Random,
        max_payload_bytes: int,
        id_prefix: str | None = None,
    ) -> JobTable:
        """The table as last committed (a new empty one the first time). Raises StoreError."""
        ...

    def commit_now(
        self, changes: Changes, written: Callable[[], None] = ...
    ) -> bool | asyncio.Future[None]:
        """Write ``changes`` here and now when that is quick (no checkpoint due), and
        return ``True`` if they are then as durable as ``commit`` would make them, or a
        future that ends when they are (an fsync in flight; it raises StoreError if that
        fails; such futures end in the order of their commits, and later commits may be
        written meanwhile). Else write nothing and return ``False``: then call ``commit``.
        ``written`` is called once the commit's claims survive a killed broker, if an
        fsync is to follow: between the write and that fsync, or, for a commit of claims
        only, before the write, once they are in the claim log (``sqlite``). It must not
        raise. Raises StoreError."""
        ...

    async def commit(self, changes: Changes, written: Callable[[], None] = ...) -> None:
        """Write ``changes`` in one transaction; return once it is durable, having
        called ``written`` as ``commit_now`` does. Raises StoreError."""
        ...

    def close(self) -> None:
        """Flush and release the backend. Idempotent."""
        ...
