"""How a worker's free window is cut into ``jobs`` frames.

The memory store pushes a full window in frames of at most half the prefetch, so that a
worker acking each frame as it finishes it has the other half to work on while the
broker refills. A durable store pushes the whole window in one frame: each frame costs a
commit, and a refill's push leaves before its commit is written (the claim log), so the
worker is busy while the broker writes anyway.
"""

from __future__ import annotations

import pytest

from .conftest import ClientFactory, RawClient


async def subscribed_to_twenty(client: ClientFactory) -> tuple[RawClient, list[str]]:
    """Twenty jobs queued, then a worker subscribed with prefetch 7: the worker and the
    jobs' ids, in queue order."""
    publisher = await client()
    ids: list[str] = (
        await publisher.call("enqueue_batch", queue="q", jobs=[{"payload": i} for i in range(20)])
    )["ids"]
    worker = await client()
    await worker.call("subscribe", worker_id="w1", queues=["q"], prefetch=7)
    return worker, ids


@pytest.mark.parametrize("store_kind", ["memory"])
async def test_a_full_window_comes_in_frames_of_at_most_half_the_prefetch(
    client: ClientFactory,
) -> None:
    worker, ids = await subscribed_to_twenty(client)
    frames = [await worker.next_push("jobs") for _ in range(2)]
    # Seven free slots at once: four jobs (7 / 2, rounded up), then three, in order.
    assert [len(frame["jobs"]) for frame in frames] == [4, 3]
    assert [job["id"] for frame in frames for job in frame["jobs"]] == ids[:7]
    # Acking the first frame refills exactly those four slots.
    items = [{"id": job["id"], "lease": job["lease"]} for job in frames[0]["jobs"]]
    assert (await worker.call("ack_batch", items=items))["landed"] == [True] * 4
    refill = await worker.next_push("jobs")
    assert [job["id"] for job in refill["jobs"]] == ids[7:11]


@pytest.mark.parametrize("store_kind", ["sqlite"])
@pytest.mark.parametrize("config_changes", [{"sync": "full"}, {"sync": "normal"}])
async def test_with_a_durable_store_a_full_window_comes_in_one_frame(
    client: ClientFactory,
) -> None:
    # Every frame costs a commit, and a refill's push leaves before its commit is written
    # (the claim log): the whole window rides one frame and one commit.
    worker, ids = await subscribed_to_twenty(client)
    frame = await worker.next_push("jobs")
    assert [job["id"] for job in frame["jobs"]] == ids[:7]
    items = [{"id": job["id"], "lease": job["lease"]} for job in frame["jobs"][:5]]
    assert (await worker.call("ack_batch", items=items))["landed"] == [True] * 5
    refill = await worker.next_push("jobs")
    assert [job["id"] for job in refill["jobs"]] == ids[7:12]
