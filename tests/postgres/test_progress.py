"""Progress and watching across brokers sharing one PostgreSQL table (docs/contract.md,
PRG-8): a watcher on one broker sees the progress, retry and end of a job worked through
another; and the follows of a broker that stopped announcing (crashed) are pruned with its
row in the broker registry, so that acks stop paying for them.

Every wait is on an event or a reply, bounded by ``WAIT``.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import psycopg

from conveyor.broker.backend import Claim, Enqueue
from conveyor.broker.backend.postgres import PostgresBackend
from conveyor.broker.scheduler import SteppedScheduler
from conveyor.sdk import Client, Job, Retry, Worker

from ..conformance.pg import database
from ..sdk.conftest import Probe
from .test_brokers import working
from .test_results import brokers

WAIT = 10.0
START = 1_800_000_000.0


async def test_a_watcher_on_one_broker_sees_progress_made_through_another_prg_8(
    probe: Probe,
) -> None:
    async with brokers(2) as (a, b), Client(a.url, request_timeout=WAIT) as publisher:
        job_id = await publisher.enqueue("q", {"steps": 3})
        steps = [asyncio.Event() for _ in range(3)]
        worker = Worker(b.url, queues=["q"], progress_interval_s=0.01)

        @worker.handler("q")
        async def work(job: Job) -> str:
            if job.attempt == 1:
                await job.progress(0.1)
                await steps[0].wait()
                raise Retry(delay_s=0, error="once more")
            for i in (1, 2):
                await job.progress(i / 2)
                await steps[i].wait()
            return "done"

        seen: list[tuple[Any, ...]] = []

        async def watch() -> None:
            async for event in publisher.watch(job_id):
                if event.kind == "progress":
                    seen.append(("progress", event.attempt, event.progress))
                    steps[0 if event.attempt == 1 else int(event.progress * 2)].set()
                elif event.kind == "retry":
                    seen.append(("retry", event.attempt, event.reason, event.error))
                else:
                    seen.append(("end", event.state, event.result))

        watching = asyncio.get_running_loop().create_task(watch())
        try:
            # The watch is in place before the job runs: once its request is handled, a
            # later call through that broker answers after its follow did (calls take
            # the table in order).
            await probe.wait_for(lambda: probe.handled("watch_job"), WAIT)
            await publisher.get_job(job_id)
            async with working(worker):
                await asyncio.wait_for(asyncio.shield(watching), WAIT)
        finally:
            watching.cancel()
        assert seen == [
            ("progress", 1, 0.1),
            ("retry", 1, "failed", "once more"),
            ("progress", 2, 0.5),
            ("progress", 2, 1.0),
            ("end", "completed", "done"),
        ]


async def _follows(dsn: str, follower: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM conveyor_follows WHERE broker = %s", (follower,)
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def test_the_follows_of_a_broker_that_stopped_announcing_are_pruned() -> None:
    async with database() as dsn:
        clock_a = SteppedScheduler(start=START)
        a = await PostgresBackend.open(
            dsn, clock_a, max_payload_bytes=1 << 20, rng=random.Random(1)
        )
        (job_id,) = await a.enqueue([Enqueue("q", None)])
        assert isinstance(job_id, str)
        assert await a.follow([job_id], lambda finished: None) == [None]
        assert await a.watch([job_id], lambda event: None) != []
        await a.announce("broker-a", {"id": "broker-a"}, 10.0)
        follower_a = a._follower_id
        assert await _follows(dsn, follower_a) == 1
        # A crash: the broker goes without dropping its follows.
        a._drop_my_follows = _nothing  # type: ignore[method-assign]
        await a.close()
        assert await _follows(dsn, follower_a) == 1

        clock_b = SteppedScheduler(start=START + 30)
        b = await PostgresBackend.open(
            dsn, clock_b, max_payload_bytes=1 << 20, rng=random.Random(2)
        )
        try:
            assert await b.follow([job_id], lambda finished: None) == [None]
            # Within a minute of its last announce, a broker is alive: its follows stay.
            others = await b.announce("broker-b", {"id": "broker-b"}, 10.0)
            assert others == []  # (past the ttl, not listed; still registered)
            assert await _follows(dsn, follower_a) == 1
            clock_b.advance(31)  # a minute and a second after A's last announce
            await b.announce("broker-b", {"id": "broker-b"}, 10.0)
            assert await _follows(dsn, follower_a) == 0
            assert await _follows(dsn, b._follower_id) == 1  # a live broker's stay
        finally:
            await b.close()


async def test_a_broker_whose_row_was_cleared_writes_its_follows_again() -> None:
    async with database() as dsn:
        clock = SteppedScheduler(start=START)
        b = await PostgresBackend.open(dsn, clock, max_payload_bytes=1 << 20, rng=random.Random(2))
        try:
            live, ending = await b.enqueue([Enqueue("q", None), Enqueue("q", None)])
            assert isinstance(live, str) and isinstance(ending, str)
            told: list[Any] = []
            came = asyncio.Event()

            def tell(finished: Any) -> None:
                told.append(finished)
                came.set()

            async def next_told() -> Any:
                async with asyncio.timeout(WAIT):
                    while not told:
                        came.clear()
                        await came.wait()
                return told.pop(0)

            assert await b.follow([live, ending], tell) == [None, None]
            await b.announce("broker-b", {"id": "broker-b"}, 10.0)
            # Out of reach for a minute: another broker cleared its row and follows.
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute("DELETE FROM conveyor_brokers")
                await conn.execute("DELETE FROM conveyor_follows")
            assert await b.cancel([ending]) == [True]  # (no follow row: not told)
            assert told == []
            await b.announce("broker-b", {"id": "broker-b"}, 10.0)
            gone = await next_told()  # told once the follows are written again
            assert (gone.id, gone.state) == (ending, "unknown")
            assert await _follows(dsn, b._follower_id) == 1
            (c,) = (await b.claim([Claim("w", ("q",), 1)]))[0]
            assert await b.ack([(c.id, c.lease)]) == [True]
            done = await next_told()
            assert (done.id, done.state) == (live, "completed")
        finally:
            await b.close()


async def _nothing(now: float) -> None:
    return None
