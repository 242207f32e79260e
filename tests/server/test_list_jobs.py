"""``list_jobs``, ``cancel_batch`` and ``redrive_all`` on the wire, through a real broker."""

from __future__ import annotations

import pytest

from conveyor.broker.scheduler import SteppedScheduler
from conveyor.sdk import _wire as wire

from .conftest import ClientFactory, with_config


@pytest.fixture
def scheduler() -> SteppedScheduler:
    """The broker's clock, moved by the tests (the listing itself never needs it to)."""
    return SteppedScheduler()


async def test_a_page_holds_job_objects_a_cursor_and_the_total(client: ClientFactory) -> None:
    conn = await client()
    ids = [(await conn.call("enqueue", queue="q", payload={"n": i}))["id"] for i in range(3)]
    first = await conn.call("list_jobs", queue="q", state="ready", limit=2)
    assert set(first) == {"rid", "ok", "jobs", "next", "total"}
    assert first["total"] == 3 and isinstance(first["next"], str)
    assert [tuple(job) for job in first["jobs"]] == [wire.JOB_INFO_FIELDS] * 2
    assert [job["id"] for job in first["jobs"]] == ids[:2]
    assert all(job["state"] == "ready" for job in first["jobs"])
    rest = await conn.call("list_jobs", queue="q", state="ready", cursor=first["next"])
    assert [job["id"] for job in rest["jobs"]] == ids[2:] and rest["next"] is None
    # The cursor is opaque, and its listing's own: another state's is refused.
    refused = await conn.request("list_jobs", queue="q", state="dead", cursor=first["next"])
    assert refused["error"]["code"] == "invalid_argument"
    assert refused["error"]["field"] == "cursor"


async def test_bad_fields_are_named(client: ClientFactory) -> None:
    conn = await client()
    await conn.call("enqueue", queue="q", payload=1)
    for fields, code, field in [
        ({"state": "pending"}, "invalid_argument", "state"),
        ({"state": "ready", "limit": 501}, "invalid_argument", "limit"),
        ({"state": "ready", "cursor": "%%%"}, "invalid_argument", "cursor"),
        ({"state": "ready", "queue": "no such"}, "invalid_argument", "queue"),
        ({"state": "ready", "queue": "nowhere"}, "not_found", "queue"),
    ]:
        reply = await conn.request("list_jobs", **{"queue": "q", **fields})
        assert (reply["error"]["code"], reply["error"]["field"]) == (code, field), fields
    reply = await conn.request("redrive_all", queue="nowhere")
    assert reply["error"]["code"] == "not_found"


@with_config(max_batch=3)
async def test_cancel_batch_answers_each_id_and_is_bounded(client: ClientFactory) -> None:
    conn = await client()
    a = (await conn.call("enqueue", queue="q", payload=1))["id"]
    b = (await conn.call("enqueue", queue="q", payload=2))["id"]
    reply = await conn.call("cancel_batch", ids=[a, "nope", b])
    assert reply["cancelled"] == [True, False, True]
    over = await conn.request("cancel_batch", ids=["1", "2", "3", "4"])
    assert (over["error"]["code"], over["error"]["field"]) == ("too_large", "ids")
    empty = await conn.request("cancel_batch", ids=[])
    assert (empty["error"]["code"], empty["error"]["field"]) == ("invalid_argument", "ids")


async def test_a_processing_page_says_when_each_lease_was_taken(
    client: ClientFactory, scheduler: SteppedScheduler
) -> None:
    # `claimed_at` is the claim's time, which a heartbeat does not move (the deadline
    # does); a job held by no worker of this broker has none.
    publisher, worker = await client(), await client()
    job_id = (await publisher.call("enqueue", queue="q", payload=1, visibility_timeout_s=60))["id"]
    await worker.call("subscribe", worker_id="w", queues=["q"], prefetch=1)
    (pushed,) = await worker.jobs(1)
    claimed = pushed["deadline"] - 60
    (listed,) = (await publisher.call("list_jobs", queue="q", state="processing"))["jobs"]
    assert listed["id"] == job_id
    assert listed["claimed_at"] == claimed
    scheduler.advance(10)
    await worker.call("heartbeat", id=job_id, lease=pushed["lease"])
    (again,) = (await publisher.call("list_jobs", queue="q", state="processing"))["jobs"]
    assert again["claimed_at"] == listed["claimed_at"]
    assert again["deadline"] == listed["deadline"] + 10
    # The other states' job objects are get_job's, without it.
    await publisher.call("enqueue", queue="q", payload=2)
    (ready,) = (await publisher.call("list_jobs", queue="q", state="ready"))["jobs"]
    assert "claimed_at" not in ready
