"""A PostgreSQL restart under running brokers: they recover, and nothing answered is
lost. The server is the test's own (``_server.PrivateServer``), crashed with an
immediate stop and started again while a publisher and a worker keep going through the
SDK: a request the database could not take is answered ``unavailable`` (never a false
success), the publisher tries such an enqueue again (with its key, so it is stored
once while the job exists), and every enqueue that was answered is handled.

An enqueue answered ``unavailable`` is in doubt, not refused: its commit may have landed
just before the crash. If that job is then handled and acked before the publisher's
retry arrives, its key is free again (ENQ-10) and the retry stores a second job. So the
completed count is at least one per key and at most one more per enqueue in doubt.
"""

from __future__ import annotations

import asyncio
import contextlib

from conveyor.broker.config import Config
from conveyor.broker.server import running_broker
from conveyor.sdk import Client, Job, Unavailable, Worker

from ._server import PrivateServer, private_server
from .test_brokers import working

WAIT = 30.0
JOBS = 400
# A claim whose commit was cut off by the crash may have been committed: its job is then
# held under a lease no worker got, and comes back at the lease's deadline (CLM-3). Short
# leases keep that wait short.
LEASE_S = 2.0


async def test_brokers_recover_from_a_database_restart_and_lose_nothing_answered() -> None:
    with private_server() as server:
        db = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
        config = Config(port=0, store="postgres", db_path=db)
        async with running_broker(config) as a, running_broker(config) as b:
            await _run(server, [a.url, b.url])


async def _run(server: PrivateServer, urls: list[str]) -> None:
    handled: set[str] = set()
    answered: set[str] = set()
    halfway = asyncio.Event()
    everything = asyncio.Event()
    published = asyncio.Event()
    in_doubt = 0
    worker = Worker(urls, prefetch=8)

    @worker.handler("work")
    async def handle(job: Job) -> None:
        handled.add(job.id)
        if published.is_set() and answered <= handled:
            everything.set()

    async def publish(client: Client, n: int) -> None:
        nonlocal in_doubt
        while True:
            try:
                job_id = await client.enqueue(
                    "work", {"n": n}, key=f"job-{n}", visibility_timeout_s=LEASE_S
                )
            except Unavailable:  # the database is down: nothing was confirmed; again
                in_doubt += 1
                await asyncio.sleep(0.05)
                continue
            answered.add(job_id)
            if n == JOBS // 2:
                halfway.set()
            return

    async def all_jobs(client: Client) -> None:
        for n in range(JOBS):
            await publish(client, n)

    async with Client(urls) as client:
        async with working(worker):
            publishing = asyncio.get_running_loop().create_task(all_jobs(client))
            await asyncio.wait_for(halfway.wait(), WAIT)
            await asyncio.to_thread(server.crash)
            # While it is down, requests are refused as unavailable, not hung or faked.
            with contextlib.suppress(Unavailable):
                await client.enqueue("probe", {})
                raise AssertionError("an enqueue was answered while the database was down")
            await asyncio.to_thread(server.start)
            await asyncio.wait_for(publishing, WAIT)
            published.set()
            if answered <= handled:
                everything.set()
            await asyncio.wait_for(everything.wait(), WAIT)
        # (the worker has stopped: every ack it sent was answered)
        stats = (await client.stats())["work"]
    assert len(answered) == JOBS  # one id per key, each stored once
    assert answered <= handled
    assert stats["ready"] == stats["processing"] == 0
    assert JOBS <= stats["totals"]["completed"] <= JOBS + in_doubt
