"""Leases: lapsing, heartbeats, disconnects, the grace and re-attaching, batch reports.

Real broker on port 0, raw clients, and the broker's clock in the test's hands (a
``SteppedScheduler``): time passes when a test advances it, never by waiting. "Nothing
was pushed" is checked after a request round trip, which every earlier push precedes.
The dispatcher's own instants are also tested alone, in tests/dispatch/.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from conveyor.broker.connection import Connection
from conveyor.broker.scheduler import SteppedScheduler

from .conftest import BOTH_STORES, ClientFactory, RawClient, with_config

pytestmark = BOTH_STORES

EPS = 1e-3


@pytest.fixture
def scheduler() -> SteppedScheduler:
    """The broker's clock, moved by the tests."""
    return SteppedScheduler()


@pytest.fixture
def ended(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncio.Queue[Connection]]:
    """Each connection the broker is done with (its subscription gone), as it ends."""
    done: asyncio.Queue[Connection] = asyncio.Queue()
    release = Connection.release

    def noting(conn: Connection) -> None:
        release(conn)
        done.put_nowait(conn)

    monkeypatch.setattr(Connection, "release", noting)
    yield done


def claimed_at(job: dict[str, Any]) -> float:
    """When the broker claimed a pushed job, by its clock: the lease began then."""
    return float(job["deadline"] - job["visibility_timeout_s"])


async def jobs_held_back(worker: RawClient) -> list[dict[str, Any]]:
    """Jobs pushed to ``worker`` and not yet taken, after a round trip as a barrier."""
    await worker.call("ping")
    held = [job for frame in worker.pushes if frame["push"] == "jobs" for job in frame["jobs"]]
    worker.pushes = [frame for frame in worker.pushes if frame["push"] != "jobs"]
    return held


@pytest.mark.parametrize("late_on", ["its own connection", "another connection"])
async def test_a_lapsed_lease_goes_to_another_worker_and_the_late_ack_does_not_land(
    client: ClientFactory, scheduler: SteppedScheduler, late_on: str
) -> None:
    publisher = await client()
    w1 = await client()
    await w1.call("subscribe", worker_id="w1", queues=["q"], prefetch=1)
    job_id = (await publisher.call("enqueue", queue="q", payload="slow", visibility_timeout_s=30))[
        "id"
    ]
    [first] = await w1.jobs(1)
    assert first["attempt"] == 1
    w2 = await client()
    await w2.call("subscribe", worker_id="w2", queues=["q"], prefetch=1)
    scheduler.advance(30 - EPS)
    assert await jobs_held_back(w2) == []  # not before the lease runs out

    scheduler.advance(EPS)
    [second] = await w2.jobs(1)
    assert second["id"] == job_id
    assert second["attempt"] == 2
    assert second["lease"] != first["lease"]
    assert claimed_at(second) == pytest.approx(first["deadline"])  # at its deadline
    info = (await publisher.call("get_job", id=job_id))["job"]
    assert (info["worker_id"], info["attempts"]) == ("w2", 2)

    # Both workers are full: w2 holds the job, w1 still holds its lapsed lease's slot.
    waiting = (await publisher.call("enqueue", queue="q", payload="next"))["id"]
    assert await jobs_held_back(w1) == []
    assert await jobs_held_back(w2) == []

    # The first worker finishes late: no error, it just does not land, and its slot frees,
    # whichever connection the report comes on (the lease is the credential).
    reporter = w1 if late_on == "its own connection" else await client()
    late = await reporter.request("ack", id=job_id, lease=first["lease"])
    assert late == {"rid": late["rid"], "ok": True, "landed": False}
    assert (await reporter.call("heartbeat", id=job_id, lease=first["lease"]))["landed"] is False
    [job] = await w1.jobs(1)
    assert job["id"] == waiting
    # The current holder's ack lands.
    assert (await w2.call("ack", id=job_id, lease=second["lease"]))["landed"] is True


async def test_heartbeats_keep_a_job_past_its_visibility_timeout(
    client: ClientFactory, scheduler: SteppedScheduler
) -> None:
    publisher = await client()
    w1 = await client()
    await w1.call("subscribe", worker_id="w1", queues=["q"], prefetch=1)
    job_id = (await publisher.call("enqueue", queue="q", payload="long", visibility_timeout_s=30))[
        "id"
    ]
    [job] = await w1.jobs(1)
    w2 = await client()
    await w2.call("subscribe", worker_id="w2", queues=["q"], prefetch=1)

    # Heartbeat every third of the lease until well past the first deadline; the idle
    # worker must not get the job meanwhile.
    for _ in range(7):
        scheduler.advance(10)
        reply = await w1.call("heartbeat", id=job_id, lease=job["lease"])
        assert reply["landed"] is True
        info = (await publisher.call("get_job", id=job_id))["job"]
        assert info["deadline"] == pytest.approx(scheduler.now() + 30)  # a reset, not a sum
        assert await jobs_held_back(w2) == []
    assert scheduler.now() > job["deadline"] + 30

    info = (await publisher.call("get_job", id=job_id))["job"]
    assert (info["state"], info["worker_id"], info["attempts"]) == ("processing", "w1", 1)
    assert (await w1.call("ack", id=job_id, lease=job["lease"]))["landed"] is True


async def test_disconnect_without_grace_hands_the_job_on_at_once(client: ClientFactory) -> None:
    publisher = await client()
    w1 = await client()
    w2 = await client()
    await w1.call("subscribe", worker_id="w1", queues=["q"], prefetch=1)
    job_id = (await publisher.call("enqueue", queue="q", payload="x"))["id"]
    [first] = await w1.jobs(1)
    await w2.call("subscribe", worker_id="w2", queues=["q"], prefetch=1)
    assert await jobs_held_back(w2) == []

    await w1.ws.close()
    # The lease lasts 300 s and the clock stands still: only the disconnect hands it on.
    [second] = await w2.jobs(1)
    assert second["id"] == job_id
    assert second["attempt"] == 2
    assert second["lease"] != first["lease"]
    assert (await w2.call("ack", id=job_id, lease=second["lease"]))["landed"] is True


@with_config(disconnect_grace_s=5.0)
async def test_after_the_grace_a_dropped_workers_job_goes_to_another(
    client: ClientFactory, scheduler: SteppedScheduler, ended: asyncio.Queue[Connection]
) -> None:
    publisher = await client()
    w1 = await client()
    w2 = await client()
    await w1.call("subscribe", worker_id="w1", queues=["q"], prefetch=1)
    job_id = (await publisher.call("enqueue", queue="q", payload="x"))["id"]
    [first] = await w1.jobs(1)
    await w2.call("subscribe", worker_id="w2", queues=["q"], prefetch=1)

    await w1.ws.close()
    await asyncio.wait_for(ended.get(), 5)  # the broker saw it go
    scheduler.advance(5.0 - EPS)
    assert await jobs_held_back(w2) == []  # kept for w1 during the grace
    scheduler.advance(EPS)
    [second] = await w2.jobs(1)
    assert second["id"] == job_id
    assert second["attempt"] == 2  # the dropped attempt stays used
    assert second["lease"] != first["lease"]
    assert (await w2.call("ack", id=job_id, lease=second["lease"]))["landed"] is True


@with_config(disconnect_grace_s=5.0)
async def test_a_worker_reconnecting_within_the_grace_reattaches_its_jobs(
    client: ClientFactory, scheduler: SteppedScheduler, ended: asyncio.Queue[Connection]
) -> None:
    publisher = await client()
    w1 = await client()
    await w1.call("subscribe", worker_id="w1", queues=["q"], prefetch=2)
    ids = (await publisher.call("enqueue_batch", queue="q", jobs=[{"payload": 1}, {"payload": 2}]))[
        "ids"
    ]
    held = await w1.jobs(2)
    leases = [{"id": job["id"], "lease": job["lease"]} for job in held]

    await w1.ws.close()
    await asyncio.wait_for(ended.get(), 5)
    # Another worker cannot take the jobs over by presenting their leases.
    w2 = await client()
    reply = await w2.call("subscribe", worker_id="w2", queues=["q"], prefetch=1, leases=leases)
    assert reply["reattached"] == []
    scheduler.advance(5.0 - EPS)
    assert await jobs_held_back(w2) == []  # nor does it get them during the grace

    back = await client()
    reply = await back.call(
        "subscribe",
        worker_id="w1",
        queues=["q"],
        prefetch=2,
        leases=[*leases, {"id": "no-such-job", "lease": "nope"}],
    )
    assert sorted(reply["reattached"]) == sorted(ids)
    info = (await publisher.call("get_job", id=ids[0]))["job"]
    assert (info["worker_id"], info["attempts"]) == ("w1", 1)
    # The re-attached jobs fill the new connection's slots: nothing new comes.
    extra = (await publisher.call("enqueue", queue="q", payload="extra"))["id"]
    assert await jobs_held_back(back) == []
    [job] = await w2.jobs(1)
    assert job["id"] == extra

    # The jobs keep their leases: reports land, and each frees a slot as usual.
    assert (await back.call("ack", id=ids[0], lease=held[0]["lease"]))["landed"] is True
    assert (await back.call("heartbeat", id=ids[1], lease=held[1]["lease"]))["landed"] is True
    assert (await back.call("ack", id=ids[1], lease=held[1]["lease"]))["landed"] is True
    assert (await publisher.call("get_job", id=ids[0]))["job"] is None
    assert (await publisher.call("get_job", id=ids[1]))["job"] is None
    another = (await publisher.call("enqueue", queue="q", payload="another"))["id"]
    [job] = await back.jobs(1)  # w2 is full with "extra"
    assert job["id"] == another


async def test_ack_batch_and_heartbeat_batch_count_what_landed(client: ClientFactory) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=3)
    ids = (
        await publisher.call("enqueue_batch", queue="q", jobs=[{"payload": i} for i in range(5)])
    )["ids"]
    a, b, c = await worker.jobs(3)
    item = {"id": a["id"], "lease": a["lease"]}

    beats = await worker.call(
        "heartbeat_batch",
        items=[
            item,
            {"id": b["id"], "lease": b["lease"]},
            {"id": c["id"], "lease": "not-its-lease"},
            {"id": "no-such-job", "lease": a["lease"]},
        ],
    )
    assert beats["landed"] == [True, True, False, False]
    assert (await worker.call("heartbeat_batch", items=[]))["landed"] == []

    acked = await worker.call(
        "ack_batch",
        items=[
            item,
            {"id": b["id"], "lease": b["lease"]},
            {"id": c["id"], "lease": "not-its-lease"},
            {"id": "no-such-job", "lease": "nope"},
        ],
    )
    assert acked["landed"] == [True, True, False, False]
    assert (await publisher.call("get_job", id=a["id"]))["job"] is None
    assert (await publisher.call("get_job", id=c["id"]))["job"]["state"] == "processing"
    # The two acked jobs' slots are free: the two remaining jobs come.
    got = await worker.jobs(2)
    assert [job["id"] for job in got] == ids[3:]
    # Again: an entry already acked does not land, and is no error.
    assert (await worker.call("ack_batch", items=[item]))["landed"] == [False]
    assert (await worker.call("ack_batch", items=[]))["landed"] == []
