"""The ``wait`` op and results on ``ack``/``ack_batch`` over the wire (docs/protocol.md):
bad input named with codes, a wait answered when its job ends or when its time is up
(on a clock the test moves), replies that overtake a wait, the per-connection cap, and
waits dropped with their connection. Memory and SQLite stores alike."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conveyor.broker.engine import QueueOpts
from conveyor.broker.scheduler import SteppedScheduler
from conveyor.broker.server import Broker
from conveyor.broker.store import StoreError
from conveyor.broker.waits import Waits

from .conftest import BOTH_STORES, WAIT, ClientFactory, RawClient, with_config

pytestmark = BOTH_STORES

T0 = 1_800_000_000.0


@pytest.fixture
def scheduler() -> SteppedScheduler:
    return SteppedScheduler(start=T0)


async def _enqueue(c: RawClient, payload: Any = None, queue: str = "q") -> str:
    job_id: str = (await c.call("enqueue", queue=queue, payload=payload or {"n": 1}))["id"]
    return job_id


async def _claim(c: RawClient, queue: str = "q") -> dict[str, Any]:
    await c.call("subscribe", worker_id="w", queues=[queue], prefetch=1)
    (job,) = await c.jobs(1)
    return job


def _waits(broker: Broker) -> int:
    return sum(len(conn.waits) for conn in broker.connections)


async def _handled(c: RawClient) -> None:
    """Every frame ``c`` sent so far is handled (a connection handles frames in order, and
    a wait is in place once its frame is handled)."""
    await c.call("ping")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"id": 5, "timeout_s": 1}, "id"),
        ({"timeout_s": 1}, "id"),
        ({"id": "x"}, "timeout_s"),
        ({"id": "x", "timeout_s": "soon"}, "timeout_s"),
        ({"id": "x", "timeout_s": -1}, "timeout_s"),
        ({"id": "x", "timeout_s": 3601}, "timeout_s"),
        ({"id": "x", "timeout_s": True}, "timeout_s"),
    ],
)
async def test_wait_refuses_bad_fields(
    client: ClientFactory, fields: dict[str, Any], field: str
) -> None:
    c = await client()
    reply = await c.request("wait", **fields)
    assert reply["ok"] is False
    assert reply["error"]["code"] == "invalid_argument"
    assert reply["error"]["field"] == field
    assert reply["error"]["message"].startswith(f"{field}:")


async def test_wait_for_an_unknown_job_answers_unknown(client: ClientFactory) -> None:
    c = await client()
    reply = await c.call("wait", id="no-such-job", timeout_s=30)
    assert reply["state"] == "unknown" and reply["id"] == "no-such-job"


async def test_ack_result_reaches_a_waiter(client: ClientFactory, broker: Broker) -> None:
    publisher, worker = await client(), await client()
    job_id = await _enqueue(publisher)
    await publisher.send({"op": "wait", "rid": "w1", "id": job_id, "timeout_s": 60})
    await _handled(publisher)
    assert _waits(broker) == 1
    job = await _claim(worker)
    result = {"sum": [1, 2, 3], "text": "<b>ok</b>"}
    acked = await worker.call("ack", id=job_id, lease=job["lease"], result=result)
    assert acked["landed"] is True
    reply = await publisher.reply("w1")
    assert reply == {"rid": "w1", "ok": True, "id": job_id, "state": "completed", "result": result}
    assert _waits(broker) == 0


async def test_ack_batch_results_and_none(client: ClientFactory, broker: Broker) -> None:
    publisher, worker = await client(), await client()
    ids = [await _enqueue(publisher, {"n": n}) for n in range(3)]
    for i, job_id in enumerate(ids):
        await publisher.send({"op": "wait", "rid": i, "id": job_id, "timeout_s": 60})
    await _handled(publisher)
    assert _waits(broker) == 3
    await worker.call("subscribe", worker_id="w", queues=["q"], prefetch=3)
    jobs = {job["id"]: job for job in await worker.jobs(3)}
    items = [
        {"id": ids[0], "lease": jobs[ids[0]]["lease"], "result": 0},
        {"id": ids[1], "lease": jobs[ids[1]]["lease"]},
        {"id": ids[2], "lease": jobs[ids[2]]["lease"], "result": None},
    ]
    assert (await worker.call("ack_batch", items=items))["landed"] == [True] * 3
    replies = [await publisher.reply(i) for i in range(3)]
    assert [r["state"] for r in replies] == ["completed"] * 3
    assert [r["result"] for r in replies] == [0, None, None]


@with_config(max_payload_bytes=64)
async def test_oversized_result_is_refused_and_not_acked(client: ClientFactory) -> None:
    publisher, worker = await client(), await client()
    job_id = await _enqueue(publisher)
    job = await _claim(worker)
    reply = await worker.request("ack", id=job_id, lease=job["lease"], result="x" * 100)
    assert reply["ok"] is False
    assert reply["error"]["code"] == "too_large"
    assert reply["error"]["field"] == "result"
    assert "102 bytes" in reply["error"]["message"] and "64" in reply["error"]["message"]
    batch = await worker.request(
        "ack_batch", items=[{"id": job_id, "lease": job["lease"], "result": ["y" * 80]}]
    )
    assert batch["error"]["code"] == "too_large"
    assert batch["error"]["field"] == "items[0].result"
    still = (await publisher.call("get_job", id=job_id))["job"]
    assert still["state"] == "processing"


async def test_wait_times_out_with_the_state_and_drops_the_waiter(
    client: ClientFactory, broker: Broker, scheduler: SteppedScheduler
) -> None:
    c = await client()
    job_id = await _enqueue(c)
    await c.send({"op": "wait", "rid": 1, "id": job_id, "timeout_s": 30})
    await _handled(c)
    assert _waits(broker) == 1
    scheduler.advance(29)
    assert _waits(broker) == 1
    scheduler.advance(1)
    reply = await c.reply(1)
    assert reply == {"rid": 1, "ok": True, "id": job_id, "state": "pending"}
    assert _waits(broker) == 0
    worker = await client()
    await _claim(worker)
    await c.send({"op": "wait", "rid": 2, "id": job_id, "timeout_s": 5})
    await _handled(c)
    assert _waits(broker) == 1
    scheduler.advance(5)
    assert (await c.reply(2))["state"] == "processing"


async def test_zero_timeout_answers_at_once(client: ClientFactory) -> None:
    c = await client()
    job_id = await _enqueue(c)
    assert (await c.call("wait", id=job_id, timeout_s=0))["state"] == "pending"


async def test_later_replies_overtake_a_wait(client: ClientFactory, broker: Broker) -> None:
    c = await client()
    job_id = await _enqueue(c)
    await c.send({"op": "wait", "rid": "long", "id": job_id, "timeout_s": 3600})
    for n in range(3):
        assert (await c.call("ping"))["ok"] is True
        await _enqueue(c, {"n": n})
    assert (await c.call("get_job", id=job_id))["job"]["state"] == "ready"
    assert _waits(broker) == 1
    await c.call("cancel", id=job_id)
    reply = await c.reply("long")
    assert reply["state"] == "cancelled" and reply["id"] == job_id


async def test_dead_job_answers_its_error(client: ClientFactory) -> None:
    publisher, worker = await client(), await client()
    job_id = await _enqueue(publisher)
    await publisher.send({"op": "wait", "rid": 9, "id": job_id, "timeout_s": 60})
    job = await _claim(worker)
    await worker.call("fail", id=job_id, lease=job["lease"], error="no such user")
    reply = await publisher.reply(9)
    assert reply["state"] == "dead" and reply["error"] == "no such user"
    # Dead jobs are kept: a wait after the death answers at once.
    again = await publisher.call("wait", id=job_id, timeout_s=60)
    assert again["state"] == "dead" and again["error"] == "no such user"


async def test_the_cap_on_waits_per_connection(
    client: ClientFactory, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Waits, "limit", 2)
    c = await client()
    job_id = await _enqueue(c)
    await c.send({"op": "wait", "rid": 1, "id": job_id, "timeout_s": 60})
    await c.send({"op": "wait", "rid": 2, "id": job_id, "timeout_s": 60})
    refused = await c.request("wait", id=job_id, timeout_s=60)
    assert refused["ok"] is False
    assert refused["error"]["code"] == "limit_exceeded"
    assert "max_waits 2" in refused["error"]["message"]
    other = await client()  # the cap is per connection
    await other.send({"op": "wait", "rid": 1, "id": job_id, "timeout_s": 60})
    await _handled(other)
    assert _waits(broker) == 3


async def test_waits_are_dropped_with_their_connection(
    client: ClientFactory,
    broker: Broker,
    scheduler: SteppedScheduler,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed: asyncio.Queue[Waits] = asyncio.Queue()
    close = Waits.close

    def closing(self: Waits) -> None:
        close(self)
        closed.put_nowait(self)

    monkeypatch.setattr(Waits, "close", closing)
    c = await client()
    ids = [await _enqueue(c, {"n": n}) for n in range(3)]
    for i, job_id in enumerate(ids):
        await c.send({"op": "wait", "rid": i, "id": job_id, "timeout_s": 60})
    await _handled(c)
    [conn] = [conn for conn in broker.connections if len(conn.waits) == 3]
    await c.ws.close()
    assert await asyncio.wait_for(closed.get(), WAIT) is conn.waits
    assert len(conn.waits) == 0
    scheduler.advance(60)  # the dropped waits' timers were cancelled: nothing runs
    other = await client()
    await other.call("cancel", id=ids[0])  # nobody follows it any more: nothing is sent
    assert (await other.call("ping"))["ok"] is True


async def test_retained_result_is_listed_and_waited_for_later(
    client: ClientFactory, broker: Broker
) -> None:
    await broker.backend.set_queue("kept", QueueOpts(completed_retention_s=3600.0))
    publisher, worker = await client(), await client()
    job_id = await _enqueue(publisher, queue="kept")
    job = await _claim(worker, "kept")
    await worker.call("ack", id=job_id, lease=job["lease"], result={"pages": 12})
    reply = await publisher.call("wait", id=job_id, timeout_s=60)
    assert reply["state"] == "completed" and reply["result"] == {"pages": 12}
    info = (await publisher.call("get_job", id=job_id))["job"]
    assert info["state"] == "completed" and info["result"] == {"pages": 12}
    assert info["completed_at"] is not None
    page = await publisher.call("list_jobs", queue="kept", state="completed")
    assert [j["id"] for j in page["jobs"]] == [job_id]
    assert page["jobs"][0]["result"] == {"pages": 12}


async def test_a_table_that_cannot_follow_answers_unavailable_and_keeps_no_wait(
    client: ClientFactory, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(ids: Any, on_finished: Any) -> Any:
        raise StoreError("the database is unreachable")

    c = await client()
    job_id = await _enqueue(c)
    monkeypatch.setattr(broker.backend, "follow", broken)
    reply = await c.request("wait", id=job_id, timeout_s=30)
    assert reply["ok"] is False and reply["error"]["code"] == "unavailable"
    assert _waits(broker) == 0
