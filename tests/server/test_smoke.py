"""The shortest path through the broker: enqueue, push, ack."""

from __future__ import annotations

from .conftest import BOTH_STORES, ClientFactory

pytestmark = BOTH_STORES


async def test_enqueue_push_ack(client: ClientFactory) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["emails"], prefetch=4)
    reply = await publisher.call("enqueue", queue="emails", payload={"to": "a@b.c"})
    [job] = await worker.jobs(1)
    assert job["id"] == reply["id"]
    assert job["payload"] == {"to": "a@b.c"}
    assert job["attempt"] == 1
    assert (await worker.call("ack", id=job["id"], lease=job["lease"]))["landed"] is True
    assert (await publisher.call("get_job", id=job["id"]))["job"] is None
