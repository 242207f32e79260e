"""Results across brokers sharing one PostgreSQL table: a publisher waiting on one broker
gets the result of a job acked through another, a failure and a cancel made elsewhere
end its wait too, and a kept result is read through any broker.

Every wait is on an event or a reply, bounded by ``WAIT``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from conveyor import JobCancelled, JobFailed, JobNotFound
from conveyor.broker.config import Config
from conveyor.broker.engine import QueueOpts
from conveyor.broker.server import Broker, running_broker
from conveyor.sdk import Client, Fail, Job, Worker

from ..conformance.pg import database
from ..sdk.conftest import Probe
from .test_brokers import _url, working

WAIT = 10.0
KEPT = "kept"


@contextlib.asynccontextmanager
async def brokers(n: int) -> AsyncIterator[list[Broker]]:
    """``n`` brokers sharing one new database, the queue ``kept`` keeping finished jobs."""
    opts = {KEPT: QueueOpts(completed_retention_s=3600.0)}
    async with database() as dsn, contextlib.AsyncExitStack() as stack:
        url = _url(dsn)
        yield [
            await stack.enter_async_context(
                running_broker(Config(port=0, store="postgres", db_path=url, queue_opts=opts))
            )
            for _ in range(n)
        ]


def _waits(broker: Broker) -> int:
    return sum(len(conn.waits) for conn in broker.connections)


async def _waiting(probe: Probe, broker: Broker, client: Client, n: int) -> None:
    """Until ``broker`` holds ``n`` waits of ``client``, each following its job in the
    table: a wait counts once its request is handled, and the backend answers calls in
    the order they were made, so a ``get_job`` made after them answers after their
    follows did."""
    await probe.wait_for(lambda: _waits(broker) >= n, WAIT)
    await client.get_job("no-such-job")


@pytest.mark.parametrize("queue", ["plain", KEPT])
async def test_a_waiter_on_one_broker_gets_a_result_acked_through_another(
    queue: str, probe: Probe
) -> None:
    async with brokers(2) as (a, b), Client(a.url, request_timeout=WAIT) as publisher:
        worker = Worker(b.url, prefetch=8)

        @worker.handler(queue)
        async def square(job: Job) -> dict[str, Any]:
            return {"n": job.payload["n"], "square": job.payload["n"] ** 2}

        ids = await publisher.enqueue_many(queue, [{"n": n} for n in range(50)])
        waits = [asyncio.ensure_future(publisher.result(i, timeout_s=WAIT)) for i in ids]
        await _waiting(probe, a, publisher, len(ids))
        async with working(worker):
            results = await asyncio.wait_for(asyncio.gather(*waits), WAIT)
        assert results == [{"n": n, "square": n * n} for n in range(50)]
        assert _waits(a) == 0
        if queue == KEPT:  # kept: read afterwards through either broker
            async with Client(b.url) as other:
                assert await other.result(ids[7], timeout_s=WAIT) == {"n": 7, "square": 49}
            info = await publisher.get_job(ids[7])
            assert info is not None and info.state == "completed" and info.completed_at


async def test_a_failure_and_a_cancel_through_another_broker_end_the_wait(probe: Probe) -> None:
    async with (
        brokers(2) as (a, b),
        Client(a.url, request_timeout=WAIT) as publisher,
        Client(b.url, request_timeout=WAIT) as admin,
    ):
        worker = Worker(b.url)

        @worker.handler("billing")
        async def refuse(job: Job) -> None:
            raise Fail("card declined")

        failing = await publisher.enqueue("billing", {}, max_attempts=1)
        idle = await publisher.enqueue("idle", {})
        failed = asyncio.ensure_future(publisher.result(failing, timeout_s=WAIT))
        cancelled = asyncio.ensure_future(publisher.result(idle, timeout_s=WAIT))
        await _waiting(probe, a, publisher, 2)
        assert await admin.cancel(idle)
        with pytest.raises(JobCancelled):
            await asyncio.wait_for(cancelled, WAIT)
        async with working(worker):
            with pytest.raises(JobFailed) as refused:
                await asyncio.wait_for(failed, WAIT)
        assert refused.value.error == "card declined"


async def test_a_wait_times_out_and_an_unknown_job_is_said() -> None:
    async with brokers(1) as (a,), Client(a.url, request_timeout=WAIT) as publisher:
        job_id = await publisher.enqueue("idle", {})
        with pytest.raises(TimeoutError, match="still pending"):
            await publisher.result(job_id, timeout_s=0.1)
        assert _waits(a) == 0
        with pytest.raises(JobNotFound):
            await publisher.result("no-such-job", timeout_s=WAIT)
