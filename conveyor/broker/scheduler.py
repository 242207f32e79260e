"""Time and callbacks for the dispatcher: the one seam between it and the event loop.

The dispatcher never touches a loop or a clock itself. It asks a ``Scheduler`` what
time it is (the engine's clock: wall-clock seconds), to run a callback soon, or to run
one at a given time on that same clock. ``LoopScheduler`` does this on the running
asyncio loop; ``ManualScheduler`` does it on a clock that moves only when a test says
so, so that leases, graces and delayed jobs are tested without waiting.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol, TypeVarTuple, Unpack

__all__ = [
    "Handle",
    "LoopScheduler",
    "ManualHandle",
    "ManualScheduler",
    "Scheduler",
    "SteppedScheduler",
    "wall_clock",
]

_Ts = TypeVarTuple("_Ts")

# Timers one advance of a ManualScheduler may run before it calls it a runaway (a timer
# that re-arms itself at a time already due, which would busy-loop a real loop too).
_RUNAWAY = 100_000


def wall_clock() -> float:
    """The broker's clock for the engine: wall-clock seconds since the epoch."""
    return time.time()


class Handle(Protocol):
    """A scheduled callback."""

    def cancel(self) -> None:
        """Do not run the callback (no effect once it has run or been cancelled)."""


class _CallSoon(Protocol):
    """The type of ``call_soon``, which ``LoopScheduler`` keeps as an attribute."""

    def __call__(self, fn: Callable[[Unpack[_Ts]], object], /, *args: *_Ts) -> Handle: ...


class Scheduler(Protocol):
    """What the dispatcher needs of time: a clock and callbacks run later.

    Callbacks run one at a time, never inside the call that scheduled them.
    """

    def now(self) -> float:
        """The current time: wall-clock seconds, the engine's clock."""
        ...

    def call_soon(self, fn: Callable[[Unpack[_Ts]], object], /, *args: *_Ts) -> Handle:
        """Run ``fn(*args)`` soon, after the callback running now; in call order."""
        ...

    def call_at(self, when: float, fn: Callable[[Unpack[_Ts]], object], /, *args: *_Ts) -> Handle:
        """Run ``fn(*args)`` once ``now()`` reaches ``when`` (soon if it has already)."""
        ...


class LoopScheduler:
    """A ``Scheduler`` on the running asyncio loop, with ``clock`` for ``now``.

    Call it from that loop only. The loop is looked up at the first call and kept:
    ``asyncio.get_running_loop()`` makes a ``getpid()`` system call (CPython's check for
    a fork), and the dispatcher schedules a pass per ack frame. The loop's own clock is
    monotonic while ``when`` is wall time, so ``call_at`` waits ``when - now()`` on it.
    """

    __slots__ = ("_loop", "call_soon", "now")

    def __init__(self, clock: Callable[[], float] = wall_clock) -> None:
        # The clock itself and, once bound, the loop's own ``call_soon``, rather than
        # methods calling them: the server reads the clock for every frame, and a wrapper
        # around ``call_soon`` would be one Python call more for every pass.
        self.now = clock
        self.call_soon: _CallSoon = self._bind_and_call_soon
        self._loop: asyncio.AbstractEventLoop | None = None

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = self._loop = asyncio.get_running_loop()
        self.call_soon = loop.call_soon
        return loop

    def _bind_and_call_soon(self, fn: Callable[[Unpack[_Ts]], object], /, *args: *_Ts) -> Handle:
        return self._bind().call_soon(fn, *args)

    def call_at(self, when: float, fn: Callable[[Unpack[_Ts]], object], /, *args: *_Ts) -> Handle:
        loop = self._loop or self._bind()
        return loop.call_later(max(0.0, when - self.now()), fn, *args)


class ManualHandle:
    """A callback a ``ManualScheduler`` holds; ``when`` is ``None`` for a ``call_soon``."""

    __slots__ = ("args", "cancelled", "fn", "when")

    def __init__(
        self, when: float | None, fn: Callable[..., object], args: tuple[object, ...]
    ) -> None:
        self.when = when
        self.fn = fn
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualScheduler:
    """A ``Scheduler`` whose clock moves only by ``advance`` and ``advance_to``; for tests.

    Deterministic and loop-free: nothing runs until the test calls ``run_soon``,
    ``advance`` or ``advance_to``, and those run every callback that is due, in order,
    before they return; callbacks scheduled meanwhile run too if they fall due. Use
    ``now`` as the engine's clock (``JobTable(clock=scheduler.now)``) so that both see
    one time.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._soon: deque[ManualHandle] = deque()
        self._timers: list[tuple[float, int, ManualHandle]] = []
        self._order = 0  # ties at one time run in call order

    def now(self) -> float:
        return self._now

    def call_soon(self, fn: Callable[[Unpack[_Ts]], object], /, *args: *_Ts) -> ManualHandle:
        handle = ManualHandle(None, fn, args)
        self._soon.append(handle)
        return handle

    def call_at(
        self, when: float, fn: Callable[[Unpack[_Ts]], object], *args: *_Ts
    ) -> ManualHandle:
        handle = ManualHandle(when, fn, args)
        self._order += 1
        heapq.heappush(self._timers, (when, self._order, handle))
        return handle

    def next_at(self) -> float | None:
        """When the earliest timer not cancelled is due, or ``None`` if there is none."""
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def run_soon(self) -> None:
        """Run what is due now without moving the clock: the ``call_soon`` callbacks
        (and those they schedule), and timers due at or before ``now()``."""
        self.advance_to(self._now)

    def advance(self, seconds: float) -> None:
        """``advance_to(now() + seconds)``."""
        self.advance_to(self._now + seconds)

    def advance_to(self, t: float) -> None:
        """Move the clock to ``t``, running what falls due on the way.

        Pending ``call_soon`` callbacks run first; then each timer due by ``t`` runs in
        time order with the clock at its time, each followed by the ``call_soon``
        callbacks it caused, the way an event loop runs them. Raises ``ValueError`` if
        ``t`` is before ``now()``: time does not go backwards; ``RuntimeError`` if timers
        keep coming due without end.
        """
        if t < self._now:
            raise ValueError(f"advance_to({t}): the clock is at {self._now} already")
        self._drain_soon()
        runs = 0
        while (at := self.next_at()) is not None and at <= t:
            runs += 1
            if runs > _RUNAWAY:
                raise RuntimeError(f"timers keep coming due at {at}: a callback re-arms itself")
            _, _, handle = heapq.heappop(self._timers)
            self._now = max(self._now, at)
            handle.fn(*handle.args)
            self._drain_soon()
        self._now = t

    def _drain_soon(self) -> None:
        soon = self._soon
        while soon:
            handle = soon.popleft()
            if not handle.cancelled:
                handle.fn(*handle.args)


class SteppedScheduler:
    """A ``Scheduler`` for a whole broker under test: callbacks run on the running loop,
    but its clock moves only by ``advance``, so a test of leases and graces through the
    real server makes time pass without waiting for it.

    ``call_soon`` is the loop's. ``call_at`` for a time already reached runs soon; for a
    later one it is held until ``advance`` passes it: then it runs, in time order, with
    the clock at its time. Pass ``now`` to everything that reads the broker's clock (the
    broker does, given this scheduler). Call from the loop only.
    """

    def __init__(self, start: float | None = None) -> None:
        self._now = wall_clock() if start is None else start
        self._timers: list[tuple[float, int, ManualHandle]] = []
        self._order = 0

    def now(self) -> float:
        return self._now

    def call_soon(self, fn: Callable[[Unpack[_Ts]], object], /, *args: *_Ts) -> Handle:
        return asyncio.get_running_loop().call_soon(fn, *args)

    def call_at(self, when: float, fn: Callable[[Unpack[_Ts]], object], /, *args: *_Ts) -> Handle:
        if when <= self._now:
            return self.call_soon(fn, *args)
        handle = ManualHandle(when, fn, args)
        self._order += 1
        heapq.heappush(self._timers, (when, self._order, handle))
        return handle

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on, running each timer that falls due on the way
        (what they schedule with ``call_soon`` runs on the loop's next turns)."""
        if seconds < 0:
            raise ValueError(f"advance({seconds}): time does not go backwards")
        end = self._now + seconds
        timers = self._timers
        while timers and timers[0][0] <= end:
            when, _, handle = heapq.heappop(timers)
            if not handle.cancelled:
                self._now = max(self._now, when)
                handle.fn(*handle.args)
        self._now = end
