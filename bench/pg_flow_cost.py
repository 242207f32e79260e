"""What flow control costs the PostgreSQL backend (``docs/contract.md``, FLW-10).

    .venv/bin/python bench/pg_flow_cost.py
    .venv/bin/python bench/pg_flow_cost.py --depth 20000 --rounds 15 --drain 20000

Everything goes through the backend interface: one ``PostgresBackend`` on a database of
its own (``conveyor_bench_flow_<random>``, made for the run and dropped after it, on the
server BENCH_PG, by default ``host=127.0.0.1 port=5432 user=postgres``), on a manual
clock that moves a millisecond per round. Three measurements:

* keys: the same depth of ready work spread over 10 partition keys and over 10,000,
  under ``partition_concurrency`` 2. Each round claims ``--batch`` jobs per claim call,
  ``--calls`` times; only the claim is timed, and each job claimed is acked and one of
  its key enqueued again outside the timer, so the depth and the keys stay where they
  are. The first round is not counted, and the database is vacuumed after it (as
  autovacuum would keep it). The figure is the median over rounds of the time per job
  handed out. FLW-10 asks that a claim not walk the keys, so the ratio should stay
  near 1.
* drain: N plain jobs claimed in batches of 64 and acked, with no limits and with a
  concurrency and a rate so large that they never bind (the flow path, its advisory
  lock and its counts against the plain claim). The two alternate; the best of each.
* enqueue: N jobs of no key enqueued one call at a time and in calls of 500, on a queue
  with no limits, and the same with a partition key: what flow control's indexes cost
  an enqueue that does not use them. The best of the repeats.

Timings on a shared machine are noisy: compare the ratios printed in one run, not
absolute times across runs. To compare with another checkout, run this file with
``PYTHONPATH`` pointing at that checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from psycopg import sql

from conveyor.broker.backend import Claim, Enqueue
from conveyor.broker.backend.postgres import PostgresBackend
from conveyor.broker.engine import Limits
from conveyor.broker.scheduler import SteppedScheduler

SERVER = os.environ.get("BENCH_PG", "host=127.0.0.1 port=5432 user=postgres")
PAYLOAD = {"to": "someone@example.com", "subject": "hello", "body": "x" * 45}
NEVER_BINDS = 2**31 - 1
#: Limits of a queue that never bind: a concurrency and a rate no run reaches.
GENEROUS = Limits(concurrency=NEVER_BINDS, rate=NEVER_BINDS, per_s=1.0, burst=NEVER_BINDS)
FILL_CHUNK = 1_000
DRAIN_BATCH = 64


@asynccontextmanager
async def database() -> AsyncIterator[str]:
    """The DSN of a new database of this run's own, dropped after."""
    name = f"conveyor_bench_flow_{secrets.token_hex(6)}"
    admin = await psycopg.AsyncConnection.connect(f"{SERVER} dbname=postgres", autocommit=True)
    try:
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield f"{SERVER} dbname={name}"
        finally:
            await admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    finally:
        await admin.close()


async def backend(dsn: str, clock: SteppedScheduler) -> PostgresBackend:
    return await PostgresBackend.open(dsn, clock, max_payload_bytes=1 << 20, id_prefix="b-")


async def analyze(dsn: str) -> None:
    """Statistics and dead rows as autovacuum would have them in a live database."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("VACUUM ANALYZE")


async def fill(be: PostgresBackend, queue: str, jobs: int, keys: int) -> dict[str, str | None]:
    """``jobs`` ready jobs on ``queue``, dealt over ``keys`` keys (0: none) in turn; each
    id's key."""
    part: dict[str, str | None] = {}
    for start in range(0, jobs, FILL_CHUNK):
        names = [
            None if not keys else f"k{i % keys}"
            for i in range(start, min(jobs, start + FILL_CHUNK))
        ]
        got = await be.enqueue([Enqueue(queue, PAYLOAD, partition=name) for name in names])
        for job_id, name in zip(got, names, strict=True):
            assert isinstance(job_id, str), job_id
            part[job_id] = name
    return part


async def claim_cost(dsn: str, keys: int, args: argparse.Namespace) -> float:
    """Median over rounds of the claim time per job handed out, in µs."""
    clock = SteppedScheduler(start=1_000_000.0)
    be = await backend(dsn, clock)
    queue = f"keys{keys}"
    try:
        await be.set_limits(queue, Limits(partition_concurrency=2))
        part = await fill(be, queue, args.depth, keys)
        costs: list[float] = []
        for round_ in range(args.rounds + 1):
            if round_ == 1:
                # (The first round is not counted: its first claim takes in what the
                # fill told of the keys, and the vacuum then clears what that left.)
                await analyze(dsn)
                costs.clear()
            clock.advance(0.001)
            spent = 0.0
            handed = 0
            for _ in range(args.calls):
                start = time.perf_counter()
                (got,) = await be.claim([Claim("w", (queue,), args.batch)])
                spent += time.perf_counter() - start
                assert len(got) == args.batch, len(got)
                handed += len(got)
                assert all(await be.ack([(c.id, c.lease) for c in got]))
                names = [part.pop(c.id) for c in got]
                again = await be.enqueue([Enqueue(queue, PAYLOAD, partition=n) for n in names])
                for job_id, name in zip(again, names, strict=True):
                    assert isinstance(job_id, str)
                    part[job_id] = name
            costs.append(spent / handed * 1e6)
        return statistics.median(costs)
    finally:
        await be.close()


async def drain_time(dsn: str, jobs: int, limits: Limits, tag: str) -> float:
    """Seconds to claim (in batches of ``DRAIN_BATCH``) and ack ``jobs`` plain jobs."""
    clock = SteppedScheduler(start=1_000_000.0)
    be = await backend(dsn, clock)
    queue = f"drain-{tag}"
    try:
        await be.set_limits(queue, limits)
        await fill(be, queue, jobs, 0)
        await analyze(dsn)
        done = 0
        start = time.perf_counter()
        while True:
            (got,) = await be.claim([Claim("w", (queue,), DRAIN_BATCH)])
            if not got:
                break
            assert all(await be.ack([(c.id, c.lease) for c in got]))
            done += len(got)
        spent = time.perf_counter() - start
        assert done == jobs, (done, jobs)
        return spent
    finally:
        await be.close()


async def enqueue_time(dsn: str, jobs: int, batch: int, partition: str | None, tag: str) -> float:
    """Seconds per job to enqueue ``jobs`` jobs in calls of ``batch``."""
    clock = SteppedScheduler(start=1_000_000.0)
    be = await backend(dsn, clock)
    queue = f"enq-{tag}"
    try:
        await be.enqueue([Enqueue(queue, PAYLOAD)])  # the queue made, its options known
        start = time.perf_counter()
        for first in range(0, jobs, batch):
            n = min(batch, jobs - first)
            got = await be.enqueue([Enqueue(queue, PAYLOAD, partition=partition)] * n)
            assert all(isinstance(job_id, str) for job_id in got)
        return (time.perf_counter() - start) / jobs
    finally:
        await be.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--depth", type=int, default=20_000, help="ready jobs for keys")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=10, help="claim calls per round")
    parser.add_argument("--batch", type=int, default=10, help="jobs per claim call")
    parser.add_argument("--drain", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--enqueue", type=int, default=5_000, help="jobs per enqueue run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["keys", "drain", "enqueue"], default=None)
    args = parser.parse_args()

    async with database() as dsn:
        if args.only in (None, "keys"):
            few = await claim_cost(dsn, 10, args)
            many = await claim_cost(dsn, 10_000, args)
            print(
                f"claim under partition_concurrency=2, {args.depth:,} ready jobs, "
                f"{args.batch} jobs a call"
            )
            print(f"{'keys':>8}{'per job':>12}")
            print(f"{10:>8,}{few:>9.0f} µs")
            print(f"{10_000:>8,}{many:>9.0f} µs")
            print(f"ratio 10,000 keys / 10 keys: {many / few:.2f}x")
            print()
        if args.only in (None, "drain"):
            plain: list[float] = []
            generous: list[float] = []
            for i in range(args.repeats):
                plain.append(await drain_time(dsn, args.drain, Limits(), f"p{i}"))
                generous.append(await drain_time(dsn, args.drain, GENEROUS, f"g{i}"))
            best_plain, best_generous = min(plain), min(generous)
            print(f"drain of {args.drain:,} jobs, batches of {DRAIN_BATCH}, best of {args.repeats}")
            print(f"{'limits':<34}{'seconds':>9}{'jobs/s':>10}")
            for name, spent in (
                ("none", best_plain),
                ("concurrency and rate, never bind", best_generous),
            ):
                print(f"{name:<34}{spent:>9.2f}{args.drain / spent:>10,.0f}")
            print(f"ratio with limits / without: {best_generous / best_plain:.2f}x")
            print()
        if args.only in (None, "enqueue"):
            print(f"enqueue of {args.enqueue:,} jobs, no limits, best of {args.repeats}")
            print(f"{'case':<30}{'per job':>10}")
            for batch in (1, 500):
                for partition in (None, "k"):
                    jobs = args.enqueue if batch > 1 else args.enqueue // 5
                    best = min(
                        [
                            await enqueue_time(
                                dsn, jobs, batch, partition, f"{batch}{partition}{i}"
                            )
                            for i in range(args.repeats)
                        ]
                    )
                    case = f"calls of {batch}, {'a key' if partition else 'no key'}"
                    print(f"{case:<30}{best * 1e6:>7.1f} µs")


if __name__ == "__main__":
    asyncio.run(main())
