"""The backend conformance suite's seam: a ``backend`` fixture, once per backend.

Every test here runs the job contract (``docs/contract.md``) through the ``Backend``
interface (``broker/backend``) on each backend: the memory one, SQLite with
``--sync normal`` and SQLite with ``--sync full`` (the default, its fsyncs made by the
helper process). Time is a ``SteppedScheduler``'s: it moves only when a test calls
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

from broker.backend import Backend, Claim, Claimed, Enqueue, LocalBackend
from broker.egress import Out, Wait, wait_for
from broker.engine import Job, JobTable
from broker.scheduler import SteppedScheduler
from broker.store import MemoryStore, SqliteStore, Store
from tests.store_files import copy_store

START = 1_000_000.0
DURABLE_KINDS = ["sqlite-normal", "sqlite-full"]
KINDS = ["memory", *DURABLE_KINDS]


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
    """A backend under test, its clock, what its listener heard, and its files."""

    kind: str
    backend: Backend
    clock: SteppedScheduler
    heard: Heard
    path: Path

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

    def on_disk(self) -> JobTable:
        """The table as the store's files hold it now, loaded from a copy of them (as a
        broker killed now would find it at its next start)."""
        store = SqliteStore(copy_store(self.path, self.path.parent / "copy"), sync="normal")
        try:
            return store.load(clock=self.clock.now, rng=random.Random(0), max_payload_bytes=1 << 20)
        finally:
            store.close()

    def on_disk_job(self, job_id: str) -> Job | None:
        return self.on_disk().get_job(job_id)


def make_store(kind: str, path: Path) -> Store:
    if kind == "memory":
        return MemoryStore()
    return SqliteStore(path, sync="normal" if kind == "sqlite-normal" else "full")


@pytest.fixture(params=KINDS)
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
    clock = SteppedScheduler(start=START)
    backend = LocalBackend(
        make_store(kind, path), clock, max_payload_bytes=1 << 20, rng=random.Random(7)
    )
    heard = Heard()
    backend.listen(heard)
    try:
        yield Rig(kind, backend, clock, heard, path)
    finally:
        await backend.close()
