"""Results through the SDK as users run them: a handler's return value reaches
``client.result`` (and ``SyncClient.result``), against real brokers on the memory and the
SQLite store. Failing, cancelled, unknown and timed-out jobs raise what the docs say; an
oversized result fails its job; a wait survives a reconnect."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from conveyor import JobCancelled, JobFailed, JobNotFound, SyncClient
from conveyor.broker.config import Config, ConfigError, load_queues
from conveyor.broker.engine import QueueOpts
from conveyor.broker.server import Broker, running_broker
from conveyor.sdk import Client, Fail, InvalidArgument, Job, NotFound, Worker
from conveyor.sdk._cli_admin import show_job, show_jobs

from .conftest import BASE_CONFIG, WAIT, Probe, Proxy, running

KEPT = "kept"  # a queue that keeps finished jobs an hour


@pytest.fixture(params=["memory", "sqlite"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> Config:
    return dataclasses.replace(
        BASE_CONFIG,
        store=request.param,
        db_path=str(tmp_path / "conveyor.db"),
        queue_opts={KEPT: QueueOpts(completed_retention_s=3600.0)},
    )


def _waits(broker: Broker) -> int:
    return sum(len(conn.waits) for conn in broker.connections)


async def _until(probe: Probe, predicate: Any) -> None:
    """Wait until ``predicate()`` holds, re-checked after each request the broker handles
    (a wait is in place once its request is handled)."""
    await probe.wait_for(predicate)


def make_worker(broker: Broker, *queues: str, **kwargs: Any) -> Worker:
    kwargs.setdefault("shutdown_timeout_s", 1.0)
    return Worker(broker.url, queues=list(queues), **kwargs)


async def test_a_thousand_results_awaited_at_once(
    broker: Broker, client: Client, probe: Probe
) -> None:
    ids = await client.enqueue_many("sums", [{"n": n} for n in range(1000)])
    waits = [asyncio.ensure_future(client.result(job_id, timeout_s=30)) for job_id in ids]
    # Every wait is in place before any job runs (and the queue keeps no finished job):
    # each result reaches a waiter that waited before its job finished.
    await _until(probe, lambda: _waits(broker) == 1000)
    worker = make_worker(broker, "sums", prefetch=64)

    @worker.handler("sums")
    async def double(job: Job) -> dict[str, Any]:
        return {"n": job.payload["n"], "double": job.payload["n"] * 2}

    async with running(worker, probe):
        results = await asyncio.wait_for(asyncio.gather(*waits), 30)
    assert results == [{"n": n, "double": 2 * n} for n in range(1000)]
    assert _waits(broker) == 0
    # The queue keeps nothing: once finished, a job is unknown.
    with pytest.raises(JobNotFound) as found:
        await client.result(ids[0], timeout_s=1)
    assert isinstance(found.value, NotFound) and found.value.job_id == ids[0]


async def test_with_retention_a_later_result_still_gets_it(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = make_worker(broker, KEPT)

    @worker.handler(KEPT)
    def render(job: Job) -> list[str]:  # a plain def, run on a thread
        return [job.payload["title"].upper(), "<script>alert(1)</script>"]

    job_id = await client.enqueue(KEPT, {"title": "report"})
    async with running(worker, probe):
        await probe.report("ack", job_id)
    assert await client.result(job_id, timeout_s=5) == ["REPORT", "<script>alert(1)</script>"]
    info = await client.get_job(job_id)
    assert info is not None and info.state == "completed"
    assert info.result == ["REPORT", "<script>alert(1)</script>"] and info.completed_at
    shown = show_job(info, info.completed_at)
    assert "completed" in shown and '"REPORT"' in shown
    page = await client.list_jobs(KEPT, "completed")
    assert [job.id for job in page.jobs] == [job_id] and page.total == 1
    listed = show_jobs(page.jobs, "completed", info.completed_at)
    assert "RESULT" in listed and "REPORT" in listed


async def test_a_handler_returning_none_has_no_result(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = make_worker(broker, KEPT)

    @worker.handler(KEPT)
    async def quiet(job: Job) -> None:
        return None

    job_id = await client.enqueue(KEPT, {})
    async with running(worker, probe):
        await probe.report("ack", job_id)
    (ack,) = probe.handled("ack", job_id)
    assert "result" not in ack.fields  # nothing added to the frame
    assert await client.result(job_id, timeout_s=5) is None


async def test_a_failing_job_raises_job_failed_with_its_error(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = make_worker(broker, "q")

    @worker.handler("q")
    async def refuse(job: Job) -> None:
        raise Fail("card declined")

    job_id = await client.enqueue("q", {})
    waiting = asyncio.ensure_future(client.result(job_id, timeout_s=30))
    await _until(probe, lambda: _waits(broker) == 1)
    async with running(worker, probe):
        with pytest.raises(JobFailed) as failed:
            await asyncio.wait_for(waiting, WAIT)
    assert failed.value.error == "card declined" and failed.value.job_id == job_id
    assert "card declined" in str(failed.value)
    with pytest.raises(JobFailed):  # dead jobs are kept: at once, after the fact too
        await client.result(job_id, timeout_s=5)


async def test_cancel_raises_job_cancelled(broker: Broker, client: Client, probe: Probe) -> None:
    job_id = await client.enqueue("idle", {})
    waiting = asyncio.ensure_future(client.result(job_id))
    await _until(probe, lambda: _waits(broker) == 1)
    assert await client.cancel(job_id)
    with pytest.raises(JobCancelled) as cancelled:
        await asyncio.wait_for(waiting, WAIT)
    assert cancelled.value.job_id == job_id
    assert _waits(broker) == 0


async def test_timeout_raises_and_the_broker_drops_the_waiter(
    broker: Broker, client: Client
) -> None:
    job_id = await client.enqueue("idle", {})
    with pytest.raises(TimeoutError, match="still pending"):
        await client.result(job_id, timeout_s=0.05)
    assert _waits(broker) == 0
    with pytest.raises(InvalidArgument) as bad:
        await client.result(job_id, timeout_s=-1)
    assert bad.value.field == "timeout_s"


async def test_an_unknown_job_raises_job_not_found(client: Client) -> None:
    with pytest.raises(JobNotFound):
        await client.result("no-such-job", timeout_s=5)


async def test_an_oversized_result_fails_the_job_naming_the_size(
    tmp_path: Path, probe: Probe
) -> None:
    config = dataclasses.replace(BASE_CONFIG, max_payload_bytes=1024)
    async with (
        running_broker(config) as broker,
        Client(broker.url, connect_timeout=WAIT, request_timeout=WAIT) as client,
    ):
        worker = make_worker(broker, "big")

        @worker.handler("big")
        async def huge(job: Job) -> str:
            return "x" * 2000

        job_id = await client.enqueue("big", {})
        waiting = asyncio.ensure_future(client.result(job_id, timeout_s=30))
        await _until(probe, lambda: _waits(broker) == 1)
        async with running(worker, probe):
            with pytest.raises(JobFailed) as failed:
                await asyncio.wait_for(waiting, WAIT)
        assert failed.value.error is not None
        assert "2002 bytes" in failed.value.error and "1024" in failed.value.error
        assert failed.value.error.startswith("result:")
        assert not probe.handled("ack", job_id)


async def test_a_wait_is_sent_again_after_a_reconnect(
    broker: Broker, client: Client, probe: Probe, proxy: Proxy
) -> None:
    job_id = await client.enqueue(KEPT, {"n": 21})
    proxy.cut_after = b'"wait"'
    async with Client(proxy.url, connect_timeout=WAIT, request_timeout=WAIT) as through:
        waiting = asyncio.ensure_future(through.result(job_id, timeout_s=30))
        await _until(probe, lambda: proxy.cuts == 1 and _waits(broker) == 1)
        worker = make_worker(broker, KEPT)

        @worker.handler(KEPT)
        async def answer(job: Job) -> int:
            return int(job.payload["n"]) * 2

        async with running(worker, probe):
            assert await asyncio.wait_for(waiting, WAIT) == 42
    assert proxy.accepted == 2


async def test_sync_client_result(broker: Broker, client: Client, probe: Probe) -> None:
    worker = make_worker(broker, KEPT)

    @worker.handler(KEPT)
    async def echo(job: Job) -> Any:
        return job.payload

    job_id = await client.enqueue(KEPT, {"echo": [1, "two"]})
    async with running(worker, probe):
        await probe.report("ack", job_id)

    def blocking() -> Any:
        with SyncClient(broker.url, connect_timeout=WAIT, request_timeout=WAIT) as sync:
            return sync.result(job_id, timeout_s=5)

    assert await asyncio.to_thread(blocking) == {"echo": [1, "two"]}


async def test_a_result_that_is_not_json_fails_the_job(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = make_worker(broker, "q")

    @worker.handler("q")
    async def odd(job: Job) -> Any:
        return {1, 2}  # a set: not JSON

    job_id = await client.enqueue("q", {})
    waiting = asyncio.ensure_future(client.result(job_id, timeout_s=30))
    await _until(probe, lambda: _waits(broker) == 1)
    async with running(worker, probe):
        with pytest.raises(JobFailed) as failed:
            await asyncio.wait_for(waiting, WAIT)
    assert failed.value.error is not None and failed.value.error.startswith("result: ")


def test_the_queues_file_sets_completed_retention(tmp_path: Path) -> None:
    path = tmp_path / "queues.toml"
    path.write_text("[queues.reports]\ncompleted_retention_s = 600\n")
    opts, _ = load_queues(path)
    assert opts["reports"].completed_retention_s == 600
    path.write_text("[queues.reports]\ncompleted_retention_s = -1\n")
    with pytest.raises(ConfigError, match="completed_retention_s"):
        load_queues(path)


async def test_acks_whose_results_outgrow_a_frame_are_split_and_one_too_big_fails(
    probe: Probe,
) -> None:
    config = dataclasses.replace(BASE_CONFIG, max_frame_bytes=8192, max_payload_bytes=8192)
    async with (
        running_broker(config) as broker,
        Client(broker.url, connect_timeout=WAIT, request_timeout=WAIT) as client,
    ):
        release, all_in = asyncio.Event(), asyncio.Event()
        started: list[str] = []
        worker = make_worker(broker, "big", prefetch=8)

        @worker.handler("big")
        async def fill(job: Job) -> str:
            started.append(job.id)
            if len(started) == 5:
                all_in.set()
            await release.wait()  # all end in one loop iteration: their acks share a batch
            return str(job.payload["c"]) * job.payload["size"]

        ids = await client.enqueue_many("big", [{"c": c, "size": 3000} for c in range(4)])
        too_big = await client.enqueue("big", {"c": "z", "size": 8150})
        waits = [asyncio.ensure_future(client.result(i, timeout_s=30)) for i in ids]
        failing = asyncio.ensure_future(client.result(too_big, timeout_s=30))
        await _until(probe, lambda: _waits(broker) == 5)
        async with running(worker, probe):
            await asyncio.wait_for(all_in.wait(), WAIT)
            release.set()
            results = await asyncio.wait_for(asyncio.gather(*waits), WAIT)
            with pytest.raises(JobFailed) as failed:
                await asyncio.wait_for(failing, WAIT)
        assert results == [str(c) * 3000 for c in range(4)]
        assert failed.value.error is not None and "8152 bytes" in failed.value.error
        batches = [h for h in probe.log if h.op == "ack_batch"]
        assert len(batches) >= 2 and sum(len(h.fields["items"]) for h in batches) == 4
