"""``Client.list_jobs``, ``dead_letters``, ``redrive_all`` and ``cancel_many`` against a
real broker, and ``stats``' ``oldest_ready_at``."""

from __future__ import annotations

import time

import pytest

from conveyor import JobPage
from conveyor.broker.server import Broker
from conveyor.sdk import Client, Fail, InvalidArgument, Job, NotFound, SyncClient, Worker

from .conftest import WAIT, Probe, running


async def test_pages_of_each_state_follow_the_cursor(client: Client) -> None:
    ids = [await client.enqueue("mail", {"n": i}, priority=i % 2) for i in range(5)]
    later = await client.enqueue("mail", {"n": "later"}, delay_s=60.0)
    first = await client.list_jobs("mail", "ready", limit=2)
    assert isinstance(first, JobPage)
    assert first.total == 5 and len(first.jobs) == 2 and first.next is not None
    assert all(job.state == "ready" for job in first.jobs)
    seen = [job.id for job in first.jobs]
    cursor: str | None = first.next
    while cursor is not None:
        page = await client.list_jobs("mail", "ready", cursor=cursor, limit=2)
        seen += [job.id for job in page.jobs]
        cursor = page.next
    # Claim order: the priority-1 jobs first, each priority oldest first.
    assert seen == [ids[1], ids[3], ids[0], ids[2], ids[4]]
    scheduled = await client.list_jobs("mail", "scheduled")
    assert [(j.id, j.state) for j in scheduled.jobs] == [(later, "scheduled")]
    assert scheduled.next is None and scheduled.total == 1
    found = await client.list_jobs("mail", "ready", search='"n":3')
    assert [job.id for job in found.jobs] == [ids[3]]


async def test_bad_requests_name_their_field(client: Client) -> None:
    await client.enqueue("mail", {})
    for kwargs, field in [
        ({"state": "pending"}, "state"),
        ({"state": "ready", "limit": 501}, "limit"),
        ({"state": "ready", "limit": 0}, "limit"),
        ({"state": "ready", "cursor": "not a cursor"}, "cursor"),
        ({"state": "ready", "search": ""}, "search"),
    ]:
        with pytest.raises(InvalidArgument) as caught:
            await client.list_jobs("mail", **kwargs)  # type: ignore[arg-type]
        assert caught.value.field == field, kwargs
    # A cursor of another state's listing is refused too.
    for i in range(2):
        await client.enqueue("mail", {"i": i})
    page = await client.list_jobs("mail", "ready", limit=1)
    assert page.next is not None
    with pytest.raises(InvalidArgument) as caught:
        await client.list_jobs("mail", "dead", cursor=page.next)
    assert caught.value.field == "cursor"
    with pytest.raises(NotFound):
        await client.list_jobs("nowhere", "ready")
    with pytest.raises(NotFound):
        await client.redrive_all("nowhere")


async def test_dead_letters_redrive_all_and_cancel_many(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = Worker(broker.url, queues=["doomed"], shutdown_timeout_s=1.0)

    @worker.handler("doomed")
    async def handle(job: Job) -> None:
        if job.payload["fail"]:
            raise Fail("bad input")

    async with running(worker, probe):
        dead = [await client.enqueue("doomed", {"fail": True, "n": i}) for i in range(3)]
        for job_id in dead:
            await probe.report("fail", job_id)

    letters = await client.dead_letters("doomed", limit=2)
    assert letters.total == 3 and len(letters.jobs) == 2 and letters.next is not None
    rest = await client.dead_letters("doomed", cursor=letters.next)
    got = [job.id for job in letters.jobs + rest.jobs]
    assert sorted(got) == sorted(dead) and len(set(got)) == 3
    assert all(job.state == "dead" and job.last_error == "bad input" for job in letters.jobs)

    assert await client.redrive_all("doomed") == 3
    assert (await client.dead_letters("doomed")).total == 0
    ready = await client.list_jobs("doomed", "ready")
    assert sorted(job.id for job in ready.jobs) == sorted(dead)
    assert all(job.attempts == 0 for job in ready.jobs)

    assert await client.cancel_many([dead[0], "nope", dead[2], dead[0]]) == [
        True,
        False,
        True,
        False,
    ]
    assert [job.id for job in (await client.list_jobs("doomed", "ready")).jobs] == [dead[1]]


async def test_cancel_many_splits_by_max_batch(client: Client) -> None:
    ids = [await client.enqueue("many", {"n": i}) for i in range(5)]
    await client.stats()  # (connected: the broker's max_batch is known)
    client._session.hello["max_batch"] = 2  # type: ignore[index]
    assert await client.cancel_many(ids) == [True] * 5
    assert (await client.stats("many"))["many"]["ready"] == 0


async def test_stats_tell_the_oldest_ready_time(client: Client) -> None:
    await client.enqueue("age", {}, delay_s=60.0)
    assert (await client.stats("age"))["age"]["oldest_ready_at"] is None
    before = time.time()
    first = await client.enqueue("age", {})
    await client.enqueue("age", {}, priority=5)
    oldest = (await client.stats("age"))["age"]["oldest_ready_at"]
    info = await client.get_job(first)
    assert info is not None and oldest == info.ready_at and oldest >= before - 1


def test_the_sync_client_has_the_same_methods(broker_process: str) -> None:
    with SyncClient(broker_process, connect_timeout=WAIT, request_timeout=WAIT) as client:
        queue = f"sync-list-{time.time_ns()}"
        ids = [client.enqueue(queue, {"n": i}) for i in range(3)]
        page = client.list_jobs(queue, "ready", limit=2)
        assert [job.id for job in page.jobs] == ids[:2] and page.total == 3
        rest = client.list_jobs(queue, "ready", cursor=page.next)
        assert [job.id for job in rest.jobs] == ids[2:] and rest.next is None
        assert client.dead_letters(queue).jobs == []
        assert client.redrive_all(queue) == 0
        assert client.cancel_many(ids) == [True, True, True]
        assert client.list_jobs(queue, "ready").total == 0
