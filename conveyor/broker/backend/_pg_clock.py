"""One clock for every broker on a database: the database server's.

Brokers sharing a PostgreSQL database write times into one table (ready times, lease
deadlines, expiries), so they must agree on *now*; their hosts' wall clocks may not.
``DatabaseClock`` is this host's monotonic clock plus an offset learned from the server:
a round trip of ``SELECT clock_timestamp()`` gives the server's time at about the
midpoint of the trip, so ``offset = server time - local midpoint``, good to half the
round trip. The host's wall clock plays no part (setting it changes nothing).

The offset is learned again every ``relearn_s`` (the two clocks drift apart slowly). A
later offset is taken at once when it moves the clock forward; one that would move it
back is *slewed* to: the clock runs at ``1 - SLEW`` of its speed until it has caught up,
so ``now()`` never goes backwards (leases and timers are measured on it).

``DatabaseScheduler`` is the ``Scheduler`` (``broker/scheduler.py``) on that clock: the
callbacks are another scheduler's (the loop's), each ``call_at`` translated from the
database clock to that one's, and run only once the database clock has reached it.
Make one with ``await database_scheduler(dsn, LoopScheduler())``; ``aclose`` it at the
end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TypeVarTuple, Unpack

import psycopg

from ..scheduler import Handle, Scheduler
from ._pg_conn import Conn, close_quietly, connect, unavailable, why

__all__ = ["SLEW", "DatabaseClock", "DatabaseScheduler", "database_scheduler", "learn_offset"]

log = logging.getLogger("conveyor.backend")

_Ts = TypeVarTuple("_Ts")

# While slewing back, the clock runs at 1 - SLEW of its speed.
SLEW = 0.5
# Round trips per learning; the shortest one's reading is kept (the least uncertain).
_SAMPLES = 3

_READ = "SELECT extract(epoch FROM clock_timestamp())::float8"


async def learn_offset(conn: Conn, local: Callable[[], float]) -> tuple[float, float]:
    """``(offset, round trip)``: the server's clock minus ``local``'s, read over
    ``conn`` (the reading of the shortest of a few round trips). Raises psycopg's
    errors."""
    best: tuple[float, float] | None = None
    for _ in range(_SAMPLES):
        before = local()
        cur = await conn.execute(_READ)
        row = await cur.fetchone()
        after = local()
        assert row is not None
        trip = after - before
        offset = float(row[0]) - (before + after) / 2
        if best is None or trip < best[1]:
            best = (offset, trip)
    assert best is not None
    return best


class DatabaseClock:
    """``local()`` plus an offset: the server's time (see the module docstring).
    ``local`` must be monotonic (the default is ``time.monotonic``)."""

    __slots__ = ("_local", "_offset", "_slew_from")

    def __init__(self, offset: float, local: Callable[[], float] = time.monotonic) -> None:
        self._local = local
        self._offset = offset  # the offset learned last
        # While slewing back to it: (local time, offset in use then).
        self._slew_from: tuple[float, float] | None = None

    def now(self) -> float:
        """Seconds since the epoch on the server's clock; never less than before."""
        local = self._local()
        return local + self._offset_at(local)

    def _offset_at(self, local: float) -> float:
        slew = self._slew_from
        if slew is None:
            return self._offset
        since, was = slew
        offset = was - SLEW * (local - since)
        if offset <= self._offset:
            self._slew_from = None  # caught up
            return self._offset
        return offset

    @property
    def slewing(self) -> bool:
        """Whether the clock is running slow to catch up with a later offset."""
        return self._slew_from is not None and self._offset_at(self._local()) > self._offset

    @property
    def local(self) -> Callable[[], float]:
        return self._local

    def adopt(self, offset: float) -> None:
        """Take a newly learned offset: at once if it moves the clock forward, by
        slewing if it would move it back."""
        local = self._local()
        current = self._offset_at(local)
        self._offset = offset
        self._slew_from = None if offset >= current else (local, current)


class _Timer:
    """A ``call_at`` of a ``DatabaseScheduler``: one callback of the inner scheduler at
    a time, set again if it came before the database clock reached ``when`` (it slewed
    meanwhile)."""

    __slots__ = ("_args", "_cancelled", "_fn", "_handle", "_owner", "_when")

    def __init__(
        self,
        owner: DatabaseScheduler,
        when: float,
        fn: Callable[..., object],
        args: tuple[object, ...],
    ) -> None:
        self._owner = owner
        self._when = when
        self._fn = fn
        self._args = args
        self._cancelled = False
        self._handle: Handle = owner._inner_at(when - owner.now(), self._fire)

    def _fire(self) -> None:
        if self._cancelled:
            return
        owner = self._owner
        left = self._when - owner.now()
        if left > 0:
            # Early: the clock ran slow meanwhile. Wait for the rest at the slowest speed
            # it runs, so that this fires at or after ``when``.
            self._handle = owner._inner_at(left / (1 - SLEW), self._fire)
            return
        self._cancelled = True
        self._fn(*self._args)

    def cancel(self) -> None:
        self._cancelled = True
        self._handle.cancel()


class DatabaseScheduler:
    """A ``Scheduler`` on a ``DatabaseClock``, its callbacks run by ``inner``. Learns the
    offset again every ``relearn_s`` on its own connection (``start``); a failed
    learning keeps the offset it has (logged), and tries again at the next one."""

    def __init__(
        self,
        clock: DatabaseClock,
        inner: Scheduler,
        *,
        dsn: str,
        conn: Conn | None = None,
        relearn_s: float = 60.0,
    ) -> None:
        if not relearn_s > 0:
            raise ValueError(f"relearn_s: must be > 0, got {relearn_s!r}")
        self.clock = clock
        # The clock itself, not a method calling it: the server reads it for every frame.
        self.now: Callable[[], float] = clock.now
        self._inner = inner
        self._dsn = dsn
        self._conn = conn
        self._relearn_s = relearn_s
        self._task: asyncio.Task[None] | None = None
        # The last learning's round trip: how far from the server's clock ``now`` may be.
        self.round_trip_s: float | None = None

    def call_soon(self, fn: Callable[[Unpack[_Ts]], object], /, *args: *_Ts) -> Handle:
        return self._inner.call_soon(fn, *args)

    def call_at(self, when: float, fn: Callable[[Unpack[_Ts]], object], /, *args: *_Ts) -> Handle:
        return _Timer(self, when, fn, args)

    def _inner_at(self, delay: float, fn: Callable[[], object]) -> Handle:
        inner = self._inner
        return inner.call_at(inner.now() + max(0.0, delay), fn)

    async def learn(self) -> float:
        """Learn the offset now (connecting if need be) and adopt it; the round trip.
        Raises ``Unavailable`` if the server cannot be read."""
        try:
            if self._conn is None or self._conn.closed or self._conn.broken:
                if self._conn is not None:
                    await close_quietly(self._conn)
                self._conn = None
                self._conn = await connect(self._dsn)
            offset, trip = await learn_offset(self._conn, self.clock.local)
        except (psycopg.Error, OSError) as exc:
            raise unavailable(f"cannot read the database's clock: {why(exc)}") from exc
        self.clock.adopt(offset)
        self.round_trip_s = trip
        return trip

    def start(self) -> None:
        """Learn again every ``relearn_s`` (real time), from the running loop on."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._relearn_forever())

    async def _relearn_forever(self) -> None:
        while True:
            await asyncio.sleep(self._relearn_s)
            try:
                await self.learn()
            except Exception as exc:  # (any: the clock goes on with the offset it has)
                log.warning("postgres: the clock keeps its offset: %s", exc)

    async def aclose(self) -> None:
        """Stop learning and close the connection. Idempotent; the clock still reads."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        conn, self._conn = self._conn, None
        if conn is not None:
            await close_quietly(conn)


async def database_scheduler(
    dsn: str,
    inner: Scheduler,
    *,
    local: Callable[[], float] = time.monotonic,
    relearn_s: float = 60.0,
) -> DatabaseScheduler:
    """A ``DatabaseScheduler`` on the database ``dsn``'s clock, its callbacks run by
    ``inner`` (a ``LoopScheduler``), learning its offset again every ``relearn_s``.
    Call on the running loop; ``aclose`` it when done. Raises ``Unavailable`` if the
    server cannot be read."""
    try:
        conn = await connect(dsn)
    except (psycopg.Error, OSError) as exc:
        raise unavailable(f"cannot read the database's clock: {why(exc)}") from exc
    try:
        offset, trip = await learn_offset(conn, local)
    except BaseException as exc:
        await close_quietly(conn)
        if isinstance(exc, psycopg.Error | OSError):
            raise unavailable(f"cannot read the database's clock: {why(exc)}") from exc
        raise
    scheduler = DatabaseScheduler(
        DatabaseClock(offset, local), inner, dsn=dsn, conn=conn, relearn_s=relearn_s
    )
    scheduler.round_trip_s = trip
    scheduler.start()
    return scheduler
