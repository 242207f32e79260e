"""Model-based test of schedules (``docs/contract.md``, SCH-3 to SCH-6), kept in SQLite.

A hypothesis state machine defines, changes, pauses, resumes, deletes and runs a few
schedules of the real ``JobTable`` on a manual clock, moves the clock as the local
backend's timer would (waking at each ``next_event_at()`` and firing there), works off
jobs (claim and ack), and stops the broker: the table is committed to a SQLite file
after every step and, at a stop, loaded again from that file after the clock jumped; a
crash loses the step's commit. What it keeps itself is, per schedule, the instant from
which every tick must have its job; what it checks after every step:

* no tick's job is made twice: the keys of the live jobs and of the jobs acked are each
  unique, and disjoint (SCH-3: exactly once, not only while a job holds the key);
* an un-paused schedule whose ticks came while the broker ran has a job for each of
  them (SCH-4 on time), and no due tick is left unfired (``next_at`` after now);
* after a stop, the ticks missed make the jobs ``missed`` says (SCH-4), and after a
  crash the restarted table makes again only ticks whose jobs the crash lost.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from conveyor.broker.engine import (
    MISSED_GRACE_S,
    JobTable,
    ScheduleSpec,
    next_tick,
    same_timing,
    tick_key,
)
from conveyor.broker.store import SqliteStore

pytestmark = pytest.mark.timeout(600)

# Ten hours before New York's clocks go back (2026-11-01, 06:00 UTC): some runs cross it.
START = datetime(2026, 10, 31, 20, 0, tzinfo=UTC).timestamp()
IDS = ("a", "b", "c")
TIMINGS: list[dict[str, object]] = [
    {"every_s": 30.0},
    {"every_s": 90.0},
    {"every_s": 45.0, "start_at": START + 100.0},
    {"every_s": 60.0, "end_at": START + 3000.0},
    {"cron": "*/5 * * * *"},
    {"cron": "30 1 * * *", "tz": "America/New_York"},
    {"cron": "0 * * * *", "tz": "Europe/Paris"},
]


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def ticks_between(spec: ScheduleSpec, after: float, upto: float) -> list[float]:
    """The ticks of ``spec`` in ``(after, upto]``."""
    found = []
    t = next_tick(spec, after)
    while t is not None and t <= upto:
        found.append(t)
        t = next_tick(spec, t)
    return found


class ScheduleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="conveyor-sched-"))
        self.path = self.dir / "conveyor.db"
        self.clock = Clock()
        self.store = SqliteStore(self.path, sync="normal")
        self.table = self._load()
        # Per schedule: its definition, and for a running one the instant after which
        # every tick up to now has its job (checked, then moved to now, at each step).
        self.specs: dict[str, ScheduleSpec] = {}
        self.checked: dict[str, float] = {}
        self.done: list[str] = []  # the keys of the jobs acked, in order

    def _load(self) -> JobTable:
        return self.store.load(
            clock=self.clock, rng=random.Random(1), max_payload_bytes=1 << 20, id_prefix="m"
        )

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- what the table holds ----------------------------------------------------------------

    def live_keys(self) -> list[str]:
        if "q" not in self.table.queues():
            return []
        keys: list[str] = []
        for state in ("ready", "scheduled", "processing", "dead"):
            after = None
            while True:
                jobs, after = self.table.queue("q").list_jobs(state, after, 1000)
                keys.extend(j.key for j in jobs if j.key is not None)
                if after is None:
                    break
        return keys

    def commit(self) -> None:
        self.store.write(self.table.take_changes())

    def wake(self) -> None:
        """What the backend's timer does, at each event up to now."""
        self.table.fire_schedules()
        self.table.sweep_expired()

    def drive(self, to: float) -> None:
        while True:
            event = self.table.next_event_at()
            if event is None or event > to:
                break
            self.clock.now = max(self.clock.now, event)
            self.wake()
        self.clock.now = to

    # -- rules ---------------------------------------------------------------------------

    @rule(
        schedule_id=st.sampled_from(IDS),
        timing=st.sampled_from(TIMINGS),
        missed=st.sampled_from(["skip", "once", "each"]),
        cap=st.integers(1, 4),
        paused=st.booleans(),
        payload=st.integers(0, 3),
    )
    def define(
        self,
        schedule_id: str,
        timing: dict[str, object],
        missed: str,
        cap: int,
        paused: bool,
        payload: int,
    ) -> None:
        spec = ScheduleSpec(
            id=schedule_id,
            queue="q",
            payload=payload,
            missed=missed,
            max_catch_up=cap,
            paused=paused,
            **timing,  # type: ignore[arg-type]
        )
        old = self.specs.get(schedule_id)
        before = self.table.get_schedule(schedule_id)
        info = self.table.set_schedule(spec)
        self.specs[schedule_id] = spec
        now = self.clock.now
        if paused:
            self.checked.pop(schedule_id, None)
            assert info.next_at is None
        elif old is None or old.paused or not same_timing(old, spec):
            self.checked[schedule_id] = now
            assert info.next_at == next_tick(spec, now)
        else:  # SCH-5: the progress is kept
            assert before is not None
            assert (info.next_at, info.fired, info.last_job) == (
                before.next_at,
                before.fired,
                before.last_job,
            )
        self.commit()

    @rule(schedule_id=st.sampled_from(IDS), paused=st.booleans())
    def pause(self, schedule_id: str, paused: bool) -> None:
        info = self.table.pause_schedule(schedule_id, paused)
        spec = self.specs.get(schedule_id)
        if spec is None:
            assert info is None
            return
        assert info is not None
        if paused:
            self.checked.pop(schedule_id, None)
        elif spec.paused:  # resumed: ticks from now on (SCH-6)
            self.checked[schedule_id] = self.clock.now
        self.specs[schedule_id] = info.spec
        self.commit()

    @rule(schedule_id=st.sampled_from(IDS))
    def delete(self, schedule_id: str) -> None:
        assert self.table.delete_schedule(schedule_id) == (schedule_id in self.specs)
        self.specs.pop(schedule_id, None)
        self.checked.pop(schedule_id, None)
        self.commit()

    @rule(schedule_id=st.sampled_from(IDS))
    def run_now(self, schedule_id: str) -> None:
        job_id = self.table.run_schedule(schedule_id)
        assert (job_id is None) == (schedule_id not in self.specs)
        self.commit()

    @rule(seconds=st.floats(0.0, 2000.0))
    def advance(self, seconds: float) -> None:
        self.drive(self.clock.now + seconds)
        self.commit()

    @precondition(lambda self: "q" in self.table.queues())
    @rule(n=st.integers(1, 20))
    def work(self, n: int) -> None:
        for handle in self.table.queue("q").claim_batch("w", n):
            key = handle.job.key
            assert handle.ack()
            if key is not None:
                self.done.append(key)
        self.commit()

    @rule(seconds=st.floats(0.0, 20_000.0))
    def stop(self, seconds: float) -> None:
        """The broker stops (everything committed), and starts ``seconds`` later."""
        self.store.close()
        kept = self.table.list_schedules()
        before = set(self.live_keys()) | set(self.done)
        expected: set[str] = set()
        now = self.clock.now + seconds
        for schedule_id, since in self.checked.items():
            spec = self.specs[schedule_id]
            due = ticks_between(spec, since, now)
            if not due:
                continue
            if spec.missed == "each":
                expected.update(tick_key(schedule_id, t) for t in due[-spec.max_catch_up :])
            elif spec.missed == "once" or now - due[-1] < MISSED_GRACE_S:
                expected.add(tick_key(schedule_id, due[-1]))
        self.clock.now = now
        self.store = SqliteStore(self.path, sync="normal")
        self.table = self._load()
        assert self.table.list_schedules() == kept  # every schedule, with its progress
        self.wake()  # a started backend's timer fires at once: its next event is past
        assert set(self.live_keys()) - before == expected  # paused ones make none
        for schedule_id in self.checked:
            self.checked[schedule_id] = now
        self.commit()

    @rule(seconds=st.floats(0.0, 2000.0))
    def crash(self, seconds: float) -> None:
        """The broker runs ``seconds`` on, and is killed before it commits."""
        kept = set(self.live_keys())
        committed = self.table.list_schedules()
        self.drive(self.clock.now + seconds)
        lost = set(self.live_keys()) - kept
        self.store.close()  # (nothing taken: the step's changes never reach the file)
        self.store = SqliteStore(self.path, sync="normal")
        self.table = self._load()
        assert set(self.live_keys()) == kept
        assert self.table.list_schedules() == committed
        self.wake()
        again = set(self.live_keys()) - kept
        assert again <= lost  # only ticks whose jobs the crash lost, by their policy
        for schedule_id in self.checked:
            self.checked[schedule_id] = self.clock.now
        self.commit()

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def each_tick_makes_at_most_one_job(self) -> None:
        # (A run-now's key is its instant's: two runs in one millisecond share one.)
        live = [key for key in self.live_keys() if ":run:" not in key]
        done = [key for key in self.done if ":run:" not in key]
        assert len(live) == len(set(live))
        assert len(done) == len(set(done))
        assert not set(live) & set(done)

    @invariant()
    def every_tick_of_a_running_schedule_has_its_job(self) -> None:
        have = set(self.live_keys()) | set(self.done)
        now = self.clock.now
        for schedule_id, since in self.checked.items():
            spec = self.specs[schedule_id]
            for tick in ticks_between(spec, since, now):
                assert tick_key(schedule_id, tick) in have, (schedule_id, tick)
            self.checked[schedule_id] = now
        for info in self.table.list_schedules():
            assert info.next_at is None or info.next_at > now
            if info.spec.paused:
                assert info.next_at is None


ScheduleMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSchedules = ScheduleMachine.TestCase
