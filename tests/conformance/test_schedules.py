"""Schedules through the backend interface (``docs/contract.md``, SCH-1 to SCH-11), on
every backend: a tick fires exactly once and its job is claimable, the listener is told
of its queue, the calls that keep schedules, and (durable backends) progress that
survives a restart and a broker killed right after a tick.

Time is the stepped scheduler's (``START`` = 1,000,000 s): an interval of 60 s ticks at
1,000,020, 1,000,080...; the backend fires a schedule at its own timer.
"""

from __future__ import annotations

import asyncio

import pytest

from conveyor.broker.backend import Backend
from conveyor.broker.engine import InvalidArgument, ScheduleInfo, ScheduleSpec, tick_key
from conveyor.broker.scheduler import SteppedScheduler
from tests.store_files import copy_store

from .conftest import START, Heard, Rig, open_kept

FIRST = START + 20.0  # the first tick of every 60 s after START


def every(seconds: float = 60.0, schedule_id: str = "s", **fields: object) -> ScheduleSpec:
    return ScheduleSpec(id=schedule_id, queue="q", every_s=seconds, **fields)  # type: ignore[arg-type]


async def info(backend: Backend, schedule_id: str = "s") -> ScheduleInfo:
    (found,) = await backend.schedules([schedule_id])
    return found


async def keys(rig: Rig, queue: str = "q") -> list[str | None]:
    """The keys of the ready jobs of ``queue``, oldest first."""
    page = await rig.backend.list_jobs(queue, "ready", None, 100)
    assert page is not None
    return sorted((job.key for job in page.jobs), key=str)


async def turns(n: int = 3) -> None:
    """Let the loop run what a backend set to run soon (a reopened one's first wake)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_tick_fires_exactly_once_and_its_job_is_claimable(rig: Rig) -> None:
    made = await rig.backend.set_schedule(every(payload={"n": 1}, priority=2))
    assert made.next_at == FIRST and made.fired == 0 and made.spec.payload == {"n": 1}
    await rig.advance(19.0)
    assert await rig.take() == []
    rig.heard.forget()
    await rig.advance(1.0)
    await turns()
    assert rig.heard.told_work("q")
    (got,) = await rig.take(n=5)
    assert got.priority == 2
    job = await rig.job(got.id)
    assert job is not None and job.payload == {"n": 1} and job.key == tick_key("s", FIRST)
    await rig.advance(59.0)
    await turns()
    assert await rig.take(n=5) == []  # the same tick never again
    await rig.advance(1.0)
    await turns()
    (second,) = await rig.take(n=5)
    assert second.id != got.id
    now = await info(rig.backend)
    assert (now.fired, now.last_at, now.last_job, now.next_at) == (
        2,
        FIRST + 60.0,
        second.id,
        FIRST + 120.0,
    )


async def test_a_day_of_hourly_ticks_makes_a_job_each(rig: Rig) -> None:
    await rig.backend.set_schedule(ScheduleSpec(id="h", queue="q", cron="@hourly"))
    for _ in range(24):
        await rig.advance(3600.0)
        await turns()
    made = await keys(rig)
    first = (START // 3600 + 1) * 3600
    assert made == sorted((tick_key("h", first + 3600.0 * i) for i in range(24)), key=str)


async def test_the_calls_that_keep_schedules(rig: Rig) -> None:
    b = rig.backend
    for name in ("c", "a", "b"):
        await b.set_schedule(every(schedule_id=name))
    assert [i.spec.id for i in await b.schedules()] == ["a", "b", "c"]
    assert [i.spec.id for i in await b.schedules(after="a", limit=1)] == ["b"]
    assert [i.spec.id for i in await b.schedules(["c", "zz", "a"])] == ["c", "a"]
    assert "q" in await b.queues()  # made with its schedule
    paused = await b.pause_schedule("a", True)
    assert paused is not None and paused.spec.paused and paused.next_at is None
    assert await b.pause_schedule("zz", True) is None
    await rig.advance(200.0)
    await turns()
    # b and c made a job at each tick on the way (START + 20, 80, 140, 200), a none.
    made = sorted(k.split(":")[1] for k in await keys(rig) if k)
    assert made == ["b"] * 4 + ["c"] * 4
    resumed = await b.pause_schedule("a", False)
    assert resumed is not None and resumed.next_at == START + 260.0
    run = await b.run_schedule("a")
    assert run is not None
    job = await rig.job(run)
    assert job is not None and job.key == f"schedule:a:run:{round(rig.now * 1000)}"
    assert (await info(b, "a")).next_at == START + 260.0
    assert await b.run_schedule("zz") is None
    assert await b.delete_schedule("b") is True
    assert await b.delete_schedule("b") is False
    assert [i.spec.id for i in await b.schedules()] == ["a", "c"]
    assert len(await keys(rig)) == 9  # b's jobs stay (and a's run)


async def test_same_timing_keeps_progress_new_timing_starts_after_now(rig: Rig) -> None:
    b = rig.backend
    await b.set_schedule(every(payload=1))
    await rig.advance(30.0)
    await turns()
    before = await info(b)
    kept = await b.set_schedule(every(payload=2))
    assert (kept.next_at, kept.fired, kept.last_job) == (
        before.next_at,
        before.fired,
        before.last_job,
    )
    moved = await b.set_schedule(every(3600.0, payload=2))
    assert moved.next_at == (START // 3600 + 1) * 3600 and moved.fired == 1


async def test_bad_definitions_name_the_field(rig: Rig) -> None:
    with pytest.raises(InvalidArgument) as caught:
        await rig.backend.set_schedule(ScheduleSpec(id="x", queue="q", cron="not cron"))
    assert caught.value.field == "cron"
    with pytest.raises(InvalidArgument) as caught:
        await rig.backend.set_schedule(every(schedule_id="x", max_attempts=0))
    assert caught.value.field == "max_attempts"
    assert await rig.backend.schedules() == []


async def test_progress_survives_a_restart_and_missed_ticks_follow_the_policy(
    durable: Rig,
) -> None:
    b = durable.backend
    await b.set_schedule(every(schedule_id="each", missed="each"))
    await b.set_schedule(every(schedule_id="skip", missed="skip"))
    await durable.advance(20.0)
    await turns()
    before = await info(b, "each")
    assert before.fired == 1
    await b.close()
    # Down for five ticks; back 30 s after the last (on time for skip's grace).
    clock = SteppedScheduler(start=FIRST + 300.0 + 30.0)
    again = await durable.reopen(clock)
    heard = Heard()
    again.listen(heard)
    try:
        assert (await info(again, "each")).last_job == before.last_job
        await turns(5)
        clock.advance(0.0)
        await turns(5)
        each, skip = await info(again, "each"), await info(again, "skip")
        assert each.fired == 6 and each.next_at == FIRST + 360.0
        assert skip.fired == 2 and skip.last_at == FIRST + 300.0
        page = await again.list_jobs("q", "ready", None, 100)
        assert page is not None
        got = sorted(j.key for j in page.jobs if j.key and j.key.startswith("schedule:each:"))
        assert got == sorted(tick_key("each", FIRST + 60.0 * i) for i in range(6))
        assert heard.told_work("q")
    finally:
        await again.close()


async def test_a_tick_is_kept_with_its_job_when_the_broker_is_killed(durable: Rig) -> None:
    await durable.backend.set_schedule(every())
    await durable.advance(20.0)
    await turns()
    await durable.backend.settle()
    # What a broker killed now finds: the job and the schedule's progress, or neither.
    if durable.kind.startswith("postgres"):
        kept = await open_kept(durable.kind, durable.path, durable.dsn, SteppedScheduler(FIRST))
    else:
        copy = copy_store(durable.path, durable.path.parent / "copy")
        kept = await open_kept("sqlite-normal", copy, "", SteppedScheduler(FIRST))
    try:
        now = await info(kept)
        assert now.next_at == FIRST + 60.0 and now.fired == 1
        assert now.last_job is not None
        job = (await kept.get_jobs([now.last_job]))[0]
        assert job is not None and job.key == tick_key("s", FIRST)
        await turns(5)
        assert (await info(kept)).fired == 1  # not fired again at the restart
    finally:
        await kept.close()
