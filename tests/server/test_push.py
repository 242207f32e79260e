"""Pushing jobs to workers: order, flow control, fairness, time, and the worker's reports.

Every test runs a real broker on port 0 and talks to it with raw WebSocket clients.
Nothing here sleeps. A negative ("no job was pushed") is checked with a request round
trip on the worker's own connection: the broker queues a push before the reply to any
request that arrives after the push was decided, so once the reply to a ``ping`` is in,
every push caused by an earlier, answered request is in too. The broker's clock is the
tests' (a ``SteppedScheduler``): it stands still until a test advances it.
"""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.broker.scheduler import SteppedScheduler

from .conftest import BOTH_STORES, ClientFactory, RawClient

pytestmark = BOTH_STORES

# How close to its time a job is looked at before it is due.
STEP = 1e-3


@pytest.fixture
def scheduler() -> SteppedScheduler:
    """The broker's clock, moved by the tests: time never passes by waiting here."""
    return SteppedScheduler()


async def jobs_held_back(worker: RawClient) -> list[dict[str, Any]]:
    """Every job pushed to ``worker`` so far and not yet taken by a test.

    A ``ping`` round trip first, so that every push decided before it has arrived.
    """
    await worker.call("ping")
    held = [job for frame in worker.pushes if frame["push"] == "jobs" for job in frame["jobs"]]
    worker.pushes = [frame for frame in worker.pushes if frame["push"] != "jobs"]
    return held


def claimed_at(job: dict[str, Any]) -> float:
    """When the broker claimed a pushed job, by its clock: the lease began then."""
    return float(job["deadline"] - job["visibility_timeout_s"])


async def enqueue(publisher: RawClient, queue: str, payload: Any, **options: Any) -> str:
    reply = await publisher.call("enqueue", queue=queue, payload=payload, **options)
    return str(reply["id"])


async def test_pushed_job_carries_every_member_and_ack_deletes_it(client: ClientFactory) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["mail"], prefetch=1)
    job_id = await enqueue(publisher, "mail", {"to": "a@b.c"}, priority=7, max_attempts=4)

    [job] = await worker.jobs(1)
    assert job["id"] == job_id
    assert job["queue"] == "mail"
    assert job["payload"] == {"to": "a@b.c"}
    assert job["attempt"] == 1
    assert job["max_attempts"] == 4
    assert job["priority"] == 7
    assert isinstance(job["lease"], str) and job["lease"]
    assert job["visibility_timeout_s"] == 300.0
    info = (await publisher.call("get_job", id=job_id))["job"]
    assert info["state"] == "processing"
    assert info["worker_id"] == "w1"
    assert info["deadline"] == job["deadline"]

    assert (await worker.call("ack", id=job_id, lease=job["lease"]))["landed"] is True
    assert (await publisher.call("get_job", id=job_id))["job"] is None
    # One-shot: the same report again does not land, and is no error.
    assert (await worker.call("ack", id=job_id, lease=job["lease"]))["landed"] is False


async def test_claim_order_priority_then_ready_time_then_fifo(
    client: ClientFactory, scheduler: SteppedScheduler
) -> None:
    publisher = await client()
    # The oldest job gets a later ready time: claimed once, then retried with no delay.
    late = await enqueue(publisher, "q", "late")
    first_worker = await client()
    await first_worker.call("subscribe", worker_id="w0", queues=["q"], prefetch=1)
    [claimed] = await first_worker.jobs(1)
    assert claimed["id"] == late
    low = await enqueue(publisher, "q", "low", priority=-1)
    pair = (
        await publisher.call("enqueue_batch", queue="q", jobs=[{"payload": "a"}, {"payload": "b"}])
    )["ids"]  # one batch: the same ready time, so enqueue order decides
    high = await enqueue(publisher, "q", "high", priority=5)
    assert (await first_worker.call("unsubscribe"))["held"] == 1
    scheduler.advance(1)
    retried = await first_worker.call("retry", id=late, lease=claimed["lease"], delay_s=0)
    assert retried["landed"] is True

    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=10)
    got = await worker.jobs(5)
    assert [job["id"] for job in got] == [high, *pair, late, low]
    assert [job["payload"] for job in got] == ["high", "a", "b", "late", "low"]
    assert got[3]["attempt"] == 2


async def test_subscribe_serves_queues_in_strict_order(client: ClientFactory) -> None:
    publisher = await client()
    b1 = await enqueue(publisher, "b", "b1", priority=100)  # older and more urgent, but later
    a1 = await enqueue(publisher, "a", "a1")
    a2 = await enqueue(publisher, "a", "a2")
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["a", "b"], prefetch=1)
    [job] = await worker.jobs(1)
    assert job["id"] == a1

    # Jobs arriving while the worker is full: "a" still goes first, whatever came first.
    b2 = await enqueue(publisher, "b", "b2")
    a3 = await enqueue(publisher, "a", "a3")
    seen = [job["id"]]
    for _ in range(4):
        await worker.call("ack", id=job["id"], lease=job["lease"])
        [job] = await worker.jobs(1)
        seen.append(job["id"])
    assert seen == [a1, a2, a3, b1, b2]
    assert job["queue"] == "b"


async def test_several_jobs_ride_in_one_frame(client: ClientFactory) -> None:
    publisher = await client()
    ids = (
        await publisher.call("enqueue_batch", queue="q", jobs=[{"payload": i} for i in range(3)])
    )["ids"]
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=8)
    frame = await worker.next_push("jobs")
    assert [job["id"] for job in frame["jobs"]] == ids
    assert len({job["lease"] for job in frame["jobs"]}) == 3


async def test_prefetch_bounds_unfinished_jobs_and_each_report_frees_a_slot(
    client: ClientFactory,
) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=2)
    ids = (
        await publisher.call("enqueue_batch", queue="q", jobs=[{"payload": i} for i in range(5)])
    )["ids"]

    held = await worker.jobs(2)
    assert [job["id"] for job in held] == ids[:2]
    assert await jobs_held_back(worker) == []
    stats = (await publisher.call("stats", queue="q"))["queues"]["q"]
    assert (stats["processing"], stats["ready"]) == (2, 3)

    # ack, retry and fail each free exactly one slot, and the next job goes out at once.
    reports: list[tuple[str, dict[str, Any]]] = [
        ("ack", {}),
        ("retry", {"delay_s": 60}),
        ("fail", {"error": "no"}),
    ]
    for n, (op, extra) in enumerate(reports):
        done = held.pop(0)
        reply = await worker.call(op, id=done["id"], lease=done["lease"], **extra)
        assert reply["landed"] is True
        [pushed] = await worker.jobs(1)
        assert pushed["id"] == ids[2 + n]
        held.append(pushed)
        assert await jobs_held_back(worker) == []
        stats = (await publisher.call("stats", queue="q"))["queues"]["q"]
        assert stats["processing"] == 2

    # Nothing left to hand out (the retried job waits a minute): a free slot stays free.
    done = held.pop(0)
    assert (await worker.call("ack", id=done["id"], lease=done["lease"]))["landed"] is True
    assert await jobs_held_back(worker) == []


async def test_workers_on_one_queue_are_served_round_robin(client: ClientFactory) -> None:
    publisher = await client()
    w1 = await client()
    w2 = await client()
    await w1.call("subscribe", worker_id="w1", queues=["q"], prefetch=10)
    await w2.call("subscribe", worker_id="w2", queues=["q"], prefetch=10)

    # A burst: each worker has room for all of it, yet they share it evenly.
    ids = (
        await publisher.call("enqueue_batch", queue="q", jobs=[{"payload": i} for i in range(10)])
    )["ids"]
    got1 = await w1.jobs(5)
    got2 = await w2.jobs(5)
    assert await jobs_held_back(w1) == []
    assert await jobs_held_back(w2) == []
    assert sorted(job["id"] for job in got1 + got2) == sorted(ids)

    # One job at a time: they alternate, so neither starves.
    owners = []
    for i in range(4):
        job_id = await enqueue(publisher, "q", f"single-{i}")
        owners.append((await publisher.call("get_job", id=job_id))["job"]["worker_id"])
    assert sorted(owners) == ["w1", "w1", "w2", "w2"]
    assert owners[0] != owners[1] and owners[1] != owners[2] and owners[2] != owners[3]
    assert len(await w1.jobs(2)) == 2
    assert len(await w2.jobs(2)) == 2


async def test_a_report_on_another_connection_frees_the_holders_slot(
    client: ClientFactory,
) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=1)
    first = await enqueue(publisher, "q", 1)
    second = await enqueue(publisher, "q", 2)
    [job] = await worker.jobs(1)
    assert job["id"] == first
    # The lease is the credential: a report is accepted on any connection.
    reporter = await client()
    assert (await reporter.call("ack", id=first, lease=job["lease"]))["landed"] is True
    [job] = await worker.jobs(1)
    assert job["id"] == second


async def test_delayed_job_is_pushed_at_its_ready_time(
    client: ClientFactory, scheduler: SteppedScheduler
) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=1)
    job_id = await enqueue(publisher, "q", "later", delay_s=30)
    info = (await publisher.call("get_job", id=job_id))["job"]
    assert info["state"] == "scheduled"
    assert info["ready_at"] == pytest.approx(info["enqueued_at"] + 30)
    scheduler.advance(30 - STEP)
    assert await jobs_held_back(worker) == []  # never early

    scheduler.advance(STEP)
    [job] = await worker.jobs(1)  # and at once when due
    assert job["id"] == job_id
    assert claimed_at(job) == pytest.approx(info["ready_at"])


async def test_retry_with_delay_is_pushed_again_later_as_the_next_attempt(
    client: ClientFactory, scheduler: SteppedScheduler
) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=1)
    job_id = await enqueue(publisher, "q", "flaky")
    [job] = await worker.jobs(1)
    assert job["attempt"] == 1

    reply = await worker.call("retry", id=job_id, lease=job["lease"], error="boom", delay_s=30)
    assert reply["landed"] is True
    info = (await publisher.call("get_job", id=job_id))["job"]
    assert (info["state"], info["last_error"], info["worker_id"]) == ("scheduled", "boom", None)
    assert await jobs_held_back(worker) == []  # not at once

    scheduler.advance(30 - STEP)
    assert await jobs_held_back(worker) == []
    scheduler.advance(STEP)
    [again] = await worker.jobs(1)
    assert again["id"] == job_id
    assert again["attempt"] == 2
    assert again["lease"] != job["lease"]
    assert claimed_at(again) == pytest.approx(info["ready_at"])
    # The old lease is dead; the new one works.
    assert (await worker.call("ack", id=job_id, lease=job["lease"]))["landed"] is False
    assert (await worker.call("ack", id=job_id, lease=again["lease"]))["landed"] is True


async def test_fail_makes_the_job_dead_and_redrive_pushes_it_again(client: ClientFactory) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=1)
    job_id = await enqueue(publisher, "q", {"n": 1})
    plain_id = await enqueue(publisher, "q", {"n": 2})
    [job] = await worker.jobs(1)
    assert (await worker.call("fail", id=job_id, lease=job["lease"], error="bad input"))[
        "landed"
    ] is True
    [plain] = await worker.jobs(1)
    assert (await worker.call("fail", id=plain_id, lease=plain["lease"]))["landed"] is True

    info = (await publisher.call("get_job", id=job_id))["job"]
    assert info["state"] == "dead"
    assert info["last_error"] == "bad input"
    assert info["died_at"] is not None
    assert (info["worker_id"], info["deadline"], info["attempts"]) == (None, None, 1)
    assert (await publisher.call("get_job", id=plain_id))["job"]["last_error"] == "failed"
    assert (await publisher.call("stats", queue="q"))["queues"]["q"]["dead"] == 2
    assert await jobs_held_back(worker) == []  # dead jobs are not handed out

    assert (await publisher.call("redrive", id=job_id))["redriven"] is True
    [again] = await worker.jobs(1)
    assert again["id"] == job_id
    assert again["attempt"] == 1  # attempts start over
    assert again["payload"] == {"n": 1}
    info = (await publisher.call("get_job", id=job_id))["job"]
    assert (info["state"], info["last_error"], info["died_at"]) == ("processing", "bad input", None)
    # Only a dead job can be redriven; asking again is no error.
    assert (await publisher.call("redrive", id=job_id))["redriven"] is False
    assert (await worker.call("ack", id=job_id, lease=again["lease"]))["landed"] is True


async def test_enqueue_batch_stores_every_job_in_order(client: ClientFactory) -> None:
    publisher = await client()
    specs = [{"payload": {"i": i}} for i in range(4)] + [{"payload": "urgent", "priority": 9}]
    ids = (await publisher.call("enqueue_batch", queue="q", jobs=specs))["ids"]
    assert len(ids) == len(set(ids)) == 5
    for i, job_id in enumerate(ids[:4]):
        assert (await publisher.call("get_job", id=job_id))["job"]["payload"] == {"i": i}
    assert (await publisher.call("enqueue_batch", queue="q", jobs=[]))["ids"] == []

    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=5)
    got = await worker.jobs(5)
    assert [job["id"] for job in got] == [ids[4], *ids[:4]]
    assert got[0]["priority"] == 9

    # All or nothing: one bad job stores none of the batch.
    bad = await publisher.request(
        "enqueue_batch", queue="q", jobs=[{"payload": 1}, {"payload": 2, "priority": True}]
    )
    assert bad["ok"] is False
    assert bad["error"]["field"] == "jobs[1].priority"
    assert (await publisher.call("stats", queue="q"))["queues"]["q"]["totals"]["enqueued"] == 5


async def test_unsubscribe_stops_pushes_but_held_jobs_can_be_reported(
    client: ClientFactory,
) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=2)
    await publisher.call("enqueue_batch", queue="q", jobs=[{"payload": i} for i in range(2)])
    held = await worker.jobs(2)

    assert (await worker.call("unsubscribe"))["held"] == 2
    later = await enqueue(publisher, "q", "later")
    assert await jobs_held_back(worker) == []
    assert (await worker.call("ack", id=held[0]["id"], lease=held[0]["lease"]))["landed"] is True
    assert (await worker.call("fail", id=held[1]["id"], lease=held[1]["lease"]))["landed"] is True
    assert await jobs_held_back(worker) == []  # freed slots do not bring new jobs
    assert (await worker.call("unsubscribe"))["held"] == 0  # repeating it is harmless

    other = await client()
    await other.call("subscribe", worker_id="w2", queues=["q"], prefetch=2)
    [job] = await other.jobs(1)
    assert job["id"] == later


async def test_pause_stops_pushes_and_resume_restores_them(client: ClientFactory) -> None:
    admin = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=5)
    running = await enqueue(admin, "q", "running")
    [job] = await worker.jobs(1)
    assert job["id"] == running

    assert (await admin.call("pause", queue="q"))["paused"] is True
    waiting = [await enqueue(admin, "q", i) for i in range(2)]
    assert await jobs_held_back(worker) == []
    stats = (await admin.call("stats", queue="q"))["queues"]["q"]
    assert (stats["paused"], stats["ready"], stats["processing"]) == (True, 2, 1)
    # Pausing stops hand-outs and nothing else: the running job's ack still lands.
    assert (await worker.call("ack", id=running, lease=job["lease"]))["landed"] is True
    assert await jobs_held_back(worker) == []

    assert (await admin.call("resume", queue="q"))["paused"] is False
    got = await worker.jobs(2)
    assert [job["id"] for job in got] == waiting
    assert (await admin.call("stats", queue="q"))["queues"]["q"]["paused"] is False


async def test_a_queue_paused_before_its_first_job_holds_it(client: ClientFactory) -> None:
    admin = await client()
    assert (await admin.call("pause", queue="fresh"))["paused"] is True
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["fresh", "other"], prefetch=2)
    held_back = await enqueue(admin, "fresh", "held")
    other = await enqueue(admin, "other", "goes")
    [job] = await worker.jobs(1)
    assert job["id"] == other  # a paused earlier queue does not block a later one
    assert await jobs_held_back(worker) == []
    await admin.call("resume", queue="fresh")
    [job] = await worker.jobs(1)
    assert job["id"] == held_back


async def test_stats_counts_each_state_and_the_totals(client: ClientFactory) -> None:
    publisher = await client()
    worker = await client()
    await publisher.call("enqueue_batch", queue="s", jobs=[{"payload": i} for i in range(3)])
    await enqueue(publisher, "s", "scheduled", delay_s=60)
    await worker.call("subscribe", worker_id="w1", queues=["s"], prefetch=2)
    first, second = await worker.jobs(2)

    stats = (await publisher.call("stats", queue="s"))["queues"]["s"]
    assert {k: stats[k] for k in ("ready", "scheduled", "processing", "dead", "paused")} == {
        "ready": 1,
        "scheduled": 1,
        "processing": 2,
        "dead": 0,
        "paused": False,
    }
    assert stats["totals"]["enqueued"] == 4

    await worker.call("ack", id=first["id"], lease=first["lease"])
    [third] = await worker.jobs(1)
    await worker.call("fail", id=second["id"], lease=second["lease"])
    await worker.call("retry", id=third["id"], lease=third["lease"], delay_s=60)
    assert (await publisher.call("cancel", id=third["id"]))["cancelled"] is True

    stats = (await publisher.call("stats"))["queues"]["s"]
    assert {k: stats[k] for k in ("ready", "scheduled", "processing", "dead")} == {
        "ready": 0,
        "scheduled": 1,
        "processing": 0,
        "dead": 1,
    }
    assert stats["totals"] == {
        "enqueued": 4,
        "completed": 1,
        "retried": 1,
        "dead": 1,
        "expired": 0,
        "cancelled": 1,
    }
    unknown = await publisher.request("stats", queue="nope")
    assert unknown["error"]["code"] == "not_found"


async def test_cancel_tells_the_holder_and_frees_its_slot(client: ClientFactory) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=1)
    held = await enqueue(publisher, "q", "held")
    queued = await enqueue(publisher, "q", "queued")
    [job] = await worker.jobs(1)
    assert job["id"] == held
    notice_lease = job["lease"]

    assert (await publisher.call("cancel", id=held))["cancelled"] is True
    notice = await worker.next_push("cancelled")
    assert notice["ids"] == [held]
    [job] = await worker.jobs(1)  # the freed slot takes the next job at once
    assert job["id"] == queued
    assert (await publisher.call("get_job", id=held))["job"] is None
    # A report of the cancelled job is not to be sent, but if it is, it is no error.
    assert (await worker.call("ack", id=held, lease=notice_lease))["landed"] is False

    # Cancelling a job nobody holds tells nobody; an unknown id is no error.
    pending = await enqueue(publisher, "q", "pending")
    assert (await publisher.call("cancel", id=pending))["cancelled"] is True
    assert (await publisher.call("cancel", id=pending))["cancelled"] is False
    await worker.call("ping")
    assert [frame for frame in worker.pushes if frame["push"] == "cancelled"] == []
