"""The dispatcher's timing on a manual clock: delayed jobs, lapsing leases, the grace.

A real backend (the local one, on the memory store) and dispatcher share one
``ManualScheduler``; subscriptions are plain callables that collect frames. Time moves
only when a test advances it, so each event is checked at its instant: an epsilon
before (nothing happened) and at it (it did).
The same behaviour through the real server is in tests/server/test_leases.py and
tests/server/test_push.py.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from conveyor.broker.backend import Enqueue, LocalBackend, ready
from conveyor.broker.dispatch import Dispatcher, Subscription
from conveyor.broker.egress import Out
from conveyor.broker.scheduler import ManualScheduler
from conveyor.broker.store import MemoryStore

START = 1_000_000.0
EPS = 1e-3


class Worker:
    """One fake worker connection: its subscription and the frames pushed to it."""

    def __init__(self, dispatcher: Dispatcher, worker_id: str, prefetch: int = 1) -> None:
        self.dispatcher = dispatcher
        self.worker_id = worker_id
        self.prefetch = prefetch
        self.frames: list[dict[str, Any]] = []
        self.sub = self.connect()

    def connect(self, leases: list[tuple[str, str]] | None = None) -> Subscription:
        """Subscribe (again) to queue ``q``; ``self.reattached`` is what came back."""
        ready(self.dispatcher.backend.set_queue("q"))
        self.sub = Subscription(self.worker_id, ["q"], self.prefetch, self.emit)
        self.reattached = ready(self.dispatcher.subscribe(self.sub, leases or []))
        return self.sub

    def emit(self, out: Out, frame: dict[str, Any]) -> None:
        self.frames.append(frame)  # no store here: every frame leaves at once

    def take(self) -> list[dict[str, Any]]:
        """The jobs pushed since the last take."""
        jobs = [job for frame in self.frames if frame["push"] == "jobs" for job in frame["jobs"]]
        self.frames.clear()
        return jobs

    def ack(self, job: dict[str, Any]) -> bool:
        (landed,) = ready(self.dispatcher.backend.ack([(job["id"], job["lease"])]))
        self.dispatcher.finished(self.sub, job["id"], job["lease"])
        return landed


class Rig:
    """A backend and a dispatcher on one manual clock starting at ``START``."""

    def __init__(self, grace_s: float = 0.0) -> None:
        self.clock = ManualScheduler(START)
        self.backend = LocalBackend(
            MemoryStore(),
            self.clock,
            max_payload_bytes=1 << 20,
            rng=random.Random(7),
            id_prefix="t-",
        )
        self.table = self.backend.table  # (read to check what the backend holds)
        self.dispatcher = Dispatcher(self.backend, grace_s=grace_s, scheduler=self.clock)

    def worker(self, worker_id: str, prefetch: int = 1) -> Worker:
        worker = Worker(self.dispatcher, worker_id, prefetch)
        self.clock.run_soon()
        return worker

    def enqueue(self, payload: Any = "x", **options: Any) -> str:
        """Enqueue on ``q`` (the backend tells the dispatcher) and let the pass run."""
        job_id = self.put(payload, **options)
        self.clock.run_soon()
        return job_id

    def put(self, payload: Any = "x", **options: Any) -> str:
        (job_id,) = ready(self.backend.enqueue([Enqueue("q", payload, **options)]))
        assert isinstance(job_id, str), job_id
        return job_id

    def state(self, job_id: str) -> tuple[str, str | None, int, str | None]:
        job = self.table.get_job(job_id)
        assert job is not None
        return (job.state.value, job.worker_id, job.attempts, job.last_error)


def claimed_at(job: dict[str, Any]) -> float:
    """When the dispatcher claimed a pushed job: its lease began then."""
    return float(job["deadline"] - job["visibility_timeout_s"])


def test_a_pass_runs_on_the_scheduler_not_inside_the_call_that_kicked_it() -> None:
    rig = Rig()
    worker = rig.worker("w1")
    job_id = rig.put("x")
    assert worker.take() == []
    rig.clock.run_soon()
    assert [job["id"] for job in worker.take()] == [job_id]


def test_a_delayed_job_is_pushed_exactly_at_its_ready_time() -> None:
    rig = Rig()
    worker = rig.worker("w1")
    job_id = rig.enqueue(delay_s=5.0)

    rig.clock.advance_to(START + 5.0 - EPS)
    assert worker.take() == []
    rig.clock.advance_to(START + 5.0)
    [job] = worker.take()
    assert (job["id"], job["attempt"]) == (job_id, 1)
    assert claimed_at(job) == START + 5.0


def test_a_lapsed_lease_is_pushed_to_another_worker_at_its_deadline_as_attempt_2() -> None:
    rig = Rig()
    w1 = rig.worker("w1")
    job_id = rig.enqueue(visibility_timeout_s=10.0)
    [first] = w1.take()
    w2 = rig.worker("w2")
    assert first["deadline"] == START + 10.0

    rig.clock.advance_to(first["deadline"] - EPS)
    assert w2.take() == []
    assert rig.state(job_id) == ("processing", "w1", 1, None)
    rig.clock.advance_to(first["deadline"])
    [second] = w2.take()
    assert (second["id"], second["attempt"]) == (job_id, 2)
    assert second["lease"] != first["lease"]
    assert claimed_at(second) == first["deadline"]
    assert w1.take() == []  # its lapsed lease still takes its one slot
    assert rig.state(job_id) == ("processing", "w2", 2, None)


def test_a_used_up_lease_dies_at_its_deadline() -> None:
    rig = Rig()
    worker = rig.worker("w1")
    job_id = rig.enqueue(visibility_timeout_s=10.0, max_attempts=1)
    [job] = worker.take()
    rig.worker("w2")

    rig.clock.advance_to(job["deadline"] - EPS)
    assert rig.state(job_id) == ("processing", "w1", 1, None)
    rig.clock.advance_to(job["deadline"])
    assert rig.state(job_id) == ("dead", None, 1, "max attempts exceeded")
    assert rig.table.queue("q").stats().processing == 0


def test_heartbeats_keep_the_job_past_its_first_deadline() -> None:
    rig = Rig()
    w1 = rig.worker("w1")
    job_id = rig.enqueue(visibility_timeout_s=10.0)
    [job] = w1.take()
    w2 = rig.worker("w2")

    for _ in range(3):  # each wakes the timer at the previous deadline, which re-checks
        rig.clock.advance(6.0)
        assert ready(rig.backend.heartbeat([(job_id, job["lease"])])) == [True]
    rig.clock.advance(9.0)
    assert w2.take() == []
    assert rig.state(job_id) == ("processing", "w1", 1, None)
    rig.clock.advance(1.0)  # ten seconds after the last heartbeat
    assert [again["attempt"] for again in w2.take()] == [2]


def test_a_dropped_workers_jobs_are_kept_for_the_grace_then_go_to_another() -> None:
    rig = Rig(grace_s=2.0)
    w1 = rig.worker("w1", prefetch=2)
    ids = [rig.enqueue(n) for n in range(2)]
    assert len(w1.take()) == 2
    w2 = rig.worker("w2", prefetch=2)

    rig.clock.advance(1.0)
    rig.dispatcher.unsubscribe(w1.sub)
    dropped_at = rig.clock.now()
    rig.clock.advance_to(dropped_at + 2.0 - EPS)
    assert w2.take() == []
    assert [rig.state(i) for i in ids] == [("processing", "w1", 1, None)] * 2
    rig.clock.advance_to(dropped_at + 2.0)
    second = w2.take()
    assert sorted(job["id"] for job in second) == sorted(ids)
    assert [job["attempt"] for job in second] == [2, 2]  # the dropped attempt stays used
    assert {claimed_at(job) for job in second} == {dropped_at + 2.0}


def test_reattaching_within_the_grace_keeps_the_jobs() -> None:
    rig = Rig(grace_s=2.0)
    w1 = rig.worker("w1")
    job_id = rig.enqueue()
    [job] = w1.take()
    w2 = rig.worker("w2")

    rig.dispatcher.unsubscribe(w1.sub)
    rig.clock.advance(2.0 - EPS)
    w1.connect([(job_id, job["lease"])])
    assert w1.reattached == [job_id]
    assert rig.clock.next_at() == job["deadline"]  # the grace's timer is gone
    rig.clock.advance(60.0)  # far past the grace: nothing lapses
    assert w2.take() == []
    assert rig.state(job_id) == ("processing", "w1", 1, None)
    assert rig.dispatcher.holder(job_id) == "w1"
    assert w1.ack(job)


def test_a_second_drop_restarts_the_grace_for_everything_the_worker_left() -> None:
    rig = Rig(grace_s=2.0)
    w1 = rig.worker("w1")
    first = rig.enqueue("first")
    assert [job["id"] for job in w1.take()] == [first]
    w2 = rig.worker("w2", prefetch=2)

    rig.dispatcher.unsubscribe(w1.sub)
    rig.clock.advance(1.0)
    w1.connect()  # without its lease, then gone again: one grace from the last drop
    second = rig.enqueue("second")
    assert [job["id"] for job in w1.take()] == [second]
    rig.dispatcher.unsubscribe(w1.sub)
    rig.clock.advance(2.0 - EPS)
    assert w2.take() == []
    rig.clock.advance(EPS)
    assert sorted(job["id"] for job in w2.take()) == sorted([first, second])


def test_the_timer_is_armed_for_the_earliest_next_event_after_each_pass() -> None:
    rig = Rig()
    rig.worker("w1", prefetch=2)
    assert rig.clock.next_at() is None  # nothing timed: no timer

    later = rig.enqueue("later", delay_s=10.0, visibility_timeout_s=60.0)
    assert rig.clock.next_at() == START + 10.0
    sooner = rig.enqueue("sooner", delay_s=3.0, visibility_timeout_s=60.0)
    assert rig.clock.next_at() == START + 3.0  # moved earlier

    rig.clock.advance_to(START + 3.0)
    assert rig.state(sooner)[1] == "w1"
    assert rig.clock.next_at() == START + 10.0  # the next job to mature
    rig.clock.advance_to(START + 10.0)
    assert rig.state(later)[1] == "w1"
    assert rig.clock.next_at() == START + 63.0  # the first lease to lapse


def test_an_ack_leaves_the_earlier_timer_which_then_re_arms_for_the_next_lease() -> None:
    rig = Rig()
    worker = rig.worker("w1", prefetch=2)
    rig.enqueue("a", visibility_timeout_s=5.0)
    rig.clock.advance(1.0)
    rig.enqueue("b", visibility_timeout_s=5.0)
    a, b = worker.take()
    assert rig.clock.next_at() == START + 5.0

    assert worker.ack(a)
    assert rig.clock.next_at() == START + 5.0  # early is harmless: it only re-checks
    rig.clock.advance_to(START + 5.0)
    assert worker.take() == []
    assert rig.clock.next_at() == b["deadline"] == START + 6.0


def test_close_cancels_every_timer() -> None:
    rig = Rig(grace_s=2.0)
    w1 = rig.worker("w1")
    job_id = rig.enqueue(delay_s=1.0)
    rig.clock.advance(1.0)
    [job] = w1.take()
    rig.dispatcher.unsubscribe(w1.sub)
    assert rig.clock.next_at() == START + 1.0 + 2.0  # the grace's end

    rig.dispatcher.close()
    assert rig.clock.next_at() == job["deadline"]  # the backend's, for the lease's end
    asyncio.run(rig.backend.close())
    assert rig.clock.next_at() is None
    assert rig.state(job_id) == ("processing", "w1", 1, None)


@pytest.mark.parametrize("grace_s", [0.0, 2.0])
def test_without_a_worker_to_take_it_a_lapsed_job_waits_claimable(grace_s: float) -> None:
    rig = Rig(grace_s=grace_s)
    w1 = rig.worker("w1")
    job_id = rig.enqueue()
    [_] = w1.take()
    rig.dispatcher.unsubscribe(w1.sub)
    rig.clock.advance(grace_s)
    w2 = rig.worker("w2")  # the lease itself would last 300 s
    assert [(job["id"], job["attempt"]) for job in w2.take()] == [(job_id, 2)]
