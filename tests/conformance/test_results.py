"""Results, kept finished jobs and followers through the backend interface
(docs/contract.md, RES-1 to RES-7)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from conveyor.broker.backend import Enqueue, Finished, Report
from conveyor.broker.engine import InvalidArgument, JobState, QueueOpts

from .conftest import Rig


class Told:
    """A follower that writes down what it is told."""

    def __init__(self) -> None:
        self.finished: list[Finished] = []
        self._told = asyncio.Event()

    def __call__(self, finished: Finished) -> None:
        self.finished.append(finished)
        self._told.set()

    async def wait(self, n: int = 1) -> list[Finished]:
        """What it was told, once it was told ``n`` things (a shared table's notices come
        through the database, later than the call), or after 5 s whatever it was told."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                while len(self.finished) < n:
                    self._told.clear()
                    await self._told.wait()
        return self.finished


async def _keeping(rig: Rig, keep_s: float | None = 100.0) -> None:
    await rig.backend.set_queue("q", QueueOpts(completed_retention_s=keep_s))


async def test_a_valid_ack_stores_its_result_and_get_job_shows_it_res_1_3(rig: Rig) -> None:
    await _keeping(rig)
    job_id = await rig.put(key="k")
    (c,) = await rig.take()
    await rig.advance(2)
    assert await rig.backend.ack([(c.id, c.lease)], [b'{"sum":3}']) == [True]
    job = await rig.job(job_id)
    assert job is not None and job.state is JobState.COMPLETED
    assert job.result == {"sum": 3} and job.completed_at == rig.now
    assert job.worker_id is None and job.deadline is None
    stats = (await rig.backend.stats(["q"]))["q"]
    assert (stats.completed, stats.processing, stats.totals.completed) == (1, 0, 1)
    # RES-4: its key is held while it is kept.
    assert await rig.put(key="k") == job_id
    page = await rig.backend.list_jobs("q", "completed")
    assert page is not None and [j.id for j in page.jobs] == [job_id] and page.total == 1


async def test_a_late_ack_of_a_lapsed_lease_stores_nothing_res_1(rig: Rig) -> None:
    await _keeping(rig)
    job_id = await rig.put(visibility_timeout_s=5.0)
    (c,) = await rig.take()
    await rig.advance(6)
    assert await rig.backend.ack([(c.id, c.lease)], [b'"late"']) == [False]
    job = await rig.job(job_id)
    assert job is not None and job.state is not JobState.COMPLETED
    assert job.result_json is None and job.completed_at is None


async def test_a_result_over_the_payload_limit_is_refused_res_2(rig: Rig) -> None:
    await _keeping(rig)
    job_id = await rig.put()
    (c,) = await rig.take()
    big = b'"' + b"x" * (1 << 20) + b'"'
    with pytest.raises(InvalidArgument) as caught:
        await rig.backend.ack([(c.id, c.lease)], [big])
    assert caught.value.field == "result"
    job = await rig.job(job_id)
    assert job is not None and job.state is JobState.PROCESSING  # nothing acked


async def test_retention_ends_at_completed_at_plus_retention_via_the_sweep_res_3(
    rig: Rig,
) -> None:
    await _keeping(rig, 100.0)
    first = await rig.put()
    (c,) = await rig.take()
    assert await rig.backend.ack([(c.id, c.lease)], [b"1"]) == [True]
    await rig.advance(50)
    second = await rig.put()
    (c,) = await rig.take()
    assert await rig.backend.ack([(c.id, c.lease)], [None]) == [True]
    page = await rig.backend.list_jobs("q", "completed")
    assert page is not None and [j.id for j in page.jobs] == [second, first]  # newest first
    await rig.advance(49.5)
    assert await rig.job(first) is not None
    await rig.advance(0.5)  # the backend's own timer sweeps at completed_at + retention
    await rig.backend.sweep()
    assert await rig.job(first) is None
    kept = await rig.job(second)
    assert kept is not None and kept.result_json is None
    await rig.advance(50)
    await rig.backend.sweep()
    assert await rig.job(second) is None
    assert (await rig.backend.stats(["q"]))["q"].completed == 0


async def test_a_completed_job_can_be_cancelled_res_3(rig: Rig) -> None:
    await _keeping(rig)
    job_id = await rig.put()
    (c,) = await rig.take()
    await rig.backend.ack([(c.id, c.lease)], [b"1"])
    assert await rig.backend.cancel([job_id]) == [True]
    assert await rig.job(job_id) is None
    assert (await rig.backend.stats(["q"]))["q"].completed == 0


async def test_without_retention_the_job_goes_but_its_follower_gets_the_result_res_5(
    rig: Rig,
) -> None:
    job_id = await rig.put()
    told = Told()
    assert await rig.backend.follow([job_id], told) == [None]
    (c,) = await rig.take()
    assert await rig.backend.ack([(c.id, c.lease)], [b'{"ok":true}']) == [True]
    assert await told.wait() == [Finished(job_id, "q", "completed", b'{"ok":true}', None)]
    assert await rig.job(job_id) is None
    # RES-6: once gone, nothing is known of it.
    assert await rig.backend.follow([job_id], Told()) == [
        Finished(job_id, "", "unknown", None, None)
    ]


async def test_follow_answers_at_once_for_a_job_finished_and_kept_res_6(rig: Rig) -> None:
    await _keeping(rig)
    done = await rig.put()
    (c,) = await rig.take()
    await rig.backend.ack([(c.id, c.lease)], [b"42"])
    dead = await rig.put()
    (c,) = await rig.take()
    await rig.backend.report([Report(c.id, c.lease, retry=False, error="bad")])
    live = await rig.put()
    told = Told()
    known = await rig.backend.follow([done, dead, live, "nope"], told)
    assert known == [
        Finished(done, "q", "completed", b"42", None),
        Finished(dead, "q", "dead", None, "bad"),
        None,
        Finished("nope", "", "unknown", None, None),
    ]
    assert told.finished == []


async def test_followers_are_told_of_death_and_cancel_res_5(rig: Rig) -> None:
    failed = await rig.put()
    used_up = await rig.put(max_attempts=1, visibility_timeout_s=5.0)
    expiring = await rig.put(expires_s=5.0, delay_s=100.0)
    cancelled = await rig.put(delay_s=100.0)
    told = Told()
    ids = [failed, used_up, expiring, cancelled]
    assert await rig.backend.follow(ids, told) == [None, None, None, None]
    (a, b) = await rig.take(n=2)
    assert {a.id, b.id} == {failed, used_up}
    fail = a if a.id == failed else b
    await rig.backend.report([Report(fail.id, fail.lease, retry=False, error="boom")])
    assert await rig.backend.cancel([cancelled]) == [True]
    await rig.advance(6)  # the lease of used_up lapses with no attempt left; expiring expires
    await rig.backend.sweep()
    got = {f.id: f for f in await told.wait(4)}
    assert got[failed] == Finished(failed, "q", "dead", None, "boom")
    assert got[cancelled] == Finished(cancelled, "q", "cancelled", None, None)
    assert got[used_up].state == "dead" and got[used_up].error == "max attempts exceeded"
    assert got[expiring].state == "dead" and got[expiring].error == "expired"
    assert len(told.finished) == 4  # once each


async def test_unfollow_stops_the_telling_res_5(rig: Rig) -> None:
    job_id = await rig.put()
    told = Told()
    await rig.backend.follow([job_id], told)
    # (None from a backend; postgres-3 hands the call to one of its backends: a task.)
    undone: Any = rig.backend.unfollow([job_id], told)
    if undone is not None:
        await undone
    await rig.backend.cancel([job_id])
    await asyncio.sleep(0.2)
    assert told.finished == []


async def test_a_follower_hears_an_ack_made_through_another_broker_res_7(rig: Rig) -> None:
    # On postgres-3 each call goes to the next backend: the follow is on one broker, the
    # ack on another; the other kinds check the same on one broker.
    job_id = await rig.put()
    told = Told()
    assert await rig.backend.follow([job_id], told) == [None]
    (c,) = await rig.take()
    assert await rig.backend.ack([(c.id, c.lease)], [b'"done"']) == [True]
    assert await told.wait() == [Finished(job_id, "q", "completed", b'"done"', None)]
    await asyncio.sleep(0.05)
    assert len(told.finished) == 1


async def test_a_restart_keeps_completed_jobs_and_their_results_res_3(durable: Rig) -> None:
    rig = durable
    await _keeping(rig, 100.0)
    job_id = await rig.put(key="k")
    (c,) = await rig.take()
    assert await rig.backend.ack([(c.id, c.lease)], [b'{"n":1}']) == [True]
    await rig.backend.settle()
    acked_at = rig.now
    await rig.backend.close()
    kept = await rig.reopen(rig.clock)
    try:
        await kept.set_queue("q", QueueOpts(completed_retention_s=100.0))
        (job,) = await kept.get_jobs([job_id])
        assert job is not None and job.state is JobState.COMPLETED
        assert job.result == {"n": 1} and job.completed_at == acked_at
        (again,) = await kept.enqueue([Enqueue("q", None, key="k")])
        assert again == job_id
        assert (await kept.stats(["q"]))["q"].completed == 1
        await rig.advance(100)
        await kept.sweep()
        assert await kept.get_jobs([job_id]) == [None]
    finally:
        await kept.close()
