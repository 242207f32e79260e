"""Flow control through the SDK as users run it (docs/contract.md, FLW-1 to FLW-8):
``Client.set_limits``, ``enqueue(partition=...)``, workers with handlers, and
``RateLimited`` raised from a handler, against a real broker."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from conveyor.broker.config import Config
from conveyor.broker.engine import Limits
from conveyor.broker.server import Broker
from conveyor.sdk import Client, InvalidArgument, Job, RateLimited, Worker

from .conftest import WAIT, Probe, running, with_config


def make_worker(broker: Broker, queue: str, **kwargs: Any) -> Worker:
    kwargs.setdefault("shutdown_timeout_s", 1.0)
    return Worker(broker.url, queues=[queue], **kwargs)


class Running:
    """What the handlers run at each instant: globally and per partition key, with the
    highest counts seen. A handler runs only inside its lease (it starts after its claim
    and ends before its ack is sent), so these counts never exceed the leases held."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.per_key: Counter[str] = Counter()
        self.peak_per_key: Counter[str] = Counter()
        self.order: list[str] = []  # the partition of each job, as handlers started

    def start(self, key: str) -> None:
        self.order.append(key)
        self.now += 1
        self.peak = max(self.peak, self.now)
        self.per_key[key] += 1
        self.peak_per_key[key] = max(self.peak_per_key[key], self.per_key[key])

    def end(self, key: str) -> None:
        self.now -= 1
        self.per_key[key] -= 1


async def test_a_thousand_jobs_over_fifty_keys_hold_both_limits_at_every_instant(
    broker: Broker, client: Client
) -> None:
    await client.set_limits("tenants", concurrency=20, partition_concurrency=2)
    keys = [f"tenant-{i}" for i in range(50)]
    ids = []
    for i in range(1000):
        ids.append(await client.enqueue("tenants", {"i": i}, partition=keys[i % 50]))
    seen = Running()
    done = asyncio.Event()
    workers = [make_worker(broker, "tenants", prefetch=16) for _ in range(3)]
    for worker in workers:

        @worker.handler("tenants")
        async def handle(job: Job) -> None:
            assert job.partition is not None
            seen.start(job.partition)
            await asyncio.sleep(0.002)
            seen.end(job.partition)
            if len(seen.order) == 1000:
                done.set()

    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        await asyncio.wait_for(done.wait(), 60)
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks)
    assert len(seen.order) == 1000 and Counter(seen.order) == Counter({k: 20 for k in keys})
    assert seen.peak <= 20
    assert max(seen.peak_per_key.values()) <= 2
    # The limits were what held the work back, not a lack of workers: 48 slots of
    # prefetch stood ready, and the global limit was reached.
    assert seen.peak == 20
    stats = (await client.stats("tenants"))["tenants"]
    assert stats["processing"] == stats["ready"] == stats["limited"] == 0


async def test_one_key_with_one_job_starts_among_the_first_pushes_after_900_of_another(
    broker: Broker, client: Client
) -> None:
    await client.set_limits("fair", concurrency=2)
    await client.enqueue_many("fair", [{"i": i} for i in range(900)], partition="big")
    await client.enqueue("fair", {"i": "small"}, partition="small")
    seen = Running()
    small_started = asyncio.Event()
    worker = make_worker(broker, "fair", prefetch=10)

    @worker.handler("fair")
    async def handle(job: Job) -> None:
        assert job.partition is not None
        seen.start(job.partition)
        if job.partition == "small":
            small_started.set()
        seen.end(job.partition)

    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(small_started.wait(), WAIT)
    finally:
        worker.stop()
        await task
    assert seen.order.index("small") < 3, seen.order[:5]


async def test_rate_limited_holds_the_key_and_gives_the_attempt_back(
    broker: Broker, client: Client, probe: Probe
) -> None:
    starts: list[tuple[str, int, float]] = []
    other_done = asyncio.Event()
    worker = make_worker(broker, "upstream", prefetch=4)

    @worker.handler("upstream")
    async def handle(job: Job) -> None:
        assert job.partition is not None
        starts.append((job.partition, job.attempt, time.monotonic()))
        if job.partition == "slow-api" and len(starts) == 1:
            raise RateLimited(0.4)
        if job.partition == "other":
            other_done.set()

    async with running(worker, probe):
        first = await client.enqueue("upstream", {}, partition="slow-api")
        backed = await probe.report("back_off", first)
        assert backed.result == {"landed": True}
        assert backed.fields["delay_s"] == 0.4
        # Another key is not held: its job runs at once.
        await client.enqueue("upstream", {}, partition="other")
        await asyncio.wait_for(other_done.wait(), WAIT)
        info = await client.get_job(first)
        assert info is not None and info.partition == "slow-api"
        await probe.report("ack", first, timeout=WAIT)
    slow = [(attempt, at) for key, attempt, at in starts if key == "slow-api"]
    # The same attempt again (the back-off spent none), after the delay.
    assert [attempt for attempt, _ in slow] == [1, 1]
    assert slow[1][1] - backed.at >= 0.35
    other_at = next(at for key, _, at in starts if key == "other")
    assert other_at < slow[1][1]


async def test_rate_limited_for_the_whole_queue_holds_every_key(
    broker: Broker, client: Client, probe: Probe
) -> None:
    starts: list[tuple[str, float]] = []
    worker = make_worker(broker, "whole", prefetch=4)

    @worker.handler("whole")
    async def handle(job: Job) -> None:
        assert job.partition is not None
        starts.append((job.partition, time.monotonic()))
        if len(starts) == 1:
            raise RateLimited(0.3, queue=True)

    async with running(worker, probe):
        first = await client.enqueue("whole", {}, partition="a")
        backed = await probe.report("back_off", first)
        second = await client.enqueue("whole", {}, partition="b")
        stats = (await client.stats("whole"))["whole"]
        assert stats["backoff_until"] is not None
        assert stats["limited"] == stats["ready"] == 2
        await probe.report("ack", second)
        await probe.report("ack", first)
    assert all(at - backed.at >= 0.25 for _, at in starts[1:])


def test_rate_limited_refuses_a_bad_delay() -> None:
    for bad in (-1, float("inf"), float("nan"), True, "3"):
        with pytest.raises(InvalidArgument) as caught:
            RateLimited(bad)  # type: ignore[arg-type]
        assert caught.value.field == "delay_s"


async def test_set_limits_answers_the_limits_and_stats_show_them(client: Client) -> None:
    limits = await client.set_limits("api", rate=100, per_s=60, burst=10, partition_concurrency=1)
    assert limits == {
        "concurrency": None,
        "rate": 100,
        "per_s": 60,
        "burst": 10,
        "partition_concurrency": 1,
        "partition_rate": None,
        "partition_per_s": 1.0,
        "partition_burst": None,
    }
    stats = (await client.stats("api"))["api"]
    assert stats["limits"]["rate"] == 100 and stats["limits"]["per_s"] == 60
    assert stats["limited"] == 0 and stats["partitions"] == 0
    # Setting none clears them all.
    cleared = await client.set_limits("api")
    assert all(cleared[name] is None for name in ("concurrency", "rate", "partition_concurrency"))


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"rate": -5}, "rate"),
        ({"rate": 5, "per_s": 0}, "per_s"),
        ({"burst": 3}, "burst"),
        ({"partition_rate": 2, "partition_per_s": -1.0}, "partition_per_s"),
        ({"partition_concurrency": 2**31}, "partition_concurrency"),
    ],
)
async def test_a_bad_limit_is_refused_naming_its_field(
    client: Client, limits: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        await client.set_limits("bad", **limits)
    assert caught.value.field == field
    assert caught.value.code == "invalid_argument"


async def test_a_bad_partition_is_refused_naming_it(client: Client) -> None:
    with pytest.raises(InvalidArgument) as caught:
        await client.enqueue("q", {}, partition="x" * 1025)
    assert caught.value.field == "partition"


@with_config(
    queue_limits={"from-file": Limits(concurrency=3, partition_rate=5, partition_per_s=2.0)}
)
async def test_the_queues_file_limits_hold_from_the_start(
    broker: Broker, client: Client, config: Config
) -> None:
    limits = (await client.stats("from-file"))["from-file"]["limits"]
    assert (limits["concurrency"], limits["partition_rate"], limits["partition_per_s"]) == (
        3,
        5,
        2.0,
    )
