"""Schedules through the SDK as users run them (docs/schedules.md): ``Client`` and
``SyncClient`` make, list, pause, resume, run and delete them, and a ``Worker`` receives
exactly the jobs of the ticks, against a real broker on the memory and the SQLite
store whose clock the test moves (a ``SteppedScheduler``): no sleeping for time to pass."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import InvalidArgument, ScheduleInfo, SchedulePage, SyncClient
from conveyor.broker.scheduler import SteppedScheduler
from conveyor.broker.server import Broker, running_broker
from conveyor.sdk import Client, Job, Worker

from .conftest import BASE_CONFIG, WAIT, Probe, running

T0 = 1_800_000_000.0  # a round minute: "every 10 s" ticks fall on whole tens


@pytest.fixture
def clock() -> SteppedScheduler:
    return SteppedScheduler(start=T0)


@pytest.fixture(params=["memory", "sqlite"])
async def broker(
    request: pytest.FixtureRequest, clock: SteppedScheduler, tmp_path: Path
) -> AsyncIterator[Broker]:
    config = dataclasses.replace(
        BASE_CONFIG, store=request.param, db_path=str(tmp_path / "conveyor.db")
    )
    async with running_broker(config, scheduler=clock) as started:
        yield started


class Received:
    """The jobs a worker's handler got, and a wait for a count of them."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self._changed = asyncio.Event()

    def add(self, job: Job) -> None:
        self.jobs.append(job)
        self._changed.set()

    async def count(self, n: int) -> list[Job]:
        async with asyncio.timeout(WAIT):
            while len(self.jobs) < n:
                self._changed.clear()
                await self._changed.wait()
        return self.jobs


def make_worker(broker: Broker, queue: str, received: Received) -> Worker:
    worker = Worker(broker.url, queues=[queue], shutdown_timeout_s=1.0)

    @worker.handler(queue)
    async def handle(job: Job) -> None:
        received.add(job)

    return worker


async def test_a_worker_receives_exactly_the_ticks_jobs(
    broker: Broker, client: Client, clock: SteppedScheduler, probe: Probe
) -> None:
    info = await client.set_schedule("beat", "beats", {"n": 1}, every_s=10)
    assert isinstance(info, ScheduleInfo)
    assert (info.id, info.queue, info.every_s, info.cron, info.tz) == (
        "beat",
        "beats",
        10,
        None,
        "UTC",
    )
    assert info.next_at == T0 + 10 and info.fired == 0 and info.last_at is None
    received = Received()
    async with running(make_worker(broker, "beats", received), probe):
        for tick in range(1, 6):
            clock.advance(10)
            await received.count(tick)
        assert [job.payload for job in received.jobs] == [{"n": 1}] * 5
        now = await client.get_schedule("beat")
        assert now is not None
        assert now.fired == 5 and now.last_at == T0 + 50 and now.next_at == T0 + 60
        assert now.last_job == received.jobs[-1].id
        assert len({job.id for job in received.jobs}) == 5


async def test_each_ticks_job_carries_its_key(client: Client, clock: SteppedScheduler) -> None:
    await client.set_schedule("keyed", "keyed", every_s=10)
    clock.advance(30)
    page = await client.list_jobs("keyed", "ready")
    assert sorted(job.key or "" for job in page.jobs) == [
        f"schedule:keyed:{round((T0 + t) * 1000)}" for t in (10, 20, 30)
    ]


async def test_pause_resume_run_delete_and_listing(
    broker: Broker, client: Client, clock: SteppedScheduler, probe: Probe
) -> None:
    start = datetime.datetime.fromtimestamp(T0 + 100, datetime.UTC)
    info = await client.set_schedule(
        "later", "work", cron="*/5 * * * *", tz="Europe/Paris", start_at=start, priority=4
    )
    assert info.start_at == T0 + 100 and info.tz == "Europe/Paris" and info.priority == 4
    await client.set_schedule("often", "work", every_s=10)
    received = Received()
    async with running(make_worker(broker, "work", received), probe):
        paused = await client.pause_schedule("often")
        assert paused is not None and paused.paused and paused.next_at is None
        clock.advance(20)
        job_id = await client.run_schedule("often")  # run now, even paused
        assert job_id is not None
        jobs = await received.count(1)
        assert [job.id for job in jobs] == [job_id]
        resumed = await client.resume_schedule("often")
        assert resumed is not None and resumed.next_at == T0 + 30
        clock.advance(10)
        await received.count(2)

        page = await client.list_schedules(limit=1)
        assert isinstance(page, SchedulePage)
        assert [s.id for s in page.schedules] == ["later"] and page.next == "later"
        rest = await client.list_schedules(after=page.next)
        assert [s.id for s in rest.schedules] == ["often"] and rest.next is None
        assert [s.id for s in await client.schedules()] == ["later", "often"]
        assert [s.id for s in await client.schedules(["often", "gone"])] == ["often"]

        assert await client.delete_schedule("often") is True
        assert await client.delete_schedule("often") is False
        assert await client.get_schedule("often") is None
        assert await client.pause_schedule("often") is None
        assert await client.resume_schedule("often") is None
        assert await client.run_schedule("often") is None


async def test_bad_definitions_are_refused_naming_the_field(client: Client) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"cron": "not cron"}, "schedule.cron"),
        ({"every_s": 5, "tz": "Nowhere/Atlantis"}, "schedule.tz"),
        ({"every_s": 5, "missed": "all"}, "schedule.missed"),
        ({}, "schedule.cron"),
        ({"every_s": float("nan")}, "every_s"),
        ({"every_s": 5, "start_at": datetime.datetime(2030, 1, 1)}, "schedule.start_at"),
    ]
    for options, field in cases:
        with pytest.raises(InvalidArgument) as refused:
            await client.set_schedule("s", "q", **options)
        assert refused.value.field == field, (options, refused.value)
    assert await client.schedules() == []


async def test_sync_client_does_the_same(broker: Broker, clock: SteppedScheduler) -> None:
    def use() -> tuple[Any, ...]:
        with SyncClient(broker.url) as sync:
            made = sync.set_schedule("sync", "q", {"a": 1}, every_s=60, missed="each")
            paused = sync.pause_schedule("sync")
            resumed = sync.resume_schedule("sync")
            job_id = sync.run_schedule("sync")
            listed = sync.schedules()
            page = sync.list_schedules(limit=5)
            one = sync.get_schedule("sync")
            deleted = sync.delete_schedule("sync")
            return made, paused, resumed, job_id, listed, page, one, deleted

    made, paused, resumed, job_id, listed, page, one, deleted = await asyncio.to_thread(use)
    assert made.missed == "each" and made.payload == {"a": 1}
    assert paused.paused and not resumed.paused and isinstance(job_id, str)
    assert [s.id for s in listed] == ["sync"] and [s.id for s in page.schedules] == ["sync"]
    assert one.fired == 1 and one.last_job == job_id and deleted is True
