"""``docs/contract.md``, "Schedules" (SCH-1 to SCH-11), at the engine, on the manual clock.

The driver here is ``drive``: what the local backend's timer does, woken at each
``next_event_at()`` up to a time, firing the due schedules there. Whole months of ticks,
daylight-saving changes, each missed-tick policy after a long stop, end dates, changes,
pause and resume, run-now, delete, bad input, a table restored from what a store keeps,
and the cost of the next event beside 10,000 schedules.

Tests that take the ``table`` fixture run on memory and on SQLite; in the SQLite run each
move of the clock commits the table and compares a table rebuilt from the file, its
schedules included (``conftest.assert_same``).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest

from conveyor.broker.engine import (
    ROW_FIELDS,
    SCHEDULE_FIELDS,
    InvalidArgument,
    Job,
    JobTable,
    QueueOpts,
    RawJSON,
    ScheduleSpec,
    fire,
    next_tick,
    tick_key,
)

if TYPE_CHECKING:
    from conftest import ManualClock

DAY = 86_400.0


def at(text: str) -> float:
    """Unix seconds of an ISO time (UTC unless it says otherwise)."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")


@pytest.fixture
def mem(clock: ManualClock) -> JobTable:
    return JobTable(clock=clock, rng=random.Random(1), id_prefix="t")


def drive(table: JobTable, clock: ManualClock, to: float) -> list[str]:
    """Wake the table at each of its events up to ``to``, as the backend's timer does,
    firing the schedules due there; then move the clock to ``to``. The queues that got
    jobs, in order of the wakes."""
    got: list[str] = []
    while True:
        event = table.next_event_at()
        if event is None or event > to:
            break
        if event > clock.now:
            clock.set(event)
        got.extend(table.fire_schedules())
        table.sweep_expired()
    if to > clock.now:
        clock.set(to)
    return got


def jobs(table: JobTable, queue: str = "q") -> list[Job]:
    """Every job of ``queue`` that is ready now, in claim order (none is claimed here)."""
    found, _ = table.queue(queue).list_jobs("ready", None, 1000)
    return sorted(found, key=lambda j: j.seq)


def spec(**fields: Any) -> ScheduleSpec:
    fields.setdefault("id", "s")
    fields.setdefault("queue", "q")
    return ScheduleSpec(**fields)


# -- ticks over a month (SCH-1, SCH-3, SCH-4) -------------------------------------------------


def test_a_daily_cron_makes_one_job_a_day_for_a_month(mem: JobTable, clock: ManualClock) -> None:
    clock.set(at("2026-03-01T00:00:00"))
    info = mem.set_schedule(spec(cron="30 9 * * *", payload={"report": "daily"}))
    assert info.next_at == at("2026-03-01T09:30:00")
    drive(mem, clock, at("2026-04-01T00:00:00"))
    made = jobs(mem)
    ticks = [at(f"2026-03-{day:02d}T09:30:00") for day in range(1, 32)]
    assert [j.key for j in made] == [tick_key("s", t) for t in ticks]
    assert [j.enqueued_at for j in made] == ticks  # each made on the dot
    assert all(j.payload == {"report": "daily"} for j in made)
    now = mem.get_schedule("s")
    assert now is not None
    assert (now.fired, now.last_at, now.last_job) == (31, ticks[-1], made[-1].id)
    assert now.next_at == at("2026-04-01T09:30:00")
    assert tick_key("s", ticks[0]) == f"schedule:s:{round(ticks[0] * 1000)}"


def test_an_interval_counts_from_the_epoch_for_a_month(mem: JobTable, clock: ManualClock) -> None:
    clock.set(at("2026-03-01T00:00:00") - 1)
    mem.set_schedule(spec(every_s=6 * 3600.0, max_attempts=2, priority=3))
    drive(mem, clock, at("2026-04-01T00:00:00") - 1)
    made = jobs(mem)
    ticks = [at("2026-03-01T00:00:00") + i * 6 * 3600.0 for i in range(31 * 4)]
    assert [j.enqueued_at for j in made] == ticks
    assert [j.key for j in made] == [tick_key("s", t) for t in ticks]
    assert {(j.max_attempts, j.priority) for j in made} == {(2, 3)}


def test_an_interval_from_start_at(mem: JobTable, clock: ManualClock) -> None:
    info = mem.set_schedule(spec(every_s=7.0, start_at=clock.now + 100.5))
    assert info.next_at == clock.now + 100.5  # start_at is the first tick
    drive(mem, clock, clock.now + 100.5 + 7 * 3)
    assert len(jobs(mem)) == 4


def test_a_tick_at_the_moment_of_creation_does_not_fire(mem: JobTable, clock: ManualClock) -> None:
    clock.set(1200.0)  # a whole minute
    info = mem.set_schedule(spec(every_s=60.0))
    assert info.next_at == 1260.0
    assert mem.fire_schedules() == []
    assert jobs(mem) == []


def test_a_tick_looked_at_on_the_dot_fires_whatever_the_float_rounding() -> None:
    # (anchor + k * every_s, divided back by every_s, can round down past k.)
    s = spec(every_s=3.3)
    for after in (1637830171.732915, 1716460315.7131934, 1.0e9 + 0.123):
        tick = next_tick(s, after)
        assert tick is not None
        assert fire(s, tick, tick)[0] == [tick]
        assert fire(spec(every_s=3.3, missed="skip"), tick, tick)[0] == [tick]


# -- daylight saving (SCH-2's ticks: the module docstring of _schedule) -----------------------


def fired_at(
    table: JobTable, clock: ManualClock, cron: str, tz: str, start: str, end: str
) -> list[str]:
    clock.set(at(start))
    table.set_schedule(spec(id="dst", cron=cron, tz=tz))
    drive(table, clock, at(end))
    return [utc(j.enqueued_at) for j in jobs(table)]


def test_spring_forward_new_york_fixed_time_fires_once_after_the_jump(
    mem: JobTable, clock: ManualClock
) -> None:
    # 2026-03-08: 02:00 EST becomes 03:00 EDT; 02:30 does not happen that day.
    got = fired_at(mem, clock, "30 2 * * *", "America/New_York", "2026-03-07", "2026-03-10")
    assert got == ["2026-03-07 07:30", "2026-03-08 07:00", "2026-03-09 06:30"]


def test_spring_forward_new_york_wildcard_skips_the_missing_hour(
    mem: JobTable, clock: ManualClock
) -> None:
    got = fired_at(
        mem, clock, "*/30 * * * *", "America/New_York", "2026-03-08T05:50", "2026-03-08T07:40"
    )
    # 01:00 EST, 01:30 EST, then 03:00 EDT: no 02:00 or 02:30, nothing twice.
    assert got == ["2026-03-08 06:00", "2026-03-08 06:30", "2026-03-08 07:00", "2026-03-08 07:30"]


def test_fall_back_new_york_fixed_time_fires_once(mem: JobTable, clock: ManualClock) -> None:
    # 2026-11-01: 02:00 EDT becomes 01:00 EST; 01:30 happens twice.
    got = fired_at(mem, clock, "30 1 * * *", "America/New_York", "2026-10-31", "2026-11-03")
    assert got == ["2026-10-31 05:30", "2026-11-01 05:30", "2026-11-02 06:30"]


def test_fall_back_new_york_wildcard_hour_fires_in_both(mem: JobTable, clock: ManualClock) -> None:
    got = fired_at(
        mem, clock, "30 * * * *", "America/New_York", "2026-11-01T04:00", "2026-11-01T08:00"
    )
    # 00:30 EDT, 01:30 EDT, 01:30 EST, 02:30 EST.
    assert got == ["2026-11-01 04:30", "2026-11-01 05:30", "2026-11-01 06:30", "2026-11-01 07:30"]


def test_fall_back_catch_up_finds_both_repeated_ticks(mem: JobTable, clock: ManualClock) -> None:
    # The walk back from a late look must not lose the second 01:30 (its fold).
    clock.set(at("2026-11-01T04:00"))
    mem.set_schedule(spec(cron="30 * * * *", tz="America/New_York", missed="each"))
    clock.set(at("2026-11-01T07:45"))
    mem.fire_schedules()
    got = [utc(t) for t in _tick_times(mem)]
    assert got == ["2026-11-01 04:30", "2026-11-01 05:30", "2026-11-01 06:30", "2026-11-01 07:30"]


def test_paris_spring_forward_and_fall_back(mem: JobTable, clock: ManualClock) -> None:
    spring = fired_at(mem, clock, "0 2 * * *", "Europe/Paris", "2026-03-28", "2026-03-30T12:00")
    # 2026-03-29: 02:00 CET is 03:00 CEST: fires once, at the jump.
    assert spring == ["2026-03-28 01:00", "2026-03-29 01:00", "2026-03-30 00:00"]
    mem.delete_schedule("dst")
    table = JobTable(clock=clock, id_prefix="p")
    fall = fired_at(table, clock, "30 2 * * *", "Europe/Paris", "2026-10-24", "2026-10-27")
    # 2026-10-25: 02:30 happens in CEST and again in CET: a fixed time fires once.
    assert fall == ["2026-10-24 00:30", "2026-10-25 00:30", "2026-10-26 01:30"]


def _tick_times(table: JobTable, queue: str = "q") -> list[float]:
    """The ticks the jobs of ``queue`` were made for, read back from their keys."""
    return [int(str(j.key).rsplit(":", 1)[1]) / 1000 for j in jobs(table, queue)]


# -- missed ticks (SCH-4) -----------------------------------------------------------------------


def stopped(mem: JobTable, clock: ManualClock, **fields: Any) -> float:
    """A schedule of every minute, and a broker that stops for an hour and a half minute:
    the look comes 30 s after the last tick (the broker starts again then)."""
    clock.set(6000.0)
    mem.set_schedule(spec(every_s=60.0, **fields))
    clock.set(6000.0 + 3600.0 + 30.0)
    mem.fire_schedules()
    return clock.now


def test_missed_skip_makes_no_job_for_missed_ticks(mem: JobTable, clock: ManualClock) -> None:
    now = stopped(mem, clock, missed="skip")
    # The latest due tick is 30 s old: on time (MISSED_GRACE_S), it makes its job.
    assert _tick_times(mem) == [9600.0]
    info = mem.get_schedule("s")
    assert info is not None and info.next_at == 9660.0 and now == 9630.0


def test_missed_skip_after_the_grace_makes_none(mem: JobTable, clock: ManualClock) -> None:
    clock.set(6000.0)
    mem.set_schedule(spec(every_s=600.0, missed="skip"))
    clock.set(6000.0 + 3 * 600.0 + 120.0)  # the latest due tick is 2 minutes old
    mem.fire_schedules()
    assert jobs(mem) == []
    info = mem.get_schedule("s")
    assert info is not None and info.next_at == 8400.0 and info.fired == 0


def test_missed_once_makes_one_job_for_the_latest(mem: JobTable, clock: ManualClock) -> None:
    stopped(mem, clock, missed="once")
    assert _tick_times(mem) == [9600.0]


def test_missed_each_catches_up_to_the_cap(mem: JobTable, clock: ManualClock) -> None:
    stopped(mem, clock, missed="each", max_catch_up=5)
    assert _tick_times(mem) == [9360.0, 9420.0, 9480.0, 9540.0, 9600.0]


def test_missed_each_under_the_cap_makes_every_one(mem: JobTable, clock: ManualClock) -> None:
    stopped(mem, clock, missed="each", max_catch_up=100)
    assert _tick_times(mem) == [6060.0 + 60.0 * i for i in range(60)]
    info = mem.get_schedule("s")
    assert info is not None and info.fired == 60 and info.last_at == 9600.0


# -- end dates (SCH-8) ----------------------------------------------------------------------------


def test_past_end_at_a_schedule_stays_listed_and_fires_no_more(
    table: JobTable, clock: ManualClock
) -> None:
    table.set_schedule(spec(every_s=60.0, end_at=1300.0))
    drive(table, clock, 2000.0)
    assert _tick_times(table) == [1020.0, 1080.0, 1140.0, 1200.0, 1260.0]
    info = table.get_schedule("s")
    assert info is not None and info.next_at is None and info.fired == 5
    assert [i.spec.id for i in table.list_schedules()] == ["s"]
    assert table.next_event_at() is None


def test_a_schedule_that_starts_later(table: JobTable, clock: ManualClock) -> None:
    info = table.set_schedule(spec(cron="0 * * * *", start_at=10_000.0))
    assert info.next_at == 10_800.0  # the first whole hour at or after start_at
    drive(table, clock, 10_799.0)
    assert jobs(table) == []
    drive(table, clock, 10_800.0)
    assert _tick_times(table) == [10_800.0]


# -- changes (SCH-5) --------------------------------------------------------------------------


def test_a_change_that_keeps_the_timing_keeps_the_progress(
    table: JobTable, clock: ManualClock
) -> None:
    table.set_schedule(spec(every_s=100.0, payload="a"))
    drive(table, clock, 1250.0)
    before = table.get_schedule("s")
    assert before is not None and before.fired == 2 and before.next_at == 1300.0
    clock.advance(10.0)
    after = table.set_schedule(spec(every_s=100.0, payload="b", priority=5))
    assert (after.next_at, after.last_at, after.last_job, after.fired) == (
        before.next_at,
        before.last_at,
        before.last_job,
        before.fired,
    )
    assert after.created_at == before.created_at and after.updated_at == 1260.0
    drive(table, clock, 1300.0)
    newest = jobs(table)[-1]
    assert (newest.payload, newest.priority, newest.enqueued_at) == ("b", 5, 1300.0)


def test_applying_the_same_definition_again_changes_nothing(
    mem: JobTable, clock: ManualClock
) -> None:
    mem.start_journal()
    first = mem.set_schedule(spec(every_s=100.0, payload=(1, 2)))
    mem.take_changes()
    clock.advance(30.0)
    again = mem.set_schedule(spec(every_s=100.0, payload=[1, 2]))
    assert again == first and first.spec.payload == [1, 2]
    assert not mem.has_changes


def test_a_change_of_timing_starts_again_after_now(table: JobTable, clock: ManualClock) -> None:
    table.set_schedule(spec(every_s=100.0))
    drive(table, clock, 1150.0)
    info = table.set_schedule(spec(every_s=1000.0))
    assert info.next_at == 2000.0 and info.fired == 1  # its past jobs still count
    drive(table, clock, 1999.0)
    assert _tick_times(table) == [1100.0]  # no tick of the old timing after the change
    drive(table, clock, 2000.0)
    assert _tick_times(table) == [1100.0, 2000.0]


def test_a_change_of_end_at_is_a_change_of_timing(mem: JobTable, clock: ManualClock) -> None:
    mem.set_schedule(spec(every_s=100.0, end_at=1150.0))
    drive(mem, clock, 1200.0)
    assert mem.get_schedule("s").next_at is None  # type: ignore[union-attr]
    info = mem.set_schedule(spec(every_s=100.0, end_at=5000.0))
    assert info.next_at == 1300.0


# -- pause and resume (SCH-6) -------------------------------------------------------------------


def test_paused_makes_no_job_and_resume_does_not_catch_up(
    table: JobTable, clock: ManualClock
) -> None:
    table.set_schedule(spec(every_s=100.0, missed="each"))
    drive(table, clock, 1100.0)
    info = table.pause_schedule("s", True)
    assert info is not None and info.spec.paused and info.next_at is None
    assert table.next_event_at() is None
    drive(table, clock, 1950.0)
    assert _tick_times(table) == [1100.0]
    info = table.pause_schedule("s", False)
    assert info is not None and info.next_at == 2000.0 and not info.spec.paused
    drive(table, clock, 2000.0)
    assert _tick_times(table) == [1100.0, 2000.0]
    assert table.pause_schedule("nope", True) is None


def test_a_paused_definition_and_its_resume_by_definition(
    mem: JobTable, clock: ManualClock
) -> None:
    info = mem.set_schedule(spec(every_s=100.0, paused=True))
    assert info.next_at is None
    clock.set(1234.0)
    info = mem.set_schedule(spec(every_s=100.0))
    assert info.next_at == 1300.0


def test_pause_checks_its_flag(mem: JobTable) -> None:
    mem.set_schedule(spec(every_s=100.0))
    with pytest.raises(InvalidArgument) as caught:
        mem.pause_schedule("s", 1)  # type: ignore[arg-type]
    assert caught.value.field == "paused"


# -- run now (SCH-7) ------------------------------------------------------------------------------


def test_run_now_makes_a_job_of_its_own_and_keeps_the_next_tick(
    table: JobTable, clock: ManualClock
) -> None:
    table.set_schedule(spec(every_s=100.0, payload={"n": 1}))
    clock.advance(30.5)
    job_id = table.run_schedule("s")
    assert job_id is not None
    job = table.get_job(job_id)
    assert job is not None and job.key == "schedule:s:run:1030500" and job.payload == {"n": 1}
    info = table.get_schedule("s")
    assert info is not None
    assert (info.next_at, info.fired, info.last_at, info.last_job) == (1100.0, 1, 1030.5, job_id)
    table.pause_schedule("s", True)
    clock.advance(1.0)
    assert table.run_schedule("s") is not None  # paused or not
    assert table.run_schedule("nope") is None


# -- delete (SCH-9) -----------------------------------------------------------------------------


def test_delete_leaves_the_jobs_made(table: JobTable, clock: ManualClock) -> None:
    table.set_schedule(spec(every_s=100.0))
    drive(table, clock, 1100.0)
    assert table.delete_schedule("s") is True
    assert table.delete_schedule("s") is False
    assert table.get_schedule("s") is None and table.list_schedules() == []
    drive(table, clock, 2000.0)
    assert _tick_times(table) == [1100.0]
    assert table.next_event_at() is None


# -- bad input (SCH-1) --------------------------------------------------------------------------

BAD = [
    ("id", {"id": ""}),
    ("id", {"id": "has space"}),
    ("queue", {"every_s": 1.0, "queue": "no/slash"}),
    ("cron", {"cron": "61 * * * *"}),
    ("cron", {}),  # neither cron nor every_s
    ("every_s", {"cron": "@hourly", "every_s": 60.0}),
    ("every_s", {"every_s": 0.0}),
    ("every_s", {"every_s": float("inf")}),
    ("tz", {"cron": "@daily", "tz": "Mars/Olympus"}),
    ("start_at", {"every_s": 1.0, "start_at": float("nan")}),
    ("end_at", {"every_s": 1.0, "start_at": 100.0, "end_at": 50.0}),
    ("missed", {"every_s": 1.0, "missed": "all"}),
    ("max_catch_up", {"every_s": 1.0, "max_catch_up": 0}),
    ("paused", {"every_s": 1.0, "paused": "yes"}),
    ("payload", {"every_s": 1.0, "payload": {1, 2}}),
    ("payload", {"every_s": 1.0, "payload": float("nan")}),
    ("payload", {"every_s": 1.0, "payload": "x" * 2000}),
    ("payload", {"every_s": 1.0, "payload": RawJSON(b"[1,")}),
    ("priority", {"every_s": 1.0, "priority": 1.5}),
    ("priority", {"every_s": 1.0, "priority": 2**40}),
    ("max_attempts", {"every_s": 1.0, "max_attempts": 0}),
    ("visibility_timeout_s", {"every_s": 1.0, "visibility_timeout_s": -1.0}),
    ("expires_s", {"every_s": 1.0, "expires_s": 0}),
    ("backoff_base_s", {"every_s": 1.0, "backoff_base_s": 10**9}),
    ("timeout_s", {"every_s": 1.0, "timeout_s": float("nan")}),
    ("partition", {"every_s": 1.0, "partition": 5}),
]


@pytest.mark.parametrize(("field", "fields"), BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD)])
def test_bad_input_names_the_field_and_changes_nothing(
    clock: ManualClock, field: str, fields: dict[str, Any]
) -> None:
    table = JobTable(clock=clock, id_prefix="t", max_payload_bytes=1000)
    table.start_journal()
    table.set_schedule(spec(id="keep", every_s=100.0))
    table.take_changes()
    fields = {"id": "keep", **fields}  # a bad change to a schedule that exists...
    with pytest.raises(InvalidArgument) as caught:
        table.set_schedule(spec(**fields))
    assert caught.value.field == field
    assert not table.has_changes
    assert table.get_schedule("keep") == table.list_schedules()[0]
    assert table.get_schedule("keep").spec.every_s == 100.0  # type: ignore[union-attr]
    fields["id"] = fields["id"] if field == "id" else "new"
    fields.setdefault("queue", "other")
    with pytest.raises(InvalidArgument):  # ...and to a new one on a queue not made yet
        table.set_schedule(spec(**fields))
    assert table.queues() == ["q"] and len(table.list_schedules()) == 1


def test_job_options_are_checked_against_the_queue(mem: JobTable) -> None:
    mem.queue("slow", QueueOpts(backoff_max_s=10.0))
    with pytest.raises(InvalidArgument) as caught:
        mem.set_schedule(spec(queue="slow", every_s=1.0, backoff_base_s=20.0))
    assert caught.value.field == "backoff_base_s"
    assert mem.set_schedule(spec(queue="slow", every_s=1.0, backoff_base_s=5.0)).fired == 0


def test_a_tick_the_queue_now_refuses_makes_no_job(mem: JobTable, clock: ManualClock) -> None:
    mem.set_schedule(spec(every_s=100.0, backoff_base_s=20.0))
    mem.queue("q", QueueOpts(backoff_max_s=10.0))
    drive(mem, clock, 1100.0)
    info = mem.get_schedule("s")
    assert jobs(mem) == [] and info is not None and info.next_at == 1200.0
    with pytest.raises(InvalidArgument) as caught:
        mem.run_schedule("s")
    assert caught.value.field == "backoff_base_s"


def test_set_schedule_makes_its_queue(mem: JobTable) -> None:
    mem.set_schedule(spec(queue="reports", cron="@hourly"))
    assert mem.queues() == ["reports"]


# -- listing ----------------------------------------------------------------------------------


def test_pages_in_id_order_and_by_ids(mem: JobTable) -> None:
    for name in ("c", "a", "b", "d"):
        mem.set_schedule(spec(id=name, every_s=10.0))
    assert [i.spec.id for i in mem.list_schedules(limit=2)] == ["a", "b"]
    assert [i.spec.id for i in mem.list_schedules(after="b", limit=2)] == ["c", "d"]
    assert [i.spec.id for i in mem.list_schedules(after="bb")] == ["c", "d"]
    assert [i.spec.id for i in mem.get_schedules(["d", "zz", "a"])] == ["d", "a"]
    with pytest.raises(InvalidArgument) as caught:
        mem.list_schedules(limit=0)
    assert caught.value.field == "limit"


# -- what a store keeps (SCH-10) ------------------------------------------------------------------


def test_take_changes_carries_schedules_and_deletes(mem: JobTable, clock: ManualClock) -> None:
    mem.start_journal()
    mem.set_schedule(spec(id="a", every_s=100.0, payload={"x": 1}))
    mem.set_schedule(spec(id="b", every_s=100.0))
    changes = mem.take_changes()
    assert sorted(row[0] for row in changes.schedules) == ["a", "b"]
    row = dict(zip(SCHEDULE_FIELDS, next(r for r in changes.schedules if r[0] == "a"), strict=True))
    assert row["payload"] == b'{"x":1}' and row["next_at"] == 1100.0 and row["fired"] == 0
    mem.delete_schedule("b")
    clock.set(1100.0)
    mem.fire_schedules()
    changes = mem.take_changes()
    assert changes.schedules_deleted == ["b"]
    assert [r[0] for r in changes.schedules] == ["a"]
    # The job the tick made rides the same changes as the schedule's progress.
    assert [r[SCHEDULE_FIELDS.index("next_at")] for r in changes.schedules] == [1200.0]
    assert [u[ROW_FIELDS.index("key")] for u in changes.upserts] == [tick_key("a", 1100.0)]


def test_a_restored_table_keeps_progress_and_fires_what_it_missed(
    mem: JobTable, clock: ManualClock
) -> None:
    mem.start_journal()
    mem.set_schedule(spec(id="each", every_s=100.0, missed="each"))
    mem.set_schedule(spec(id="off", every_s=100.0, paused=True))
    drive(mem, clock, 1250.0)
    changes = mem.take_changes()
    restored = JobTable.restore(
        changes.meta,
        changes.queues,
        changes.upserts,
        clock=clock,
        schedules=changes.schedules,
    )
    assert restored.list_schedules() == mem.list_schedules()
    assert restored.next_event_at() == 1300.0
    clock.set(1530.0)  # down for a while
    assert restored.fire_schedules() == ["q"]
    assert _tick_times(restored) == [1100.0, 1200.0, 1300.0, 1400.0, 1500.0]
    info = restored.get_schedule("each")
    assert info is not None and info.fired == 5 and info.next_at == 1600.0
    # A tick made before the stop is never made again: its key is taken by its job.
    assert restored.fire_schedules() == []


# -- cost (SCH-11) --------------------------------------------------------------------------------


def test_next_event_and_a_fire_touch_only_the_schedules_due(
    mem: JobTable, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(10_000):
        mem.set_schedule(spec(id=f"s{i:05d}", every_s=3600.0, start_at=2000.0 + i))
    assert mem.next_event_at() == 2000.0
    looked: list[str] = []
    real = fire

    def counting(s: ScheduleSpec, next_at: float, now: float) -> Any:
        looked.append(s.id)
        return real(s, next_at, now)

    monkeypatch.setattr("conveyor.broker.engine._schedules.fire", counting)
    clock.set(2002.0)
    assert mem.fire_schedules() == ["q"]
    assert looked == ["s00000", "s00001", "s00002"]
    assert mem.next_event_at() == 2003.0
    assert len(jobs(mem)) == 3


def test_in_the_repeated_hour_the_next_tick_is_always_later(
    mem: JobTable, clock: ManualClock
) -> None:
    # cronsim reads 01:00:01 EST (the second 01:00) as 01:00:01 EDT, an hour early: its
    # first match, 01:30 EDT, is already past, and must not come back as the next tick
    # (a fire would then find the schedule due again at once, for ever).
    s = spec(cron="30 1 * * *", tz="America/New_York")
    after = at("2026-11-01T06:00:01")  # 01:00:01 EST
    assert next_tick(s, after) == at("2026-11-02T06:30:00")
    clock.set(at("2026-11-01T05:00:00"))
    mem.set_schedule(s)
    clock.set(after)
    mem.fire_schedules()
    info = mem.get_schedule("s")
    assert info is not None and info.next_at == at("2026-11-02T06:30:00")
    assert _tick_times(mem) == [at("2026-11-01T05:30:00")]


def test_forward_and_backward_walks_agree_across_daylight_saving() -> None:
    # next_tick (forward) and a catch-up of every due tick (backward) name the same ticks.
    for cron, tz in [
        ("30 1 * * *", "America/New_York"),
        ("*/20 1 * * *", "America/New_York"),
        ("*/7 * * * *", "America/New_York"),
        ("0 * * * *", "Europe/Paris"),
        ("15 2 * * *", "Europe/Paris"),
    ]:
        for day in ("2026-03-08T04:00", "2026-11-01T03:00", "2026-03-28T20:00", "2026-10-24T20:00"):
            s = spec(cron=cron, tz=tz, missed="each", max_catch_up=10_000)
            base = at(day)
            forward: list[float] = []
            tick = next_tick(s, base)
            while tick is not None and tick <= base + 10 * 3600:
                forward.append(tick)
                tick = next_tick(s, tick)
            for end in range(1, 11):
                due = [t for t in forward if t <= base + end * 3600 - 0.5]
                if due:
                    assert fire(s, forward[0], base + end * 3600 - 0.5)[0] == due, (cron, day)


def test_a_schedule_deleted_and_made_again_at_once(mem: JobTable, clock: ManualClock) -> None:
    # The deleted one's entry, left in the heap, equals the new one's but for the row.
    mem.set_schedule(spec(every_s=30.0))
    mem.delete_schedule("s")
    mem.set_schedule(spec(every_s=30.0))
    drive(mem, clock, 1030.0)
    assert _tick_times(mem) == [1020.0]


def test_a_payload_equal_in_python_but_not_in_json_is_a_change(mem: JobTable) -> None:
    mem.set_schedule(spec(every_s=60.0, payload=1))
    info = mem.set_schedule(spec(every_s=60.0, payload=True))
    assert info.spec.payload is True
