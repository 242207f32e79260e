"""Several brokers on one PostgreSQL database, each a real server on port 0, driven
through the SDK: what a publisher or a worker connected to one broker sees of the
changes made through another.

Every wait is on an event or a reply, bounded by ``WAIT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator

import psycopg
import pytest

from conveyor.broker.backend import Claim
from conveyor.broker.config import Config
from conveyor.broker.server import Broker, running_broker
from conveyor.sdk import Client, Job, Worker, enqueue_tx_async

from ..conformance.pg import database
from ..sdk.conftest import ROOT, Probe, conveyor

WAIT = 10.0


@contextlib.asynccontextmanager
async def brokers(n: int) -> AsyncIterator[list[Broker]]:
    """``n`` brokers sharing one new database."""
    async with database() as dsn, contextlib.AsyncExitStack() as stack:
        url = _url(dsn)
        yield [
            await stack.enter_async_context(
                running_broker(Config(port=0, store="postgres", db_path=url))
            )
            for _ in range(n)
        ]


def _url(dsn: str) -> str:
    """The test database's DSN (``key=value`` words) as the URL ``--db`` takes."""
    words = dict(word.split("=", 1) for word in dsn.split())
    return f"postgresql://{words['user']}@{words['host']}:{words['port']}/{words['dbname']}"


@contextlib.asynccontextmanager
async def working(worker: Worker) -> AsyncIterator[Worker]:
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, WAIT)


async def test_a_job_enqueued_through_one_broker_is_pushed_by_another() -> None:
    async with brokers(2) as (a, b), Client(a.url) as publisher:
        got: asyncio.Queue[Job] = asyncio.Queue()
        worker = Worker(b.url, prefetch=4)

        @worker.handler("emails")
        async def handle(job: Job) -> None:
            await got.put(job)

        async with working(worker):
            ids = [await publisher.enqueue("emails", {"n": n}) for n in range(10)]
            seen = [await asyncio.wait_for(got.get(), WAIT) for _ in ids]
        assert sorted(job.id for job in seen) == sorted(ids)
        assert sorted(job.payload["n"] for job in seen) == list(range(10))


async def test_stats_on_any_broker_show_the_whole_table() -> None:
    async with brokers(2) as (a, b), Client(a.url) as on_a, Client(b.url) as on_b:
        await on_a.enqueue("reports", {"x": 1})
        await on_b.enqueue("reports", {"x": 2})
        await on_b.enqueue("reports", {"x": 3}, delay_s=3600)
        for client in (on_a, on_b):
            stats = (await client.stats())["reports"]
            assert (stats["ready"], stats["scheduled"]) == (2, 1)
            assert stats["totals"]["enqueued"] == 3


async def test_a_key_is_unique_across_brokers() -> None:
    async with brokers(2) as (a, b), Client(a.url) as on_a, Client(b.url) as on_b:
        first = await on_a.enqueue("invoices", {"n": 1}, key="invoice-7")
        again = await on_b.enqueue("invoices", {"n": 2}, key="invoice-7")
        assert again == first
        assert (await on_b.stats())["invoices"]["ready"] == 1


async def test_a_pause_through_one_broker_holds_the_queue_on_every_broker() -> None:
    async with brokers(2) as (a, b), Client(a.url) as admin:
        got: asyncio.Queue[Job] = asyncio.Queue()
        worker = Worker(b.url)

        @worker.handler("sync")
        async def handle(job: Job) -> None:
            await got.put(job)

        await admin.pause("sync")
        async with working(worker):
            job_id = await admin.enqueue("sync", {})
            # The worker is subscribed on b (its queue made there): nothing comes while
            # paused; a stats round trip through b shows the job still ready there.
            assert (await admin.stats())["sync"]["ready"] == 1
            assert got.empty()
            await admin.resume("sync")
            job = await asyncio.wait_for(got.get(), WAIT)
        assert job.id == job_id


async def test_a_cancel_through_one_broker_reaches_the_worker_on_another() -> None:
    async with brokers(2) as (a, b), Client(a.url) as admin:
        started = asyncio.Event()
        ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        worker = Worker(b.url)

        @worker.handler("long")
        async def handle(job: Job) -> None:
            started.set()
            try:
                await asyncio.sleep(3600)  # the job's work: it is cancelled long before
            except asyncio.CancelledError:
                ended.set_result(job.id)
                raise

        async with working(worker):
            job_id = await admin.enqueue("long", {})
            await asyncio.wait_for(started.wait(), WAIT)
            assert await admin.cancel(job_id) is True
            assert await asyncio.wait_for(ended, WAIT) == job_id
        assert await admin.get_job(job_id) is None


async def test_replies_keep_the_order_of_their_requests() -> None:
    async with brokers(1) as (a,), Client(a.url) as client:
        # Many requests in flight at once, each a transaction of its own: each reply
        # carries its own request's answer.
        ids = await asyncio.gather(*(client.enqueue("many", {"n": n}) for n in range(200)))
        jobs = await asyncio.gather(*(client.get_job(job_id) for job_id in ids))
        assert [job.payload["n"] for job in jobs if job is not None] == list(range(200))


@pytest.mark.parametrize("prefetch", [1, 8])
async def test_every_job_is_handled_once_with_workers_on_every_broker(prefetch: int) -> None:
    async with brokers(3) as cluster, Client(cluster[0].url) as publisher:
        handled: list[str] = []
        done = asyncio.Event()
        total = 300

        async def handle(job: Job) -> None:
            handled.append(job.id)
            if len(handled) >= total:
                done.set()

        workers = []
        for i, broker in enumerate(cluster * 2):
            worker = Worker(broker.url, prefetch=prefetch, worker_id=f"w{i}")
            worker.handler("bulk")(handle)
            workers.append(worker)
        async with contextlib.AsyncExitStack() as stack:
            for worker in workers:
                await stack.enter_async_context(working(worker))
            ids = await publisher.enqueue_many("bulk", [{"n": n} for n in range(total)])
            await asyncio.wait_for(done.wait(), WAIT * 3)
        assert sorted(handled) == sorted(ids)
        assert (await publisher.stats())["bulk"]["totals"]["completed"] == total


async def test_a_worker_whose_broker_stops_re_attaches_through_another_and_its_ack_lands(
    probe: Probe,
) -> None:
    async with database() as dsn:
        config = Config(port=0, store="postgres", db_path=_url(dsn))
        async with running_broker(config) as b, Client(b.url) as on_b:
            first = contextlib.AsyncExitStack()
            a = await first.enter_async_context(running_broker(config))
            started = asyncio.Event()
            release = asyncio.Event()
            runs: list[tuple[str, str]] = []  # (job id, lease) of each handler run
            worker = Worker([a.url, b.url], shuffle_urls=False, worker_id="steady")

            @worker.handler("long")
            async def handle(job: Job) -> None:
                runs.append((job.id, job.lease))
                started.set()
                await release.wait()

            async with working(worker):
                job_id = await on_b.enqueue("long", {})
                await asyncio.wait_for(started.wait(), WAIT)
                assert worker.url == a.url
                await first.aclose()  # the broker dies under the running job
                # Through b the worker re-attaches the lease the table still holds.
                again = await probe.count("subscribe", 2)
                assert again[1].fields["leases"] == [{"id": job_id, "lease": runs[0][1]}]
                assert again[1].result == {"reattached": [job_id]}
                release.set()
                assert (await probe.report("ack", job_id)).result == {"landed": True}
                assert worker.url == b.url
            assert runs == [(job_id, runs[0][1])]  # one run: never handed out again
            totals = (await on_b.stats())["long"]["totals"]
            assert (totals["completed"], totals["retried"]) == (1, 0)


async def test_a_job_enqueued_in_the_applications_transaction_is_pushed_once_it_commits() -> None:
    async with database() as dsn:
        config = Config(port=0, store="postgres", db_path=_url(dsn))
        async with running_broker(config) as broker, Client(broker.url) as client:
            got: asyncio.Queue[Job] = asyncio.Queue()
            worker = Worker(broker.url, prefetch=1)

            @worker.handler("orders")
            async def handle(job: Job) -> None:
                await got.put(job)

            async with working(worker), await psycopg.AsyncConnection.connect(dsn) as app:
                async with app.transaction():
                    await enqueue_tx_async(app, "orders", {"order": "rolled back"})
                    raise psycopg.Rollback()  # (the application changed its mind)
                async with app.transaction():
                    job_id = await enqueue_tx_async(app, "orders", {"order": "committed"})
                first = await asyncio.wait_for(got.get(), WAIT)
                # A job enqueued after both: once it came, the rolled-back one never will.
                await client.enqueue("orders", {"order": "after"})
                second = await asyncio.wait_for(got.get(), WAIT)
            assert (first.id, first.payload) == (job_id, {"order": "committed"})
            assert second.payload == {"order": "after"}
            assert got.empty()


async def test_a_broker_refuses_a_schema_newer_than_it_knows_and_says_so() -> None:
    async with database() as dsn:
        url = _url(dsn)
        async with running_broker(Config(port=0, store="postgres", db_path=url)):
            pass  # made the schema, at this broker's version
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("UPDATE conveyor_schema SET version = version + 1")
        done = await asyncio.to_thread(
            subprocess.run,
            conveyor("serve", "--db", url, "--port", "0"),
            capture_output=True,
            text=True,
            timeout=WAIT * 3,
            cwd=ROOT,
        )
        assert done.returncode == 2, done
        assert "newer than this broker's" in done.stderr
        assert "run a newer broker" in done.stderr


async def test_a_lease_a_worker_never_got_lapses_when_it_subscribes_elsewhere() -> None:
    async with brokers(2) as (a, b), Client(b.url) as client:
        job_id = await client.enqueue("lost", {"n": 1})
        # Broker a claims the job for worker "steady" and dies before pushing it: here,
        # a claim made for it that no connection of its was told of.
        ((claimed,),) = await a.backend.claim([Claim("steady", ("lost",), 1)])
        assert claimed.id == job_id
        got: asyncio.Queue[Job] = asyncio.Queue()
        worker = Worker(b.url, worker_id="steady")

        @worker.handler("lost")
        async def handle(job: Job) -> None:
            await got.put(job)

        async with working(worker):
            # It subscribes on b offering no lease: the one it never got lapses (its
            # attempt spent) and the job comes to it again, under a new lease.
            job = await asyncio.wait_for(got.get(), WAIT)
        assert (job.id, job.attempt) == (job_id, 2)
        assert job.lease != claimed.lease
