"""What a frame made from a result may promise, and what a restart finds.

The backend interface's promise: a reply made from a call's result leaves the backend's
gate only once the change is durable; a push made from a claim's, once the claim is
written. Each check runs on every durable backend (``durable``) and reads, right when that frame
would leave, what a broker killed at that moment would find at its next start
(``Rig.on_disk``): a copy of SQLite's files, loaded; PostgreSQL's database, read by a
second backend. (The memory backend keeps nothing between runs and promises nothing of
the kind.)
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from conveyor.broker.backend import Claim, Enqueue, LocalBackend, Report
from conveyor.broker.egress import Out
from conveyor.broker.engine import Changes, JobState
from conveyor.broker.scheduler import SteppedScheduler
from conveyor.broker.store import SqliteStore, StoreError

from .conftest import START, Heard, Rig

EPS = 1e-3


async def test_an_answered_enqueue_is_on_disk(durable: Rig) -> None:
    (job_id,) = await durable.backend.enqueue([Enqueue("q", {"a": 1}, key="k")])
    assert isinstance(job_id, str)
    await durable.through_gate(Out.REPLY)
    job = await durable.on_disk_job(job_id)
    assert job is not None and job.payload == {"a": 1} and job.key == "k"


async def test_a_claim_is_written_before_it_is_handed_back(durable: Rig) -> None:
    ids = [await durable.put() for _ in range(3)]
    (got,) = await durable.backend.claim([Claim("w", ("q",), 3)])
    await durable.through_gate(Out.PUSH)
    for job in await durable.on_disk([c.id for c in got]):
        assert job is not None and job.state is JobState.PROCESSING
        assert job.worker_id == "w" and job.attempts == 1
    assert sorted(c.id for c in got) == sorted(ids)


async def test_acks_reports_and_cancels_are_on_disk(durable: Rig) -> None:
    for _ in range(4):
        await durable.put()
    a, b, c, d = await durable.take(n=4)
    await durable.backend.ack([(a.id, a.lease)])
    await durable.backend.report(
        [Report(b.id, b.lease, retry=True, delay_s=9.0), Report(c.id, c.lease, retry=False)]
    )
    await durable.backend.cancel([d.id])
    await durable.through_gate(Out.REPLY)
    acked, retried, dead, cancelled = await durable.on_disk([a.id, b.id, c.id, d.id])
    assert acked is None
    assert retried is not None and retried.state is JobState.PENDING
    assert retried.ready_at == START + 9.0
    assert dead is not None and dead.state is JobState.DEAD
    assert cancelled is None


async def test_a_reopened_backend_finds_the_table_and_its_leases(durable: Rig) -> None:
    await durable.backend.set_queue("q")
    held = await durable.put(visibility_timeout_s=60.0)
    waiting = await durable.put(delay_s=30.0)
    await durable.backend.pause("p")
    (claimed,) = await durable.take(worker="w")
    assert claimed.id == held
    await durable.backend.close()
    clock = SteppedScheduler(start=START + 1)
    again = await durable.reopen(clock)
    heard = Heard()
    again.listen(heard)
    try:
        # Its timer is set from the start, before any call: the delayed job is announced
        # at its time.
        await asyncio.sleep(0)
        clock.advance(29 - EPS)
        assert not heard.work
        clock.advance(EPS)
        assert heard.told_work("q")
        assert await again.held_leases() == [(held, claimed.lease, "w")]
        assert await again.reattach("w", [(held, claimed.lease)]) == [(held, claimed.lease)]
        job = (await again.get_jobs([waiting]))[0]
        assert job is not None and job.ready_at == START + 30.0
        assert (await again.stats(["p"]))["p"].paused
        assert await again.ack([(held, claimed.lease)]) == [True]
    finally:
        await again.close()


class FailingStore(SqliteStore):
    """A SQLite store whose commits fail once ``broken`` is set (a full disk, say)."""

    broken = False

    def commit_now(self, changes: Changes, written: Callable[[], None] = lambda: None) -> bool:
        if self.broken:
            raise StoreError("store: the disk is full")
        return bool(super().commit_now(changes, written))


async def test_a_failed_store_fails_the_call_and_every_later_one(tmp_path: Path) -> None:
    store = FailingStore(tmp_path / "db", sync="normal")
    failures: list[StoreError] = []
    backend = LocalBackend(
        store,
        SteppedScheduler(start=START),
        max_payload_bytes=1 << 20,
        rng=random.Random(1),
        on_failure=failures.append,
    )
    try:
        (ok,) = await backend.enqueue([Enqueue("q", 1)])
        assert isinstance(ok, str)
        store.broken = True
        await backend.enqueue([Enqueue("q", 2)])  # decided, not yet written
        with pytest.raises(StoreError, match="disk is full"):
            await backend.settle()  # the commit failed: it never will be
        assert len(failures) == 1
        with pytest.raises(StoreError):
            await backend.get_jobs([ok])
    finally:
        await backend.close()
