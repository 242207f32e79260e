"""The database clock: every broker on a database reads the server's time, whatever
its own host's clock says, and it never goes backwards."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import psycopg
import pytest

from conveyor.broker.backend._pg_clock import (
    SLEW,
    DatabaseClock,
    DatabaseScheduler,
    database_scheduler,
)
from conveyor.broker.backend.postgres import Unavailable
from conveyor.broker.scheduler import LoopScheduler, ManualScheduler
from tests.conformance.pg import database


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    async with database() as made:
        yield made


async def _server_time(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> float:
    cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
    row = await cur.fetchone()
    assert row is not None
    return float(row[0])  # type: ignore[arg-type]


async def _agrees_with_the_server(scheduler: DatabaseScheduler, dsn: str) -> None:
    """The server's clock, read between two readings of ``scheduler``'s, lies between
    them, give or take the round trip the offset was learned over."""
    trip = scheduler.round_trip_s
    assert trip is not None
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await _server_time(conn)  # (the connection's first query may be slower)
        before = scheduler.now()
        server = await _server_time(conn)
        after = scheduler.now()
    assert before - trip <= server <= after + trip, (before, server, after, trip)


async def test_the_clock_is_the_servers_within_the_round_trip(dsn: str) -> None:
    scheduler = await database_scheduler(dsn, LoopScheduler())
    try:
        await _agrees_with_the_server(scheduler, dsn)
    finally:
        await scheduler.aclose()


async def test_a_host_clock_an_hour_off_does_not_move_the_database_clock(dsn: str) -> None:
    def off_by_an_hour() -> float:
        return time.monotonic() + 3600.0

    right = await database_scheduler(dsn, LoopScheduler())
    wrong = await database_scheduler(dsn, LoopScheduler(), local=off_by_an_hour)
    try:
        await _agrees_with_the_server(wrong, dsn)
        assert right.round_trip_s is not None and wrong.round_trip_s is not None
        assert abs(wrong.now() - right.now()) <= right.round_trip_s + wrong.round_trip_s
        # Learning again (a minute later, in production) changes nothing either.
        await wrong.learn()
        await _agrees_with_the_server(wrong, dsn)
    finally:
        await right.aclose()
        await wrong.aclose()


async def test_an_unreachable_server_is_unavailable() -> None:
    with pytest.raises(Unavailable, match="clock"):
        await database_scheduler(
            "host=127.0.0.1 port=1 user=postgres connect_timeout=2", LoopScheduler()
        )


class _Local:
    """A monotonic local clock that moves only when told."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_later_offset_moves_the_clock_forward_at_once() -> None:
    local = _Local()
    clock = DatabaseClock(1_000.0, local)
    assert clock.now() == 1_100.0
    clock.adopt(1_005.0)
    assert clock.now() == 1_105.0 and not clock.slewing


def test_an_offset_that_would_move_the_clock_back_is_slewed_to() -> None:
    local = _Local()
    clock = DatabaseClock(1_000.0, local)
    clock.adopt(990.0)  # ten seconds back
    assert clock.now() == 1_100.0  # not a jump back
    assert clock.slewing
    readings = []
    for _ in range(40):
        local.t += 1.0
        readings.append(clock.now())
    assert readings == sorted(readings)  # never backwards
    # It ran at 1 - SLEW of its speed until it had lost the ten seconds, then normally.
    catch_up = 10.0 / SLEW
    assert readings[0] == pytest.approx(1_100.0 + (1 - SLEW))
    assert readings[-1] == pytest.approx(local.t + 990.0)
    assert not clock.slewing
    assert readings[int(catch_up)] == pytest.approx(100.0 + catch_up + 1 + 990.0)


def test_a_timer_runs_once_the_database_clock_reaches_its_time_even_while_slewing() -> None:
    inner = ManualScheduler(start=100.0)
    clock = DatabaseClock(1_000.0, inner.now)  # the local clock is the inner scheduler's
    scheduler = DatabaseScheduler(clock, inner, dsn="")
    fired: list[float] = []
    clock.adopt(990.0)
    when = scheduler.now() + 4.0
    scheduler.call_at(when, lambda: fired.append(scheduler.now()))
    cancelled = scheduler.call_at(when, lambda: fired.append(-1.0))
    cancelled.cancel()
    inner.advance(4.0)  # the database clock moved only 2 seconds
    assert fired == []
    inner.advance(4.0)
    assert len(fired) == 1 and fired[0] >= when
    soon: list[str] = []
    scheduler.call_soon(soon.append, "x")
    inner.run_soon()
    assert soon == ["x"]
