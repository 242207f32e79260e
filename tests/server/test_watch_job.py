"""``progress``, ``watch_job`` and ``unwatch_job`` over the wire (docs/protocol.md;
docs/contract.md PRG-1 to PRG-7): a watcher's pushes in order and then the end, bad input
named with stable codes, a stale lease's progress not landing, one watch per job and
connection, and the broker's coalescing for a watcher that reads slowly (PRG-6): it is
sent only the latest value, never a queue of them. Memory and SQLite stores alike."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conveyor.broker.backend import Claim, Enqueue, LocalBackend, Progress, Report
from conveyor.broker.scheduler import SteppedScheduler
from conveyor.broker.store import MemoryStore
from conveyor.broker.watches import BACKLOG_BYTES, BACKLOG_RETRY_S, Watches
from conveyor.sdk._wire import decode, encode

from .conftest import BOTH_STORES, ClientFactory, RawClient

T0 = 1_800_000_000.0


async def _claim(c: RawClient, queue: str = "q") -> dict[str, Any]:
    await c.call("subscribe", worker_id="w", queues=[queue], prefetch=1)
    (job,) = await c.jobs(1)
    return job


async def _progress(c: RawClient, job: dict[str, Any], value: Any) -> list[bool]:
    reply = await c.call(
        "progress", items=[{"id": job["id"], "lease": job["lease"], "progress": value}]
    )
    landed: list[bool] = reply["landed"]
    return landed


@BOTH_STORES
async def test_a_watcher_is_pushed_progress_a_retry_and_the_end_prg_5(
    client: ClientFactory,
) -> None:
    publisher, worker = await client(), await client()
    job_id = (await publisher.call("enqueue", queue="q", payload={"n": 1}))["id"]
    reply = await publisher.call("watch_job", id=job_id)
    assert reply["watching"] is True and reply["state"] == "ready"
    assert reply["attempts"] == 0 and reply["progress"] is None
    job = await _claim(worker)
    assert await _progress(worker, job, {"value": 0.5, "message": "half"}) == [True]
    push = await publisher.next_push("job_event")
    assert push == {
        "push": "job_event",
        "id": job_id,
        "event": "progress",
        "attempt": 1,
        "progress": {"value": 0.5, "message": "half"},
    }
    await worker.call("retry", id=job_id, lease=job["lease"], error="again", delay_s=0)
    push = await publisher.next_push("job_event")
    assert push == {
        "push": "job_event",
        "id": job_id,
        "event": "retry",
        "attempt": 1,
        "reason": "failed",
        "error": "again",
    }
    (again,) = await worker.jobs(1)
    await worker.call("ack", id=job_id, lease=again["lease"], result=[1, 2])
    push = await publisher.next_push("job_event")
    assert push == {
        "push": "job_event",
        "event": "end",
        "id": job_id,
        "state": "completed",
        "result": [1, 2],
    }
    # The watch is over: this connection may watch the job again (it is unknown now).
    reply = await publisher.call("watch_job", id=job_id)
    assert reply == {"rid": reply["rid"], "ok": True, "watching": False, "id": job_id,
                     "state": "unknown"}  # fmt: skip


@BOTH_STORES
async def test_progress_of_a_stale_lease_does_not_land_prg_1(client: ClientFactory) -> None:
    worker = await client()
    await worker.call("enqueue", queue="q", payload=None)
    job = await _claim(worker)
    assert await _progress(worker, {**job, "lease": "not-the-lease"}, 0.5) == [False]
    assert await _progress(worker, {**job, "id": "no-such-job"}, 0.5) == [False]
    info = (await worker.call("get_job", id=job["id"]))["job"]
    assert info["progress"] is None


@BOTH_STORES
@pytest.mark.parametrize(
    ("items", "code", "field"),
    [
        ([{"id": "x", "lease": "y", "progress": "x" * 70_000}], "too_large", "items[0].progress"),
        ([{"id": "x", "lease": "y"}], "invalid_argument", "items[0].progress"),
        ([{"id": 5, "lease": "y", "progress": 1}], "invalid_argument", "items[0].id"),
        ("nope", "invalid_argument", "items"),
    ],
)
async def test_progress_refuses_bad_input_naming_the_field_prg_3(
    client: ClientFactory, items: Any, code: str, field: str
) -> None:
    c = await client()
    reply = await c.request("progress", items=items)
    assert reply["ok"] is False
    assert (reply["error"]["code"], reply["error"]["field"]) == (code, field)


@BOTH_STORES
async def test_one_watch_per_job_and_connection_and_unwatch_ends_it(
    client: ClientFactory,
) -> None:
    publisher, worker = await client(), await client()
    job_id = (await publisher.call("enqueue", queue="q", payload=None))["id"]
    await publisher.call("watch_job", id=job_id)
    again = await publisher.request("watch_job", id=job_id)
    assert again["ok"] is False and again["error"]["code"] == "conflict"
    assert again["error"]["field"] == "id"
    assert (await publisher.call("unwatch_job", id=job_id))["watching"] is True
    assert (await publisher.call("unwatch_job", id=job_id))["watching"] is False
    job = await _claim(worker)
    await _progress(worker, job, 0.1)
    await worker.call("ack", id=job_id, lease=job["lease"])
    await publisher.call("ping")  # (frames of a connection come in order)
    assert publisher.pushes == []


async def test_a_slow_watcher_gets_only_the_latest_progress_prg_6() -> None:
    scheduler = SteppedScheduler(start=T0)
    backend = LocalBackend(MemoryStore(), scheduler, max_payload_bytes=1 << 20)
    replies: list[dict[str, Any]] = []
    pushed: list[dict[str, Any]] = []
    behind = [BACKLOG_BYTES + 1]  # bytes waiting unsent to the peer
    watches = Watches(backend, scheduler, replies.append, pushed.append, lambda: behind[0])
    (job_id,) = await backend.enqueue([Enqueue("q", None)])
    watches.start(1, job_id)
    assert replies[0]["watching"] is True
    (claimed,) = (await backend.claim([Claim("w", ("q",), 1)]))[0]
    for i in range(10_000):
        await backend.progress([Progress(job_id, claimed.lease, str(i).encode())])
    await asyncio.sleep(0)  # (the loop turn the flush was set for)
    assert pushed == []  # the peer is behind: nothing more is queued for it
    scheduler.advance(BACKLOG_RETRY_S)
    await asyncio.sleep(0)
    assert pushed == []  # still behind
    behind[0] = 0
    scheduler.advance(BACKLOG_RETRY_S)
    await asyncio.sleep(0)
    assert [decode(encode(p))["progress"] for p in pushed] == [9999]
    # A retry sends the job's waiting progress first: the order is kept.
    pushed.clear()
    behind[0] = BACKLOG_BYTES + 1
    await backend.progress([Progress(job_id, claimed.lease, b"10000")])
    await backend.report([Report(job_id, claimed.lease, retry=True, delay_s=0)])
    assert [p["event"] for p in pushed] == ["progress", "retry"]
    watches.close()
    await backend.close()


@BOTH_STORES
async def test_a_watch_without_rid_is_not_answered_but_pushes_come(client: ClientFactory) -> None:
    """Fire-and-forget (docs/protocol.md §3): a ``watch_job`` without ``rid`` gets no reply
    when it succeeds, and its job's pushes still come; one of an ended job is silent."""
    publisher, worker = await client(), await client()
    job_id = (await publisher.call("enqueue", queue="q", payload=1))["id"]
    await publisher.send({"op": "watch_job", "id": job_id})
    await publisher.send({"op": "watch_job", "id": "no-such-job"})
    job = await _claim(worker)
    await worker.call("ack", id=job_id, lease=job["lease"], result="done")
    await publisher.send({"op": "ping", "rid": "last"})
    frames: list[dict[str, Any]] = []  # every frame up to the ping's reply and the end
    while not any(f.get("rid") == "last" for f in frames) or not any(
        f.get("push") == "job_event" for f in frames
    ):
        frames.append(await publisher.recv())
    [end] = [f for f in frames if f.get("push") == "job_event"]
    assert end["event"] == "end" and end["state"] == "completed" and end["result"] == "done"
    assert [f.get("rid") for f in frames if "push" not in f] == ["last"], frames
