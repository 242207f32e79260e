"""Listing a queue's jobs by state, page by page; redriving every dead job; the oldest
ready time (docs/contract.md LST-1 to LST-4, OPS-8, CST-5), through the backend
interface on the manual clock."""

from __future__ import annotations

import pytest

from conveyor.broker.backend import Claim, Enqueue, JobList, Report
from conveyor.broker.engine import SEARCH_SCAN, InvalidArgument
from conveyor.broker.scheduler import SteppedScheduler

from .conftest import START, Rig


async def _list(rig: Rig, state: str, queue: str = "q", **kw: object) -> JobList:
    page = await rig.backend.list_jobs(queue, state, **kw)  # type: ignore[arg-type]
    assert page is not None
    return page


async def _ids(rig: Rig, state: str, queue: str = "q", **kw: object) -> list[str]:
    return [job.id for job in (await _list(rig, state, queue, **kw)).jobs]


async def _all(rig: Rig, state: str, limit: int, **kw: object) -> list[str]:
    """Every page of ``state``'s listing, walked by its cursor."""
    out: list[str] = []
    after = None
    while True:
        page = await _list(rig, state, after=after, limit=limit, **kw)
        out += [job.id for job in page.jobs]
        if page.next is None:
            return out
        after = page.next


async def _dead(rig: Rig, queue: str = "q", error: str = "bad") -> str:
    job_id = await rig.put(queue)
    (c,) = await rig.take(queues=(queue,))
    await rig.backend.report([Report(c.id, c.lease, retry=False, error=error)])
    return job_id


async def test_ready_jobs_come_in_claim_order_lst_1(rig: Rig) -> None:
    low = await rig.put(priority=-1)
    first = await rig.put()
    await rig.advance(1)
    high = await rig.put(priority=5)
    second = await rig.put()
    # A retried job is ready again at its retry: after the jobs ready before it.
    retried = await rig.put(priority=9)
    (c,) = await rig.take()
    assert c.id == retried
    await rig.backend.report([Report(c.id, c.lease, retry=True, delay_s=0.0)])
    await rig.advance(1)
    third = await rig.put(priority=5)
    expected = [retried, high, third, first, second, low]
    page = await _list(rig, "ready")
    assert [job.id for job in page.jobs] == expected
    assert page.next is None and page.total == 6
    assert all(job.ready_at <= rig.now for job in page.jobs)
    # The claims take them in exactly that order (CLM-6).
    assert [c.id for c in await rig.take(n=6)] == expected


async def test_scheduled_processing_and_dead_orders_lst_1(rig: Rig) -> None:
    late = await rig.put(delay_s=30.0)
    soon = await rig.put(delay_s=10.0, priority=3)
    never_first = await rig.put(run_at=START + 20.0)
    assert await _ids(rig, "scheduled") == [soon, never_first, late]
    a = await rig.put(visibility_timeout_s=100.0)
    b = await rig.put(visibility_timeout_s=5.0)
    (ca,) = await rig.take()
    await rig.advance(1)
    (cb,) = await rig.take()
    # The oldest claim first, whatever the deadlines, and heartbeats change nothing.
    assert await rig.backend.heartbeat([(ca.id, ca.lease)]) == [True]
    page = await _list(rig, "processing")
    assert [job.id for job in page.jobs] == [a, b] and page.total == 2
    older = await _dead(rig)
    await rig.advance(1)
    newer = await _dead(rig)
    page = await _list(rig, "dead")
    assert [job.id for job in page.jobs] == [newer, older] and page.total == 2
    assert [job.id for job in page.jobs] == [job.id for job in await rig.backend.dead_jobs("q")]
    assert cb.id == b


async def test_a_matured_job_moves_from_scheduled_to_ready_lst_1(rig: Rig) -> None:
    job_id = await rig.put(delay_s=10.0)
    assert (await _ids(rig, "scheduled"), await _ids(rig, "ready")) == ([job_id], [])
    await rig.advance(10)
    assert (await _ids(rig, "scheduled"), await _ids(rig, "ready")) == ([], [job_id])
    page = await _list(rig, "ready")
    assert page.total == 1


async def test_pages_follow_the_cursor_and_end_with_none_lst_2(rig: Rig) -> None:
    ids = [await rig.put(priority=i % 3) for i in range(7)]
    pages = []
    after = None
    while True:
        page = await _list(rig, "ready", after=after, limit=3)
        pages.append([job.id for job in page.jobs])
        if page.next is None:
            break
        after = page.next
    assert [len(p) for p in pages] == [3, 3, 1]
    everything = await _ids(rig, "ready", limit=500)
    assert [job for p in pages for job in p] == everything and sorted(everything) == sorted(ids)
    # A page that ends exactly at the last job says so.
    page = await _list(rig, "ready", limit=7)
    assert page.next is None and len(page.jobs) == 7


@pytest.mark.parametrize("state", ["ready", "scheduled", "processing", "dead"])
async def test_a_job_that_stays_in_its_state_is_on_exactly_one_page_lst_3(
    rig: Rig, state: str
) -> None:
    async def make(i: int) -> str:
        if state == "scheduled":
            return await rig.put(delay_s=100.0 + (i * 7) % 11, priority=i % 3)
        job_id = await rig.put(priority=i % 3)
        if state == "processing":
            (c,) = await rig.take()
            assert c.id == job_id
        elif state == "dead":
            (c,) = await rig.take()
            await rig.backend.report([Report(c.id, c.lease, retry=False)])
        return job_id

    made = [await make(i) for i in range(9)]
    if state == "processing":
        await rig.advance(1)  # (claims at another instant than the first page's)
    first = await _list(rig, state, limit=4)
    assert first.next is not None
    seen = [job.id for job in first.jobs]
    # Between the pages: jobs come, and some leave (one seen, one not yet seen).
    added = [await make(100 + i) for i in range(3)]
    gone_seen, gone_unseen = seen[1], next(j for j in made if j not in seen)
    assert await rig.backend.cancel([gone_seen, gone_unseen]) == [True, True]
    rest: list[str] = []
    after = first.next
    while after is not None:
        page = await _list(rig, state, after=after, limit=4)
        rest += [job.id for job in page.jobs]
        after = page.next
    assert not set(seen) & set(rest)  # no page repeats a job
    stayed = set(made) - {gone_seen, gone_unseen}
    assert stayed <= set(seen) | set(rest)  # nor skips one that stayed
    assert gone_unseen not in rest
    assert set(rest) <= stayed | set(added)


async def test_search_matches_id_key_or_payload_text_lst_4(rig: Rig) -> None:
    by_text = await rig.put(payload={"to": "ada@example.com"})
    by_key = await rig.put(payload={"to": "bob"}, key="order-7")
    await rig.put(payload={"to": "carol"})
    assert await _ids(rig, "ready", search="example.com") == [by_text]
    assert await _ids(rig, "ready", search="order-7") == [by_key]
    assert await _ids(rig, "ready", search=by_key) == [by_key]
    assert await _ids(rig, "ready", search="order") == []  # a key must equal it
    assert await _ids(rig, "ready", search="nobody") == []
    assert await _ids(rig, "dead", search="example.com") == []  # its state only
    page = await _list(rig, "ready", search='"to"', limit=2)
    assert len(page.jobs) == 2 and page.next is not None
    page = await _list(rig, "ready", search='"to"', after=page.next, limit=2)
    assert len(page.jobs) == 1 and page.next is None
    assert page.total == 3  # the state's count, not the matches'


async def test_a_search_looks_at_a_bounded_number_of_jobs_per_call_lst_4(rig: Rig) -> None:
    jobs = [Enqueue("q", {"n": i}) for i in range(SEARCH_SCAN + 5)]
    jobs[-1] = Enqueue("q", {"needle": True})
    ids = await rig.backend.enqueue(jobs)
    page = await _list(rig, "ready", search="needle")
    assert page.jobs == [] and page.next is not None  # looked at SEARCH_SCAN, found none
    page = await _list(rig, "ready", search="needle", after=page.next)
    assert [job.id for job in page.jobs] == [ids[-1]] and page.next is None


async def test_bad_state_limit_or_cursor_are_refused(rig: Rig) -> None:
    await rig.put()
    for state, kw, field in [
        ("pending", {}, "state"),
        ("ready", {"limit": 0}, "limit"),
        ("ready", {"after": (1.5,)}, "cursor"),
        ("dead", {"after": ("x", 1)}, "cursor"),
        ("processing", {"after": (True,)}, "cursor"),
    ]:
        with pytest.raises(InvalidArgument) as caught:
            await rig.backend.list_jobs("q", state, **kw)  # type: ignore[arg-type]
        assert caught.value.field == field
    assert await rig.backend.list_jobs("nowhere", "ready") is None


async def test_redrive_all_puts_every_dead_job_back_ops_8(rig: Rig) -> None:
    dead = [await _dead(rig) for _ in range(3)]
    other = await _dead(rig, "other")
    live = await rig.put()
    rig.heard.forget()
    assert await rig.backend.redrive_all("q") == 3
    assert rig.heard.told_work("q")
    assert await _ids(rig, "dead") == []
    ready = await _list(rig, "ready")
    assert set(dead) | {live} == {job.id for job in ready.jobs}
    revived = [job for job in ready.jobs if job.id in dead]
    assert all(job.attempts == 0 and job.last_error == "bad" for job in revived)
    assert await rig.backend.redrive_all("q") == 0
    assert await rig.backend.redrive_all("nowhere") is None
    assert await _ids(rig, "dead", "other") == [other]


async def test_oldest_ready_at_is_the_earliest_ready_time_cst_5(rig: Rig) -> None:
    await rig.backend.set_queue("q")
    assert (await rig.backend.stats(["q"]))["q"].oldest_ready_at is None
    await rig.put(delay_s=5.0)  # scheduled: not ready, not counted
    assert (await rig.backend.stats(["q"]))["q"].oldest_ready_at is None
    await rig.advance(1)
    first = await rig.put()
    await rig.advance(1)
    await rig.put(priority=9)  # claimed first, but not the oldest
    assert (await rig.backend.stats(["q"]))["q"].oldest_ready_at == START + 1
    (c,) = await rig.take()
    assert c.id != first
    (c,) = await rig.take()
    assert c.id == first
    assert (await rig.backend.stats(["q"]))["q"].oldest_ready_at is None
    await rig.advance(10)  # the delayed job matured at START + 5
    assert (await rig.backend.stats(["q"]))["q"].oldest_ready_at == START + 5


async def test_a_reopened_table_lists_as_before(durable: Rig) -> None:
    ready = [await durable.put(priority=p) for p in (0, 2, 1)]
    waiting = await durable.put(delay_s=50.0)
    held = await durable.put(priority=-5)
    dead = await _dead(durable, "d")
    (c,) = await durable.take(n=1)
    assert c.id == ready[1]
    before = {state: await _ids(durable, state) for state in ("ready", "scheduled", "processing")}
    assert before == {
        "ready": [ready[2], ready[0], held],
        "scheduled": [waiting],
        "processing": [c.id],
    }
    await durable.backend.close()
    again = await durable.reopen(SteppedScheduler(start=durable.now))
    try:
        for state, ids in before.items():
            page = await again.list_jobs("q", state)
            assert page is not None and [job.id for job in page.jobs] == ids
        page = await again.list_jobs("d", "dead")
        assert page is not None and [job.id for job in page.jobs] == [dead]
        assert (await again.stats(["q"]))["q"].oldest_ready_at == START
        ((c2,),) = await again.claim([Claim("w", ("q",), 1)])
        assert c2.id == ready[2]
        page = await again.list_jobs("q", "processing")
        assert page is not None and [job.id for job in page.jobs] == [c.id, c2.id]
    finally:
        await again.close()


async def test_redrive_all_moves_a_big_dead_letter_queue_in_steps_ops_8(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("conveyor.broker.backend.local.REDRIVE_CHUNK", 2)
    monkeypatch.setattr("conveyor.broker.backend.postgres.REDRIVE_CHUNK", 2)
    dead = {await _dead(rig) for _ in range(5)}
    assert await rig.backend.redrive_all("q") == 5
    assert {job.id for job in (await _list(rig, "ready")).jobs} == dead
    assert (await rig.backend.stats(["q"]))["q"].dead == 0
