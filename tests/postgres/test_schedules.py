"""Schedules on PostgreSQL: each tick makes exactly one job, whichever broker fires it.

On the stepped clock, three backends on one database all wake for every tick and race
to fire it (also with one of them losing its connection between ticks, and with the one
that took a tick losing it inside the firing's transaction); then three real
``conveyor serve`` processes on the real clock, one schedule of every second for a
minute. Jobs are counted by their keys (``tick_key``), read from the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator

import psycopg
import pytest

from conveyor.broker.backend import database_scheduler
from conveyor.broker.backend.postgres import _DUE_SCHEDULES, _NEXT_SCHEDULE, PostgresBackend
from conveyor.broker.engine import InvalidArgument, ScheduleSpec
from conveyor.broker.engine._schedule import next_tick, tick_key
from conveyor.broker.scheduler import LoopScheduler, SteppedScheduler

from ..conformance.pg import database, until
from .test_brokers import _url
from .test_cluster import cluster

START = 1_000_000.0
MINUTE = 60


@contextlib.asynccontextmanager
async def brokers(
    dsn: str, clock: SteppedScheduler, n: int
) -> AsyncIterator[list[PostgresBackend]]:
    """``n`` backends on one database, sharing ``clock``: ``n`` brokers' tables."""
    opened: list[PostgresBackend] = []
    try:
        for _ in range(n):
            opened.append(
                await PostgresBackend.open(
                    dsn, clock, max_payload_bytes=1 << 20, rng=random.Random(7)
                )
            )
        yield opened
    finally:
        for backend in reversed(opened):
            await backend.close()


async def step(clock: SteppedScheduler, backends: list[PostgresBackend], seconds: float) -> None:
    """Move the clock on, then wait until every backend did what its timers asked."""
    await asyncio.sleep(0)
    clock.advance(seconds)
    await asyncio.sleep(0)
    for backend in backends:
        await backend.settle()


async def keys(dsn: str, queue: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT key FROM conveyor_jobs WHERE queue = %s ORDER BY seq", (queue,)
        )
        return [str(row[0]) for row in await cur.fetchall()]


async def terminate(dsn: str, pid: int) -> None:
    """Cut one session of the test's database (the server ends it, as a network cut)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def every_second(schedule_id: str = "tick", **opts: object) -> ScheduleSpec:
    return ScheduleSpec(id=schedule_id, queue="ticks", payload={"n": 1}, every_s=1.0, **opts)  # type: ignore[arg-type]


# -- the calls ------------------------------------------------------------------------------


async def test_a_schedule_fires_its_ticks_as_keyed_jobs() -> None:
    async with database() as dsn:
        clock = SteppedScheduler(start=START)
        async with brokers(dsn, clock, 1) as (backend,):
            spec = ScheduleSpec(id="s", queue="q", payload={"a": 1}, every_s=10.0, priority=3)
            info = await backend.set_schedule(spec)
            assert info.next_at == START + 10 and info.fired == 0 and info.last_job is None
            await step(clock, [backend], 10)
            (job_key,) = await keys(dsn, "q")
            assert job_key == tick_key("s", START + 10)
            (got,) = await backend.schedules(["s"])
            assert got.fired == 1 and got.last_at == START + 10 and got.next_at == START + 20
            assert got.last_job is not None
            (job,) = await backend.get_jobs([got.last_job])
            assert job is not None and job.priority == 3 and job.payload_json == b'{"a":1}'
            assert got.spec == spec


async def test_changes_pauses_runs_and_deletes() -> None:
    async with database() as dsn:
        clock = SteppedScheduler(start=START)
        async with brokers(dsn, clock, 1) as (backend,):
            spec = ScheduleSpec(id="s", queue="q", every_s=10.0)
            await backend.set_schedule(spec)
            await step(clock, [backend], 5)
            # The same timing keeps the progress; another timing starts from now.
            kept = await backend.set_schedule(
                ScheduleSpec(id="s", queue="q", every_s=10.0, priority=1)
            )
            assert kept.next_at == START + 10
            moved = await backend.set_schedule(ScheduleSpec(id="s", queue="q", every_s=7.0))
            assert moved.next_at == next_tick(moved.spec, START + 5)
            paused = await backend.pause_schedule("s", True)
            assert paused is not None and paused.next_at is None and paused.spec.paused
            await step(clock, [backend], 30)
            assert await keys(dsn, "q") == []
            resumed = await backend.pause_schedule("s", False)
            assert resumed is not None and resumed.next_at == next_tick(resumed.spec, START + 35)
            job_id = await backend.run_schedule("s")
            assert job_id is not None
            (info,) = await backend.schedules(["s"])
            assert info.fired == 1 and info.last_job == job_id and info.last_at == START + 35
            assert info.next_at == resumed.next_at
            assert await keys(dsn, "q") == [f"schedule:s:run:{round((START + 35) * 1000)}"]
            assert await backend.run_schedule("nope") is None
            assert await backend.pause_schedule("nope", True) is None
            assert await backend.delete_schedule("s") is True
            assert await backend.delete_schedule("s") is False
            assert await backend.schedules(["s"]) == []
            (job,) = await backend.get_jobs([job_id])
            assert job is not None  # the jobs it made stay


async def test_the_same_definition_again_changes_nothing() -> None:
    async with database() as dsn:
        clock = SteppedScheduler(start=START)
        async with brokers(dsn, clock, 1) as (backend,):
            first = await backend.set_schedule(
                ScheduleSpec(id="s", queue="q", every_s=10.0, payload=1)
            )
            await step(clock, [backend], 5)
            again = await backend.set_schedule(
                ScheduleSpec(id="s", queue="q", every_s=10.0, payload=1)
            )
            assert again == first  # not even its times
            # True == 1 in Python, not in JSON: a change.
            changed = await backend.set_schedule(
                ScheduleSpec(id="s", queue="q", every_s=10.0, payload=True)
            )
            assert changed.updated_at == START + 5 and changed.spec.payload is True
            assert changed.next_at == first.next_at  # the same timing keeps the progress


async def test_a_bad_spec_is_refused_naming_the_field() -> None:
    async with database() as dsn:
        clock = SteppedScheduler(start=START)
        async with brokers(dsn, clock, 1) as (backend,):
            for spec, field in (
                (ScheduleSpec(id="s", queue="q"), "cron"),
                (ScheduleSpec(id="s", queue="q", cron="nope"), "cron"),
                (ScheduleSpec(id="s", queue="q", every_s=1.0, tz="Mars/Base"), "tz"),
                (ScheduleSpec(id="s", queue="q", every_s=1.0, priority=2**31), "priority"),
                (ScheduleSpec(id="s", queue="bad name", every_s=1.0), "queue"),
                (ScheduleSpec(id="s", queue="q", every_s=1.0, payload={1}), "payload"),
            ):
                with pytest.raises(InvalidArgument) as caught:
                    await backend.set_schedule(spec)
                assert caught.value.field == field
            assert await backend.schedules() == []
            assert await backend.queues() == []  # a refused schedule makes no queue


async def test_a_page_of_schedules_in_id_order() -> None:
    async with database() as dsn:
        clock = SteppedScheduler(start=START)
        async with brokers(dsn, clock, 1) as (backend,):
            for sid in ("b", "a", "B", "c"):
                await backend.set_schedule(ScheduleSpec(id=sid, queue="q", every_s=60.0))
            page = await backend.schedules(limit=2)
            assert [i.spec.id for i in page] == ["B", "a"]
            page = await backend.schedules(after="a", limit=10)
            assert [i.spec.id for i in page] == ["b", "c"]
            named = await backend.schedules(["c", "zz", "a"])
            assert [i.spec.id for i in named] == ["c", "a"]


async def test_a_schedule_set_on_one_broker_fires_on_another() -> None:
    async with database() as dsn:
        clock = SteppedScheduler(start=START)
        async with brokers(dsn, clock, 2) as (one, other):
            await one.set_schedule(every_second())
            # The other broker hears of it (a notice) and sets its timer for it; of a
            # pause, a resume and a delete too.
            await until(lambda: other._sched_at == START + 1, "the other broker's timer")
            await one.pause_schedule("tick", True)
            await until(lambda: other._sched_at is None, "the timer unset at the pause")
            await one.pause_schedule("tick", False)
            await until(lambda: other._sched_at == START + 1, "the timer set at the resume")
            await one.set_schedule(ScheduleSpec(id="gone", queue="ticks", every_s=0.5))
            await until(lambda: other._sched_at == START + 0.5, "the timer for the new one")
            await one.delete_schedule("gone")
            await until(lambda: other._sched_at == START + 1, "the timer after the delete")
            await one.close()
            await step(clock, [other], 1)
            assert await keys(dsn, "ticks") == [tick_key("tick", START + 1)]


async def test_idle_schedules_cost_a_firing_nothing() -> None:
    """With 10,000 schedules not due, finding the due ones and the earliest tick reads the
    partial index on next_at only: no statement of a firing walks the table."""
    async with database() as dsn:
        clock = SteppedScheduler(start=START)
        async with brokers(dsn, clock, 1) as (backend,):
            await backend.set_schedule(every_second())
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute(
                    "INSERT INTO conveyor_schedules (id, queue, payload, spec, next_at, "
                    "created_at, updated_at) SELECT 'idle-' || i, 'idle', 'null', "
                    "'{\"every_s\": 86400.0}', %s + i, %s, %s "
                    "FROM generate_series(1, 10000) AS i",
                    (START + 86_400, START, START),
                )
                await conn.execute("ANALYZE conveyor_schedules")
                for query, params in (
                    (_DUE_SCHEDULES, {"now": START + 1, "n": 100}),
                    (_NEXT_SCHEDULE, {}),
                ):
                    cur = await conn.execute(
                        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params
                    )
                    row = await cur.fetchone()
                    assert row is not None
                    plan = json.dumps(row[0])
                    assert "conveyor_schedules_next" in plan and "Seq Scan" not in plan, plan
            await step(clock, [backend], 1)
            assert await keys(dsn, "ticks") == [tick_key("tick", START + 1)]
            assert await keys(dsn, "idle") == []


# -- exactly once across brokers ------------------------------------------------------------


async def test_three_brokers_racing_fire_each_tick_once() -> None:
    async with database() as dsn:
        clock = SteppedScheduler(start=START)
        async with brokers(dsn, clock, 3) as racing:
            await racing[0].set_schedule(every_second())
            await until(
                lambda: all(b._sched_at == START + 1 for b in racing), "every broker's timer"
            )
            for _ in range(MINUTE):
                await step(clock, racing, 1)
            made = await keys(dsn, "ticks")
            assert made == [tick_key("tick", START + s) for s in range(1, MINUTE + 1)]
            (info,) = await racing[2].schedules(["tick"])
            assert info.fired == MINUTE and info.next_at == START + MINUTE + 1


async def test_a_broker_losing_its_connection_fires_no_tick_twice() -> None:
    async with database() as dsn:
        clock = SteppedScheduler(start=START)
        async with brokers(dsn, clock, 3) as racing:
            await racing[0].set_schedule(every_second())
            await until(
                lambda: all(b._sched_at == START + 1 for b in racing), "every broker's timer"
            )
            cut = racing[1]
            for second in range(1, MINUTE + 1):
                if second in (20, 40):
                    # Cut mid-way: its next firing fails (unavailable); it connects again
                    # in the background and fires what is due then, if anything.
                    await terminate(dsn, cut._own_pid)
                await step(clock, racing, 1)
                if second in (25, 45):
                    await until(lambda: cut.available, "the broker's connection back")
            made = await keys(dsn, "ticks")
            assert made == [tick_key("tick", START + s) for s in range(1, MINUTE + 1)]


async def test_a_firing_cut_off_mid_transaction_is_fired_by_another_broker() -> None:
    """The broker that took a tick loses its connection inside the firing's transaction
    (its insert held up by a lock the test holds, then its session ended): nothing of
    that firing stays, and the tick is fired once, at the tick's time: by another broker
    (it looks again at the tick's time) or by the cut one, back while the tick is now
    (it fires again at the time it is, SCH-4)."""
    async with database() as dsn:
        clock = SteppedScheduler(start=START)
        async with brokers(dsn, clock, 3) as racing:
            await racing[0].set_schedule(every_second())
            await until(
                lambda: all(b._sched_at == START + 1 for b in racing), "every broker's timer"
            )
            pids = {b._own_pid: b for b in racing}
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
                blocker = await psycopg.AsyncConnection.connect(dsn)
                try:
                    # An insert into the jobs waits for this lock: the firing that took
                    # the tick stops there, holding its schedule row.
                    await blocker.execute("LOCK TABLE conveyor_jobs IN SHARE MODE")
                    await asyncio.sleep(0)
                    clock.advance(1.0)
                    stuck: list[int] = []
                    loop = asyncio.get_running_loop()
                    end = loop.time() + 30
                    while not stuck:
                        assert loop.time() < end, "no firing waited for the lock"
                        cur = await admin.execute(
                            "SELECT pid FROM pg_stat_activity "
                            "WHERE pid = ANY(%s) AND wait_event_type = 'Lock'",
                            (list(pids),),
                        )
                        stuck = [int(row[0]) for row in await cur.fetchall()]
                        await asyncio.sleep(0.01)
                    (pid,) = stuck
                    cut = pids[pid]
                    # Ended, and waited for: its transaction is gone when this returns.
                    cur = await admin.execute("SELECT pg_terminate_backend(%s, 30000)", (pid,))
                    assert await cur.fetchone() == (True,), "the cut session did not end"
                    # Looked at while the lock still holds every insert back: the cut
                    # broker, once connected again, fires the tick anew (a job with the
                    # same key), and that firing must not be taken for this one's.
                    assert await keys(dsn, "ticks") == []  # the cut firing left nothing
                    cur = await admin.execute("SELECT next_at, fired FROM conveyor_schedules")
                    assert await cur.fetchall() == [(START + 1, 0)]
                finally:
                    await blocker.rollback()
                    await blocker.close()
            for backend in racing:
                await backend.settle()
            # The cut broker fires again at the time it is once connected (SCH-4): while
            # the tick is now, that is the tick on time; were the clock moved on first,
            # the tick would be due with a later one, and the policy (``once``) would
            # fire the later one only, which the contract allows a cut firing. So time
            # stands still until that firing has taken its time; then it is let finish.
            await until(lambda: cut.available and not cut._fire_asap, "the cut broker firing again")
            await cut.settle()
            for _ in range(MINUTE - 1):
                await step(clock, racing, 1)
            made = await keys(dsn, "ticks")
            assert sorted(made) == sorted(tick_key("tick", START + s) for s in range(1, MINUTE + 1))
            (info,) = await racing[0].schedules(["tick"])
            assert info.fired == MINUTE and info.next_at == START + MINUTE + 1


# -- the real clock: three broker processes -------------------------------------------------


@pytest.mark.timeout(180)  # a minute of real time, and the brokers' starts
async def test_three_broker_processes_fire_every_second_for_a_minute() -> None:
    """Real time (about seventy seconds): three ``conveyor serve`` on one database, one
    schedule of every second; every tick of the minute watched makes exactly one job."""
    async with database() as dsn:
        with cluster(_url(dsn), 3):
            # The schedule is set through a backend of the test's own on the database, on
            # the database's clock; the brokers set their timers from its notice. It is
            # closed at once: the three brokers alone fire.
            scheduler = await database_scheduler(dsn, LoopScheduler())
            try:
                setter = await PostgresBackend.open(dsn, scheduler, max_payload_bytes=1 << 20)
                try:
                    info = await setter.set_schedule(every_second())
                finally:
                    await setter.close()
                assert info.next_at is not None
                first = info.next_at + 1
                last = first + MINUTE - 1
                # (Real time passes here: the brokers fire on their own clocks.)
                await asyncio.sleep(max(0.0, last + 3 - scheduler.now()))
            finally:
                await scheduler.aclose()  # type: ignore[attr-defined]
            made = await keys(dsn, "ticks")
        assert len(made) == len(set(made)), "a tick made two jobs"
        watched = {tick_key("tick", first + s) for s in range(MINUTE)}
        missing = sorted(watched - set(made))
        assert not missing, f"ticks that made no job: {missing[:5]}"
