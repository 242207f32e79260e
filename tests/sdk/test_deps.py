"""Job dependencies through the SDK as users run them (docs/contract.md, DEP-1 to
DEP-7), against real brokers on the memory and the SQLite store: a fan-out to 100 jobs
and a fan-in reading their 100 results, a group made at once, and a dependency that
dies taking its dependents with it."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from conveyor import DependencyCycle, Group, JobFailed, SyncClient
from conveyor.broker.config import Config
from conveyor.broker.server import Broker
from conveyor.sdk import Client, Fail, InvalidArgument, Job, Worker

from .conftest import BASE_CONFIG, WAIT, Probe, running

FAN = 100


@pytest.fixture(params=["memory", "sqlite"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> Config:
    return dataclasses.replace(
        BASE_CONFIG, store=request.param, db_path=str(tmp_path / "conveyor.db")
    )


def make_worker(broker: Broker, *queues: str, **kwargs: Any) -> Worker:
    kwargs.setdefault("shutdown_timeout_s", 1.0)
    return Worker(broker.url, queues=list(queues), **kwargs)


async def test_a_fan_out_to_100_and_a_fan_in_reading_their_results_dep_1_dep_2(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = make_worker(broker, "split", "part", "sum", prefetch=32)
    root = await client.enqueue("split", None)
    fanned: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    seen_before_sum: list[int] = []

    @worker.handler("split")
    async def split(job: Job) -> str:
        # One job fans out to 100, then one more waits for all 100.
        parts = [await client.enqueue("part", {"i": i}, after=[job.id]) for i in range(FAN)]
        final = await client.enqueue("sum", None, after=parts)
        fanned.set_result(final)
        return "split done"

    @worker.handler("part")
    async def part(job: Job) -> dict[str, int]:
        assert job.dependencies == 1
        assert await job.dependency_results() == {root: "split done"}
        seen_before_sum.append(job.payload["i"])
        return {"i": job.payload["i"], "square": job.payload["i"] ** 2}

    @worker.handler("sum")
    async def total(job: Job) -> dict[str, Any]:
        results = await job.dependency_results()
        assert len(seen_before_sum) == FAN  # handed out only after every part was acked
        return {
            "n": len(results),
            "sum": sum(r["square"] for r in results.values()),
            "order": [r["i"] for r in results.values()],
        }

    async with running(worker, probe):
        final = await asyncio.wait_for(fanned, 30)
        info = await client.get_job(final)
        assert info is not None and info.state in {"waiting", "ready", "processing"}
        assert len(info.after) == FAN
        out = await client.result(final, timeout_s=30)
    assert out == {
        "n": FAN,
        "sum": sum(i * i for i in range(FAN)),
        "order": list(range(FAN)),  # in the order the enqueue named them
    }


async def test_a_group_makes_a_tree_at_once_and_refuses_a_cycle_dep_4_dep_6(
    broker: Broker, client: Client, probe: Probe
) -> None:
    group = Group()
    root = group.add("g", {"step": "root"})
    leaves = [group.add("g", {"step": i}, after=[root]) for i in range(FAN)]
    final = group.add("g", {"step": "final"}, after=leaves)
    ids = await client.enqueue_group(group)
    assert len(ids) == FAN + 2
    stats = (await client.stats("g"))["g"]
    assert stats["waiting"] == FAN + 1 and stats["ready"] == 1
    info = await client.get_job(ids[final])
    assert info is not None and info.state == "waiting" and info.waiting_for == FAN

    cyclic = Group()
    cyclic.add("g", 1, after=[1])
    cyclic.add("g", 2, after=[0])
    with pytest.raises(DependencyCycle) as caught:
        await client.enqueue_group(cyclic)
    assert caught.value.code == "dependency_cycle" and caught.value.field is not None
    bad = Group()
    bad.add("g", 1)
    bad.add("g", 2, after=[0, "no-such-job"])
    with pytest.raises(InvalidArgument) as refused:
        await client.enqueue_group(bad)
    assert refused.value.field == "jobs[1].after[1]"
    assert (await client.stats("g"))["g"]["totals"]["enqueued"] == FAN + 2

    worker = make_worker(broker, "g", prefetch=16)

    @worker.handler("g")
    async def step(job: Job) -> Any:
        if job.payload["step"] == "final":
            results = await job.dependency_results()
            return sum(results.values())
        return 1

    async with running(worker, probe):
        assert await client.result(ids[final], timeout_s=30) == FAN


async def test_a_dependency_that_dies_kills_its_dependents_dep_3(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = make_worker(broker, "d")

    @worker.handler("d")
    async def run(job: Job) -> None:
        if job.payload == "bad":
            raise Fail("broken input")

    bad = await client.enqueue("d", "bad")
    child = await client.enqueue("d", "child", after=[bad])
    grandchild = await client.enqueue("d", "grandchild", after=[child])
    waits = [asyncio.ensure_future(client.result(i, timeout_s=30)) for i in (child, grandchild)]
    async with running(worker, probe):
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
    assert isinstance(outcomes[0], JobFailed)
    assert outcomes[0].error == f"dependency {bad} died: broken input"
    assert isinstance(outcomes[1], JobFailed)
    assert outcomes[1].error == f"dependency {child} died: dependency {bad} died: broken input"
    info = await client.get_job(grandchild)
    assert info is not None and info.state == "dead"
    # A later job naming the dead one dies at once; an unknown id is refused.
    late = await client.enqueue("d", "late", after=[bad])
    late_info = await client.get_job(late)
    assert late_info is not None and late_info.state == "dead"
    with pytest.raises(InvalidArgument) as refused:
        await client.enqueue("d", "x", after=["no-such-job"])
    assert refused.value.field == "after[0]"


async def test_the_sync_client_enqueues_with_after_and_groups(broker: Broker) -> None:
    def blocking() -> None:
        with SyncClient(broker.url, connect_timeout=WAIT, request_timeout=WAIT) as client:
            first = client.enqueue("s", 1)
            second = client.enqueue("s", 2, after=[first])
            group = Group()
            group.add("s", 3, after=[second])
            (third,) = client.enqueue_group(group)
            info = client.get_job(third)
            assert info is not None and info.after == (second,) and info.state == "waiting"

    await asyncio.to_thread(blocking)


def test_a_group_member_after_must_be_a_list() -> None:
    group = Group()
    first = group.add("q", 1)
    with pytest.raises(InvalidArgument) as refused:
        group.add("q", 2, after=str(first))  # type: ignore[arg-type]
    assert refused.value.field == "after" and len(group) == 1


async def test_large_results_come_in_pages_that_fit_the_frames_dep_2(
    broker: Broker, client: Client, probe: Probe
) -> None:
    big = 200_000  # six of these are more than one frame holds (1 MiB)
    group = Group()
    parts = [group.add("big", i) for i in range(6)]
    final = group.add("fin", None, after=parts)
    ids = await client.enqueue_group(group)
    worker = make_worker(broker, "big", "fin")

    @worker.handler("big")
    async def produce(job: Job) -> str:
        return str(job.payload) * big

    @worker.handler("fin")
    async def consume(job: Job) -> list[int]:
        results = await job.dependency_results()
        return [len(results[ids[i]]) for i in parts]

    async with running(worker, probe):
        assert await client.result(ids[final], timeout_s=30) == [big] * 6
    pages = probe.handled("dependency_results")
    # Half a frame a page: two results of 200 kB each, read from offsets 0, 2 and 4.
    assert [page.fields["offset"] for page in pages] == [0, 2, 4]
