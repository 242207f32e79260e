"""Fixtures for the engine's contract tests (``docs/contract.md``): a manual clock and a
seeded table.

The ``table`` fixture is the conformance suite's seam: every contract test runs once
on the in-memory table and once on a table kept in SQLite. In the SQLite run, each time
the test moves the clock, and again when it ends, everything the table decided so far is
committed to the file, a second table is rebuilt from that file alone, and the two must
agree on every job, every queue's counts, every schedule and the next timed event.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conveyor.broker.engine import JobTable
from conveyor.broker.store import SqliteStore
from tests.store_files import copy_store

START = 1000.0


class ManualClock:
    """A clock the test drives by hand. It stands still until told to move, never backwards
    (TIM-1, TIM-3)."""

    def __init__(self, now: float = START) -> None:
        self.now = now
        self.on_advance: list[Callable[[], None]] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> float:
        assert dt >= 0, "the clock never goes backwards"
        for hook in self.on_advance:
            hook()
        self.now += dt
        return self.now

    def set(self, t: float) -> float:
        assert t >= self.now, "the clock never goes backwards"
        for hook in self.on_advance:
            hook()
        self.now = t
        return self.now


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def rng() -> random.Random:
    return random.Random(1234)


def assert_same(live: JobTable, path: Path, clock: ManualClock) -> None:
    """Rebuild a table from what ``path`` holds now (``live``'s changes committed to it)
    and compare. The live store keeps the database locked, so a copy of its files (taken
    between commits, so a consistent one) is loaded."""
    copy = copy_store(path, path.parent / "snapshot")
    store = SqliteStore(copy, sync="normal")  # (no fsync helper to start: loads only)
    try:
        restored = store.load(clock=clock, rng=random.Random(0), max_payload_bytes=1 << 20)
    finally:
        store.close()
    assert sorted(restored.queues()) == sorted(live.queues())
    for name in live.queues():  # options are configuration, not stored state
        restored.queue(name, live.queue(name).opts)
    for n in range(1, live._seq + 1):
        job_id = f"{live.id_prefix}{n:x}"
        assert restored.get_job(job_id) == live.get_job(job_id), job_id
        assert restored.dependency_results(job_id) == live.dependency_results(job_id), job_id
    for name in live.queues():
        assert restored.queue(name).stats() == live.queue(name).stats(), name
    assert restored.list_schedules(limit=1000) == live.list_schedules(limit=1000)
    assert restored.next_event_at() == live.next_event_at()


@pytest.fixture(params=["memory", "sqlite"])
def table(
    request: pytest.FixtureRequest, clock: ManualClock, rng: random.Random, tmp_path: Path
) -> Iterator[JobTable]:
    if request.param == "memory":
        yield JobTable(clock=clock, rng=rng, id_prefix="t")
        return
    path = tmp_path / "conveyor.db"
    store = SqliteStore(path)
    live = store.load(clock=clock, rng=rng, max_payload_bytes=1 << 20, id_prefix="t")

    def checkpoint() -> None:
        store.write(live.take_changes())
        assert_same(live, path, clock)

    clock.on_advance.append(checkpoint)
    yield live
    clock.on_advance.remove(checkpoint)
    checkpoint()
    store.close()
