"""Backends: where the job table lives, behind one interface (``Backend``).

``local`` is the engine's table in this process, kept by the memory or the SQLite store;
``postgres`` (``PostgresBackend``, imported from there) keeps it in a PostgreSQL database
that several brokers may share.
Every backend passes one conformance suite (``tests/conformance/``), run through this
interface on a manual clock.

::

    Exception
     └── StoreError (BackendError)   the backend cannot go on; the broker stops
"""

from __future__ import annotations

from collections.abc import Callable

from ..scheduler import Scheduler
from ..store import StoreError, open_store
from ._base import (
    Backend,
    BackendError,
    BackOff,
    Claim,
    Claimed,
    Enqueue,
    Finished,
    JobList,
    Later,
    Listener,
    Pending,
    Progress,
    Ready,
    Report,
    Step,
    WatchEvent,
    ready,
    then,
)
from .local import LocalBackend

__all__ = [
    "BackOff",
    "Backend",
    "BackendError",
    "Claim",
    "Claimed",
    "Enqueue",
    "Finished",
    "JobList",
    "Later",
    "Listener",
    "LocalBackend",
    "Pending",
    "Progress",
    "Ready",
    "Report",
    "Step",
    "WatchEvent",
    "database_scheduler",
    "open_backend",
    "ready",
    "then",
]


async def database_scheduler(dsn: str, inner: Scheduler) -> Scheduler:
    """A scheduler on the clock of the PostgreSQL server at ``dsn``, its callbacks run
    by ``inner``: the one clock of every broker on that database (``_pg_clock``).
    ``aclose()`` it after the backend. Raises ``StoreError``."""
    from ._pg_clock import database_scheduler as make

    return await make(dsn, inner)


async def open_backend(
    kind: str,
    path: str,
    scheduler: Scheduler,
    *,
    max_payload_bytes: int,
    sync: str = "full",
    accept_loss: bool = False,
    on_failure: Callable[[StoreError], None] = lambda exc: None,
) -> Backend:
    """The backend ``kind`` names: ``memory``, ``sqlite`` at ``path`` (its table loaded),
    or ``postgres`` at the DSN ``path`` (its schema made or migrated); raises
    ``StoreError``. Call on the running event loop."""
    if kind == "postgres":
        from .postgres import PostgresBackend  # (psycopg is loaded only when used)

        return await PostgresBackend.open(
            path, scheduler, max_payload_bytes=max_payload_bytes, on_failure=on_failure
        )
    store = open_store(kind, path, sync=sync, accept_loss=accept_loss)
    try:
        return LocalBackend(
            store, scheduler, max_payload_bytes=max_payload_bytes, on_failure=on_failure
        )
    except BaseException:
        store.close()
        raise
