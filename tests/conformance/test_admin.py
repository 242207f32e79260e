"""Cancel, dead letters, redrive, purge, the sweep and stats through the backend
interface (docs/contract.md OPS, DLQ, CST-4)."""

from __future__ import annotations

from conveyor.broker.backend import Report
from conveyor.broker.engine import JobState, QueueOpts

from .conftest import Rig


async def _dead(rig: Rig, queue: str = "q", error: str = "bad") -> str:
    job_id = await rig.put(queue)
    (c,) = await rig.take(queues=(queue,))
    await rig.backend.report([Report(c.id, c.lease, retry=False, error=error)])
    return job_id


async def test_cancel_deletes_in_any_state_and_tells_the_listener_ops_2(rig: Rig) -> None:
    pending = await rig.put()
    held = await rig.put()
    dead = await _dead(rig, "d")
    (c,) = await rig.take()
    assert c.id == pending
    rig.heard.forget()
    assert await rig.backend.cancel([pending, held, dead, "unknown"]) == [True, True, True, False]
    assert rig.heard.cancels == [pending, held, dead]
    assert await rig.backend.get_jobs([pending, held, dead]) == [None, None, None]
    assert await rig.backend.ack([(c.id, c.lease)]) == [False]  # its lease is no longer valid


async def test_dead_jobs_come_newest_first_in_pages(rig: Rig) -> None:
    first = await _dead(rig)
    await rig.advance(1)
    second = await _dead(rig)
    page = await rig.backend.dead_jobs("q")
    assert [job.id for job in page] == [second, first]
    assert [job.id for job in await rig.backend.dead_jobs("q", offset=1, limit=1)] == [first]
    assert await rig.backend.dead_jobs("nowhere") == []


async def test_redrive_puts_a_dead_job_back_ops_5(rig: Rig) -> None:
    job_id = await _dead(rig, error="oops")
    live = await rig.put()
    rig.heard.forget()
    assert await rig.backend.redrive([job_id, live]) == [True, False]
    assert rig.heard.told_work("q")
    job = await rig.job(job_id)
    assert job is not None and job.state is JobState.PENDING
    assert job.attempts == 0 and job.died_at is None and job.last_error == "oops"


async def test_purge_deletes_the_dead_of_one_queue_ops_1_6(rig: Rig) -> None:
    await _dead(rig, "a")
    await _dead(rig, "a")
    other = await _dead(rig, "b")
    assert await rig.backend.purge_dead("a") == 2
    assert await rig.backend.purge_dead("nowhere") is None  # no such queue
    assert await rig.job(other) is not None


async def test_the_sweep_expires_kills_and_purges_dlq_3_4_5(rig: Rig) -> None:
    await rig.backend.set_queue("q", QueueOpts(dead_letter_retention_s=100.0))
    old_dead = await _dead(rig)
    expiring = await rig.put(expires_s=5.0)
    used_up = await rig.put(max_attempts=1, visibility_timeout_s=5.0, priority=1)
    (c,) = await rig.take()
    assert c.id == used_up
    await rig.advance(100)
    # The backend's own timer has swept on the way; an explicit sweep finds nothing left.
    result = await rig.backend.sweep()
    assert (result.expired, result.exhausted, result.purged) == (0, 0, 0)
    expired = await rig.job(expiring)
    assert expired is not None and expired.last_error == "expired"
    lapsed = await rig.job(used_up)
    assert lapsed is not None and lapsed.last_error == "max attempts exceeded"
    assert await rig.job(old_dead) is None  # past its retention
    stats = (await rig.backend.stats(["q"]))["q"]
    assert (stats.dead, stats.totals.expired) == (2, 1)


async def test_an_explicit_sweep_returns_its_counts_dlq_5(rig: Rig) -> None:
    await rig.backend.set_queue("q", QueueOpts(dead_letter_retention_s=0.0))
    await rig.put(expires_s=5.0)
    await rig.advance(5)  # (the timer's sweep runs here too; count what is left after)
    result = await rig.backend.sweep()
    stats = (await rig.backend.stats(["q"]))["q"]
    assert stats.dead == 0 and stats.pending == 0  # DLQ-4: died and deleted in one sweep
    assert result.expired + stats.totals.expired >= 1


async def test_stats_count_each_state(rig: Rig) -> None:
    await rig.put()
    await rig.put(delay_s=50)
    await rig.put()
    await _dead(rig)
    await rig.take()
    stats = await rig.backend.stats()
    q = stats["q"]
    assert (q.ready, q.scheduled, q.processing, q.dead, q.paused) == (1, 1, 1, 1, False)
    assert q.totals.enqueued == 4 and q.totals.dead == 1
    assert await rig.backend.stats(["nowhere"]) == {}
    assert await rig.backend.queues() == ["q"]


async def test_announce_says_who_else_is_on_the_table(rig: Rig) -> None:
    # One backend on its table: nobody else (on a shared table, nobody else yet).
    assert await rig.backend.announce("me", {"server": {"url": "ws://me"}}, 5.0) == []


async def test_calls_about_a_queue_never_made_answer_so_and_make_none(rig: Rig) -> None:
    job_id = await rig.put("a")
    assert await rig.backend.resume("nowhere") is False
    assert await rig.backend.list_jobs("nowhere", "ready") is None
    assert await rig.backend.redrive_all("nowhere") is None
    assert await rig.backend.stats(["nowhere", "a"]) == {"a": (await rig.backend.stats())["a"]}
    (got,) = await rig.take(queues=("nowhere", "a"))
    assert got.id == job_id  # (a name no queue has is passed over)
    assert await rig.backend.queues() == ["a"]
