"""The schedulers' contract: order, cancelling, and time on the engine's clock."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.broker.scheduler import LoopScheduler, ManualScheduler, SteppedScheduler


def test_manual_runs_nothing_until_told_then_soon_callbacks_in_call_order() -> None:
    clock = ManualScheduler(10.0)
    ran: list[str] = []
    clock.call_soon(ran.append, "a")
    clock.call_soon(ran.append, "b")
    clock.call_soon(ran.append, "cancelled").cancel()
    assert ran == []
    clock.run_soon()
    assert (ran, clock.now()) == (["a", "b"], 10.0)


def test_manual_timers_run_in_time_order_with_the_clock_at_their_time() -> None:
    clock = ManualScheduler(0.0)
    ran: list[tuple[str, float]] = []

    def note(name: str) -> None:
        ran.append((name, clock.now()))

    clock.call_at(3.0, note, "three")
    clock.call_at(1.0, note, "one")
    clock.call_at(2.0, note, "two-a")
    clock.call_at(2.0, note, "two-b")
    clock.call_at(2.5, note, "cancelled").cancel()
    assert clock.next_at() == 1.0
    clock.advance_to(2.0)
    assert ran == [("one", 1.0), ("two-a", 2.0), ("two-b", 2.0)]
    clock.advance(5.0)
    assert ran[-1] == ("three", 3.0)
    assert (clock.now(), clock.next_at()) == (7.0, None)


def test_manual_runs_what_callbacks_schedule_when_it_falls_due() -> None:
    clock = ManualScheduler(0.0)
    ran: list[tuple[str, float]] = []

    def first() -> None:
        ran.append(("first", clock.now()))
        clock.call_soon(lambda: ran.append(("soon", clock.now())))
        clock.call_at(clock.now() + 1.0, lambda: ran.append(("then", clock.now())))
        clock.call_at(clock.now() + 9.0, lambda: ran.append(("too late", clock.now())))

    clock.call_at(1.0, first)
    clock.advance_to(5.0)
    assert ran == [("first", 1.0), ("soon", 1.0), ("then", 2.0)]
    assert clock.next_at() == 10.0


def test_manual_time_never_goes_backwards() -> None:
    clock = ManualScheduler(5.0)
    with pytest.raises(ValueError, match="advance_to"):
        clock.advance_to(4.0)
    clock.call_at(1.0, lambda: None)  # already due: runs now, the clock stays
    clock.run_soon()
    assert (clock.now(), clock.next_at()) == (5.0, None)


async def test_loop_scheduler_waits_on_the_loop_for_a_wall_clock_time() -> None:
    now = [1_000.0]
    scheduler = LoopScheduler(lambda: now[0])
    loop = asyncio.get_running_loop()
    assert scheduler.now() == 1_000.0

    later = scheduler.call_at(1_060.0, lambda: None)
    assert isinstance(later, asyncio.TimerHandle)
    assert later.when() - loop.time() == pytest.approx(60.0, abs=1.0)
    later.cancel()

    done = loop.create_future()
    scheduler.call_at(999.0, done.set_result, "past")  # due already: runs soon
    scheduler.call_soon(lambda: None)
    assert await asyncio.wait_for(done, 5.0) == "past"


async def test_loop_scheduler_runs_soon_callbacks_on_the_running_loop_in_call_order() -> None:
    scheduler = LoopScheduler()
    ran: list[int] = []
    done = asyncio.get_running_loop().create_future()
    scheduler.call_soon(ran.append, 1)  # the first call finds the loop
    scheduler.call_soon(ran.append, 2).cancel()
    scheduler.call_soon(ran.append, 3)
    scheduler.call_soon(done.set_result, None)
    assert ran == []
    await asyncio.wait_for(done, 5.0)
    assert ran == [1, 3]


async def test_stepped_scheduler_runs_timers_only_as_its_clock_is_advanced() -> None:
    clock = SteppedScheduler(start=100.0)
    ran: list[tuple[str, float]] = []
    clock.call_at(105.0, lambda: ran.append(("b", clock.now())))
    clock.call_at(102.0, lambda: ran.append(("a", clock.now())))
    cancelled = clock.call_at(103.0, lambda: ran.append(("never", clock.now())))
    cancelled.cancel()
    soon = asyncio.Event()
    clock.call_soon(soon.set)  # on the loop, as any callback
    await asyncio.wait_for(soon.wait(), 1)
    clock.call_at(99.0, lambda: ran.append(("due", clock.now())))  # already due: soon
    await asyncio.sleep(0)  # one loop turn, for the call_soon above
    assert ran == [("due", 100.0)]
    clock.advance(1.9)
    assert ran == [("due", 100.0)] and clock.now() == pytest.approx(101.9)
    clock.advance(5)
    assert ran[1:] == [("a", 102.0), ("b", 105.0)]  # in time order, each at its time
    assert clock.now() == pytest.approx(106.9)
    with pytest.raises(ValueError):
        clock.advance(-1)
