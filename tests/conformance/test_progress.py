"""Progress and watching through the backend interface (docs/contract.md, PRG-1 to
PRG-8). On postgres-3 each call goes to the next of three brokers on one database, so a
watch is on one broker and the progress, retry or ack that it hears of on another."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from conveyor.broker.backend import BackOff, Finished, Progress, Report, Step, WatchEvent
from conveyor.broker.egress import Out
from conveyor.broker.engine import MAX_PROGRESS_BYTES, InvalidArgument, Job, JobState, QueueOpts

from .conftest import Rig


class Watcher:
    """A watcher that writes down what it is told."""

    def __init__(self) -> None:
        self.events: list[WatchEvent] = []
        self._told = asyncio.Event()

    def __call__(self, event: WatchEvent) -> None:
        self.events.append(event)
        self._told.set()

    async def until(self, done: Any) -> list[WatchEvent]:
        """What it was told, once ``done(events)`` holds (a shared table's notices come
        through the database, later than the call), or after 5 s whatever it was told."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                while not done(self.events):
                    self._told.clear()
                    await self._told.wait()
        return self.events

    async def until_progress(self, value: bytes) -> list[WatchEvent]:
        return await self.until(
            lambda events: any(
                isinstance(e, Step) and e.kind == "progress" and e.progress == value for e in events
            )
        )

    async def until_end(self) -> list[WatchEvent]:
        return await self.until(lambda events: any(isinstance(e, Finished) for e in events))


def _shape(events: list[WatchEvent]) -> list[tuple[Any, ...]]:
    """The events as tuples, each run of progress events as its last (PRG-6: a watcher
    may be told only the latest of values reported in a row)."""
    out: list[tuple[Any, ...]] = []
    for event in events:
        if isinstance(event, Finished):
            out.append(("end", event.state, event.result_json, event.error))
        elif event.kind == "progress":
            if out and out[-1][0] == "progress":
                out.pop()
            out.append(("progress", event.attempt, event.progress))
        else:
            out.append(("retry", event.attempt, event.reason, event.error))
    return out


async def _progress(rig: Rig, job_id: str, lease: str, value: bytes) -> bool | InvalidArgument:
    (answer,) = await rig.backend.progress([Progress(job_id, lease, value)])
    return answer


async def test_progress_under_a_valid_lease_is_stored_and_get_job_shows_it_prg_1(
    rig: Rig,
) -> None:
    job_id = await rig.put()
    assert (await rig.job(job_id)).progress_json is None  # type: ignore[union-attr]
    (c,) = await rig.take()
    assert await _progress(rig, c.id, c.lease, b'{"done":0.4,"message":"step 2 of 5"}')
    job = await rig.job(job_id)
    assert job is not None and job.progress == {"done": 0.4, "message": "step 2 of 5"}


async def test_progress_of_a_stale_lease_or_unknown_job_is_not_stored_prg_1(rig: Rig) -> None:
    job_id = await rig.put(visibility_timeout_s=5.0)
    (c,) = await rig.take()
    assert await _progress(rig, c.id, c.lease, b"0.1") is True
    await rig.advance(6)  # the lease lapsed
    assert await _progress(rig, c.id, c.lease, b"0.9") is False
    assert await _progress(rig, c.id, "not-a-lease", b"0.9") is False
    assert await _progress(rig, "no-such-job", c.lease, b"0.9") is False
    job = await rig.job(job_id)
    assert job is not None and job.progress == 0.1


async def test_the_latest_progress_wins_prg_2(rig: Rig) -> None:
    job_id = await rig.put()
    (c,) = await rig.take()
    answers = await rig.backend.progress(
        [Progress(c.id, c.lease, b"0.1"), Progress(c.id, c.lease, b"0.2")]
    )
    assert answers == [True, True]
    assert await _progress(rig, c.id, c.lease, b"0.3") is True
    job = await rig.job(job_id)
    assert job is not None and job.progress == 0.3


async def test_progress_over_the_cap_is_refused_naming_the_field_prg_3(rig: Rig) -> None:
    job_id = await rig.put()
    (c,) = await rig.take()
    big = b'"' + b"x" * MAX_PROGRESS_BYTES + b'"'
    answers = await rig.backend.progress(
        [Progress(c.id, c.lease, big), Progress(c.id, c.lease, b"0.5")]
    )
    refused, landed = answers
    assert isinstance(refused, InvalidArgument)
    assert refused.field == "progress" and refused.code == "too_large"
    assert landed is True  # (each item stands alone)
    job = await rig.job(job_id)
    assert job is not None and job.progress == 0.5


async def test_progress_stays_through_a_retry_until_the_next_attempt_reports_prg_4(
    rig: Rig,
) -> None:
    job_id = await rig.put()
    (c,) = await rig.take()
    await _progress(rig, c.id, c.lease, b"0.7")
    assert await rig.backend.report([Report(c.id, c.lease, retry=True, delay_s=0)]) == [True]
    job = await rig.job(job_id)
    assert job is not None and job.state is JobState.PENDING and job.progress == 0.7
    (again,) = await rig.take()
    assert await _progress(rig, again.id, again.lease, b"0.1") is True
    job = await rig.job(job_id)
    assert job is not None and job.progress == 0.1


async def test_a_completed_job_keeps_its_last_progress_prg_4(rig: Rig) -> None:
    await rig.backend.set_queue("q", QueueOpts(completed_retention_s=100.0))
    job_id = await rig.put()
    (c,) = await rig.take()
    await _progress(rig, c.id, c.lease, b"1.0")
    assert await rig.backend.ack([(c.id, c.lease)], [b'"ok"']) == [True]
    job = await rig.job(job_id)
    assert job is not None and job.state is JobState.COMPLETED and job.progress == 1.0


async def test_a_watcher_sees_progress_a_retry_and_the_end_in_order_prg_5(rig: Rig) -> None:
    job_id = await rig.put()
    watcher = Watcher()
    (known,) = await rig.backend.watch([job_id], watcher)
    assert isinstance(known, Job) and known.id == job_id and known.progress_json is None
    (c,) = await rig.take()
    await _progress(rig, c.id, c.lease, b"0.5")
    await watcher.until_progress(b"0.5")
    assert await rig.backend.report([Report(c.id, c.lease, retry=True, error="flaky")]) == [True]
    await watcher.until(
        lambda events: any(isinstance(e, Step) and e.kind == "retry" for e in events)
    )
    await rig.advance(3600)  # past any retry delay
    (again,) = await rig.take()
    await _progress(rig, again.id, again.lease, b"0.9")
    await watcher.until_progress(b"0.9")
    assert await rig.backend.ack([(again.id, again.lease)], [b'{"n":1}']) == [True]
    events = await watcher.until_end()
    assert _shape(events) == [
        ("progress", 1, b"0.5"),
        ("retry", 1, "failed", "flaky"),
        ("progress", 2, b"0.9"),
        ("end", "completed", b'{"n":1}', None),
    ]
    await asyncio.sleep(0.05)
    assert len(watcher.events) == len(events)  # nothing after the end


async def test_a_back_off_is_told_as_a_retry_that_spent_no_attempt_prg_5(rig: Rig) -> None:
    job_id = await rig.put()
    watcher = Watcher()
    await rig.backend.watch([job_id], watcher)
    (c,) = await rig.take()
    assert await rig.backend.back_off([BackOff(c.id, c.lease, 0.0)]) == [True]
    await watcher.until(lambda got: any(isinstance(e, Step) for e in got))
    (again,) = await rig.take()
    assert again.attempt == 1  # (the attempt was given back)
    await _progress(rig, again.id, again.lease, b"1")
    assert await rig.backend.ack([(again.id, again.lease)]) == [True]
    events = await watcher.until_end()
    assert _shape(events) == [
        ("retry", 1, "backed_off", None),
        ("progress", 1, b"1"),
        ("end", "completed", None, None),
    ]


async def test_a_lease_the_broker_lapses_is_told_as_a_retry_the_last_as_the_end_prg_5(
    rig: Rig,
) -> None:
    """A lapse the broker makes (a worker gone past its grace, HND-11) is a step: a retry
    while attempts are left; the last attempt's lapse is told as the job's death only."""
    job_id = await rig.put(max_attempts=2)
    watcher = Watcher()
    await rig.backend.watch([job_id], watcher)
    (c,) = await rig.take()
    assert await rig.backend.lapse([(c.id, c.lease)]) == [True]
    await watcher.until(lambda got: any(isinstance(e, Step) for e in got))
    assert _shape(watcher.events) == [("retry", 1, "lapsed", None)]
    (again,) = await rig.take()
    assert again.attempt == 2
    assert await rig.backend.lapse([(again.id, again.lease)]) == [True]
    await rig.backend.sweep()  # the used-up lapsed job dies (DLQ-3)
    events = await watcher.until_end()
    assert _shape(events) == [
        ("retry", 1, "lapsed", None),
        ("end", "dead", None, "max attempts exceeded"),
    ]


async def test_a_lease_that_runs_out_by_time_is_told_once_as_a_retry_prg_5(rig: Rig) -> None:
    """A lease that runs out by time (a worker hung but still connected) is a step too:
    told once as a retry of the attempt that lapsed, at the latest when the job is taken
    again; the last attempt's lapse is told as its end only. (Through another broker a
    step comes through the database: the test waits for it, as for any such step.)"""
    job_id = await rig.put(max_attempts=3, visibility_timeout_s=5.0)
    watcher = Watcher()
    await rig.backend.watch([job_id], watcher)

    def retries(n: int) -> Any:
        return lambda got: sum(isinstance(e, Step) and e.kind == "retry" for e in got) >= n

    (first,) = await rig.take()
    await rig.advance(6)  # no heartbeat: the lease runs out, no call ends it
    (again,) = await rig.take()
    assert again.id == job_id and again.attempt == 2 and again.lease != first.lease
    await watcher.until(retries(1))
    assert await _progress(rig, again.id, again.lease, b"0.5") is True
    await watcher.until_progress(b"0.5")
    await rig.advance(6)
    (third,) = await rig.take()
    assert third.attempt == 3
    await watcher.until(retries(2))
    await rig.advance(6)
    await rig.backend.sweep()  # the used-up lapsed job dies (DLQ-3)
    events = await watcher.until_end()
    assert _shape(events) == [
        ("retry", 1, "lapsed", None),
        ("progress", 2, b"0.5"),
        ("retry", 2, "lapsed", None),
        ("end", "dead", None, "max attempts exceeded"),
    ]


async def test_a_watcher_is_told_of_death_and_cancel_prg_5(rig: Rig) -> None:
    failing = await rig.put()
    cancelled = await rig.put(delay_s=100.0)
    watcher = Watcher()
    known = await rig.backend.watch([failing, cancelled], watcher)
    assert all(isinstance(k, Job) for k in known)
    (c,) = await rig.take()
    await rig.backend.report([Report(c.id, c.lease, retry=False, error="boom")])
    await rig.backend.cancel([cancelled])
    events = await watcher.until(lambda events: len(events) >= 2)
    ends = {e.id: e for e in events if isinstance(e, Finished)}
    assert ends[failing] == Finished(failing, "q", "dead", None, "boom")
    assert ends[cancelled] == Finished(cancelled, "q", "cancelled", None, None)


async def test_watching_an_unknown_or_finished_job_ends_at_once_prg_7(rig: Rig) -> None:
    await rig.backend.set_queue("q", QueueOpts(completed_retention_s=100.0))
    done = await rig.put()
    (c,) = await rig.take()
    await rig.backend.ack([(c.id, c.lease)], [b"42"])
    watcher = Watcher()
    known = await rig.backend.watch([done, "nope"], watcher)
    assert known == [
        Finished(done, "q", "completed", b"42", None),
        Finished("nope", "", "unknown", None, None),
    ]
    await asyncio.sleep(0.05)
    assert watcher.events == []


async def test_unwatch_stops_the_telling_prg_5(rig: Rig) -> None:
    job_id = await rig.put()
    watcher = Watcher()
    await rig.backend.watch([job_id], watcher)
    undone: Any = rig.backend.unwatch([job_id], watcher)
    if undone is not None:
        await undone
    (c,) = await rig.take()
    await _progress(rig, c.id, c.lease, b"0.5")
    await rig.backend.ack([(c.id, c.lease)])
    await asyncio.sleep(0.2)
    assert watcher.events == []


async def test_a_follower_and_a_watcher_of_one_job_are_both_told_prg_5(rig: Rig) -> None:
    job_id = await rig.put()
    watcher = Watcher()
    follower = Watcher()
    await rig.backend.watch([job_id], watcher)
    assert await rig.backend.follow([job_id], follower) == [None]
    (c,) = await rig.take()
    await rig.backend.ack([(c.id, c.lease)])
    events = await watcher.until_end()
    assert _shape(events) == [("end", "completed", None, None)]
    assert _shape(await follower.until_end()) == [("end", "completed", None, None)]


async def test_a_restart_keeps_the_latest_progress_prg_2(durable: Rig) -> None:
    rig = durable
    sent = 50
    job_id = await rig.put(visibility_timeout_s=600.0)
    (c,) = await rig.take()
    for i in range(sent):
        await _progress(rig, c.id, c.lease, str(i).encode())
    await rig.through_gate(Out.REPLY)
    kept = await rig.on_disk_job(job_id)
    assert kept is not None and kept.progress == sent - 1
    await rig.backend.close()
    again = await rig.reopen(rig.clock)
    try:
        (job,) = await again.get_jobs([job_id])
        assert job is not None and job.progress == sent - 1
    finally:
        await again.close()
