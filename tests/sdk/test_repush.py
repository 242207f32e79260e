"""A job handed back to the worker that still runs it, after its lease lapsed in an outage.

Found by the crash soak (``scripts/crash_soak.py``): a worker cut off for longer than the
disconnect grace loses its lease; the broker pushes the job again, possibly to the same
worker, whose handler for the first attempt may still be running. The worker used to
drop that push as a duplicate, so the new lease was never reported: the job sat under it
until its visibility timeout, and its prefetch slot was never freed.
"""

from __future__ import annotations

import asyncio

from conveyor.broker.server import Broker
from conveyor.sdk import Client, Job, Worker

from .conftest import WAIT, Probe, Proxy, running, with_config


@with_config(disconnect_grace_s=0.0)
async def test_a_job_pushed_again_while_its_lapsed_attempt_runs_runs_again_after_it(
    broker: Broker, client: Client, proxy: Proxy, probe: Probe
) -> None:
    calls: list[tuple[str, int]] = []
    started = asyncio.Event()
    release = asyncio.Event()
    worker = Worker(proxy.url, queues=["again"], prefetch=1, shutdown_timeout_s=1.0)

    @worker.handler("again")
    async def handle(job: Job) -> None:
        calls.append((job.payload, job.attempt))
        if job.attempt == 1 and job.payload == "x":
            started.set()
            await release.wait()

    async with running(worker, probe):
        x = await client.enqueue("again", "x")
        await asyncio.wait_for(started.wait(), WAIT)
        proxy.cut()  # no grace: the lease lapses at once, and x is pushed back to us
        await probe.wait_for(lambda: len(probe.handled("subscribe")) == 2)
        release.set()
        acks = await probe.count("ack", 2, x)
        assert [a.result["landed"] for a in acks] == [False, True]  # the second attempt's
        y = await client.enqueue("again", "y")  # the one slot is free again
        assert (await probe.report("ack", y)).result == {"landed": True}
    assert calls == [("x", 1), ("x", 2), ("y", 1)]
    assert await client.get_job(x) is None
