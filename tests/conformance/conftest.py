"""The backend conformance suite's seam: a ``backend`` fixture, once per backend.

Every test here runs the job contract (``docs/contract.md``) through the ``Backend``
interface (``broker/backend``) on each backend: the memory one, SQLite with
``--sync normal`` and SQLite with ``--sync full`` (the default, its fsyncs made by the
helper process), and PostgreSQL (a database of its own for each test, dropped after;
``tests/conformance/pg.py``). Time is a ``SteppedScheduler``'s: it moves only when a test calls
``advance``, and the backend's timer fires then; nothing sleeps.

A backend is done when this suite is green on it: add it to ``KINDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conveyor.broker.backend import Backend, Claim, Claimed, Enqueue, LocalBackend
from conveyor.broker.backend.postgres import PostgresBackend
from conveyor.broker.egress import Out, Wait, wait_for
from conveyor.broker.engine import Job
from conveyor.broker.scheduler import SteppedScheduler
from conveyor.broker.store import MemoryStore, SqliteStore, Store
from tests.store_files import copy_store

from .pg import database
from .spread import Spread

START = 1_000_000.0
SQLITE_KINDS = ["sqlite-normal", "sqlite-full"]
DURABLE_KINDS = [*SQLITE_KINDS, "postgres"]
KINDS = ["memory", *DURABLE_KINDS]
# The suite across brokers: three backends on one database, called in turn (spread.py).
RIG_KINDS = [*KINDS, "postgres-3"]


@dataclass
class Heard:
    """A listener that writes down what it is told."""

    work: list[frozenset[str] | None] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)

    def work_waiting(self, queues: frozenset[str] | None) -> None:
        self.work.append(queues)

    def cancelled(self, job_ids: Sequence[str]) -> None:
        self.cancels.extend(job_ids)

    def told_work(self, queue: str) -> bool:
        """Whether it was told that work of ``queue`` may be waiting, since the last
        ``forget``."""
        return any(seen is None or queue in seen for seen in self.work)

    def forget(self) -> None:
        self.work.clear()
        self.cancels.clear()


@dataclass
class Rig:
    """A backend under test, its clock, what its listener heard, and where it keeps its
    table: its files (``path``), or its database (``dsn``, for postgres)."""

    kind: str
    backend: Backend
    clock: SteppedScheduler
    heard: Heard
    path: Path
    dsn: str = ""

    async def put(self, queue: str = "q", payload: object = None, **opts: Any) -> str:
        """Enqueue one job; its id (the test fails if it was refused)."""
        (result,) = await self.backend.enqueue([Enqueue(queue, payload, **opts)])
        assert isinstance(result, str), result
        return result

    async def take(
        self, queues: Sequence[str] = ("q",), n: int = 1, worker: str = "w"
    ) -> list[Claimed]:
        """One claim of up to ``n`` jobs of ``queues`` for ``worker``."""
        (got,) = await self.backend.claim([Claim(worker, tuple(queues), n)])
        return got

    async def job(self, job_id: str) -> Job | None:
        (job,) = await self.backend.get_jobs([job_id])
        return job

    async def through_gate(self, out: Out) -> None:
        """Return once a frame of kind ``out``, made now, would leave the backend's gate
        (``broker/egress.py``): what a peer is told only after that has to be so."""
        wait = wait_for(out, subscribed=True)
        if wait is Wait.NOTHING:
            return
        released = asyncio.get_running_loop().create_future()

        def deliver(_: bytes) -> None:
            if not released.done():
                released.set_result(None)

        if wait is Wait.WRITTEN:
            self.backend.gate.hold_early(deliver, b"", lambda: None)
        else:
            self.backend.gate.hold(deliver, b"")
        await asyncio.wait_for(released, 10)

    async def advance(self, seconds: float) -> None:
        """Move the backend's clock on; its timers due on the way fire. (First the loop
        runs what is due this turn: the backend sets its timer once a turn is over.)"""
        await asyncio.sleep(0)
        self.clock.advance(seconds)

    async def reopen(self, clock: SteppedScheduler) -> Backend:
        """A new backend on what this one kept (its files, or its database), as a broker
        started again finds it."""
        return await open_kept(self.kind, self.path, self.dsn, clock)

    async def on_disk(self, ids: Sequence[str]) -> list[Job | None]:
        """The jobs ``ids`` as a broker killed now would find them at its next start:
        from a copy of the store's files, or from the database by a second backend."""
        if self.kind.startswith("postgres"):
            kept = await open_kept(self.kind, self.path, self.dsn, SteppedScheduler(self.now))
        else:
            copy = copy_store(self.path, self.path.parent / "copy")
            kept = await open_kept("sqlite-normal", copy, "", SteppedScheduler(self.now))
        try:
            return await kept.get_jobs(ids)
        finally:
            await kept.close()

    async def on_disk_job(self, job_id: str) -> Job | None:
        (job,) = await self.on_disk([job_id])
        return job

    @property
    def now(self) -> float:
        return self.clock.now()


def make_store(kind: str, path: Path) -> Store:
    if kind == "memory":
        return MemoryStore()
    return SqliteStore(path, sync="normal" if kind == "sqlite-normal" else "full")


async def make_backend(
    kind: str,
    path: Path,
    dsn: str,
    clock: SteppedScheduler,
    *,
    rng: random.Random | None = None,
    id_prefix: str | None = None,
) -> Backend:
    """A backend of ``kind`` on ``path`` (a local one) or ``dsn`` (postgres)."""
    if kind == "postgres-3":
        return await Spread.open(dsn, clock, rng=rng, id_prefix=id_prefix)  # type: ignore[return-value]
    if kind == "postgres":
        return await PostgresBackend.open(
            dsn, clock, max_payload_bytes=1 << 20, rng=rng, id_prefix=id_prefix
        )
    return LocalBackend(
        make_store(kind, path), clock, max_payload_bytes=1 << 20, rng=rng, id_prefix=id_prefix
    )


async def open_kept(kind: str, path: Path, dsn: str, clock: SteppedScheduler) -> Backend:
    """A backend on the table a durable backend of ``kind`` kept (SQLite's files are
    opened with ``--sync normal``: the sync mode changes nothing that is read)."""
    return await make_backend(
        "postgres" if kind.startswith("postgres") else "sqlite-normal", path, dsn, clock
    )


@pytest.fixture(params=RIG_KINDS)
async def rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    """A backend of each kind, new and empty."""
    async with _rig(request.param, tmp_path) as made:
        yield made


@pytest.fixture(params=DURABLE_KINDS)
async def durable(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    """A backend of each kind that keeps its table between runs."""
    async with _rig(request.param, tmp_path) as made:
        yield made


@contextlib.asynccontextmanager
async def _rig(kind: str, tmp_path: Path) -> AsyncIterator[Rig]:
    path = tmp_path / "conveyor.db"
    async with contextlib.AsyncExitStack() as stack:
        dsn = await stack.enter_async_context(database()) if kind.startswith("postgres") else ""
        clock = SteppedScheduler(start=START)
        backend = await make_backend(kind, path, dsn, clock, rng=random.Random(7))
        heard = Heard()
        backend.listen(heard)
        try:
            yield Rig(kind, backend, clock, heard, path, dsn)
        finally:
            await backend.close()
