"""Every backend gives the same answers to the same calls (hypothesis).

Random sequences of calls (enqueue with options and keys, claims, acks, retries, fails,
heartbeats, lapses, cancels, redrives, pauses, sweeps, and time passing) run in lock
step on each backend, each on its own manual clock and an rng seeded alike. Every answer
must match the memory backend's, ids and leases compared by the order they were first
seen; and what each durable backend kept (SQLite's files, PostgreSQL's database: one
for the test, emptied before each example), opened again after the last call, holds the
same table.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.broker.backend import Backend, Claim, Enqueue, Report
from conveyor.broker.engine import InvalidArgument, Job
from conveyor.broker.scheduler import SteppedScheduler

from .conftest import DURABLE_KINDS, KINDS, START, make_backend, open_kept
from .pg import database_sync, empty

QUEUES = ["a", "b"]

PUT = st.tuples(
    st.just("put"),
    st.sampled_from(QUEUES),
    st.integers(0, 2),  # priority
    st.sampled_from([None, 0.0, 10.0]),  # delay_s
    st.integers(0, 3),  # max_attempts (0: refused)
    st.sampled_from([None, "k1", "k2"]),  # key
    st.sampled_from([None, 15.0]),  # expires_s
)
TAKE = st.tuples(
    st.just("take"),
    st.sampled_from([("a",), ("b",), ("a", "b"), ("b", "a")]),
    st.integers(1, 3),
    st.sampled_from(["w1", "w2"]),
)
ON_LEASE = st.tuples(
    st.sampled_from(["ack", "retry", "retry_now", "fail", "heartbeat", "lapse"]),
    st.integers(0, 20),
)
ON_JOB = st.tuples(st.sampled_from(["cancel", "redrive", "get"]), st.integers(0, 20))
QUEUE_OPS = ["pause", "resume", "purge", "stats"]
ON_QUEUE = st.tuples(st.sampled_from(QUEUE_OPS), st.sampled_from(QUEUES))
OTHER = st.tuples(st.sampled_from(["sweep", "held"]))
ADVANCE = st.tuples(st.just("advance"), st.sampled_from([1.0, 5.0, 10.0, 40.0, 400.0]))
CALLS = st.lists(st.one_of(PUT, TAKE, ON_LEASE, ON_JOB, ON_QUEUE, OTHER, ADVANCE), max_size=40)


class Run:
    """One backend driven through the calls, its ids and leases named by first sight."""

    def __init__(self, kind: str, path: Path, dsn: str, backend: Backend) -> None:
        self.kind = kind
        self.path = path
        self.dsn = dsn
        self.clock = SteppedScheduler(start=START)
        self.backend = backend
        self.ids: list[str] = []
        self.leases: list[tuple[str, str]] = []
        self.names: dict[str, str] = {}

    @classmethod
    async def start(cls, kind: str, folder: Path, dsn: str) -> Run:
        run = cls(kind, folder / f"{kind}.db", dsn, None)  # type: ignore[arg-type]
        run.backend = await make_backend(
            kind, run.path, dsn, run.clock, rng=random.Random(99), id_prefix="j"
        )
        return run

    def name(self, token: str) -> str:
        """A stable name for an id or a lease: the order it was first seen in."""
        return self.names.setdefault(token, f"#{len(self.names)}")

    def job(self, job: Job | None) -> Any:
        if job is None:
            return None
        return (
            self.name(job.id), job.queue, job.state, job.priority, job.attempts,
            job.max_attempts, job.ready_at, job.expires_at, job.worker_id, job.deadline,
            job.last_error, job.died_at, job.key,
        )  # fmt: skip

    async def call(self, call: tuple[Any, ...]) -> Any:
        b = self.backend
        op = call[0]
        if op == "put":
            _, queue, priority, delay, attempts, key, expires = call
            job = Enqueue(queue, None, priority=priority, delay_s=delay, max_attempts=attempts,
                          key=key, expires_s=expires)  # fmt: skip
            (result,) = await b.enqueue([job])
            if isinstance(result, InvalidArgument):
                return ("refused", result.field)
            if result not in self.ids:
                self.ids.append(result)
            return self.name(result)
        if op == "take":
            _, queues, n, worker = call
            (got,) = await b.claim([Claim(worker, queues, n)])
            self.leases.extend((c.id, c.lease) for c in got)
            return [(self.name(c.id), self.name(c.lease), c.attempt, c.deadline) for c in got]
        if op in ("ack", "retry", "retry_now", "fail", "heartbeat", "lapse"):
            if not self.leases:
                return None
            lease = self.leases[call[1] % len(self.leases)]
            if op == "ack":
                return await b.ack([lease])
            if op == "heartbeat":
                return await b.heartbeat([lease])
            if op == "lapse":
                return await b.lapse([lease])
            delay = 0.0 if op == "retry_now" else None
            return await b.report([Report(*lease, retry=op != "fail", error="e", delay_s=delay)])
        if op in ("cancel", "redrive", "get"):
            if not self.ids:
                return None
            job_id = self.ids[call[1] % len(self.ids)]
            if op == "cancel":
                return await b.cancel([job_id])
            if op == "redrive":
                return await b.redrive([job_id])
            return self.job((await b.get_jobs([job_id]))[0])
        if op == "pause":
            return await b.pause(call[1])
        if op == "resume":
            return await b.resume(call[1])
        if op == "purge":
            return await b.purge_dead(call[1])
        if op == "stats":
            return await b.stats([call[1]])
        if op == "sweep":
            return await b.sweep()
        if op == "held":
            held = await b.held_leases()
            return sorted((self.name(i), self.name(lease), w) for i, lease, w in held)
        assert op == "advance"
        await asyncio.sleep(0)  # (the backend sets its timer once the loop turn is over)
        self.clock.advance(call[1])
        return None

    async def table(self) -> list[Any]:
        jobs = await self.backend.get_jobs(self.ids)
        return [self.job(job) for job in jobs]


async def agree(calls: list[tuple[Any, ...]], dsn: str) -> None:
    await empty(dsn)
    with tempfile.TemporaryDirectory() as folder:
        runs = {kind: await Run.start(kind, Path(folder), dsn) for kind in KINDS}
        try:
            for call in calls:
                answers = {kind: await run.call(call) for kind, run in runs.items()}
                want = answers["memory"]
                for kind, got in answers.items():
                    assert got == want, (kind, call, got, want)
            final = await runs["memory"].table()
            for kind in DURABLE_KINDS:
                assert await runs[kind].table() == final, kind
        finally:
            for run in runs.values():
                await run.backend.close()
        for kind in DURABLE_KINDS:
            run = runs[kind]
            reopened = await open_kept(kind, run.path, run.dsn, run.clock)
            try:
                jobs = await reopened.get_jobs(run.ids)
                assert [run.job(job) for job in jobs] == final, f"{kind} after a restart"
            finally:
                await reopened.close()


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    """One database for the module's examples (each one empties it first)."""
    with database_sync() as dsn:
        yield dsn


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(CALLS)
def test_every_backend_answers_alike(pg_dsn: str, calls: list[tuple[Any, ...]]) -> None:
    asyncio.run(agree(calls, pg_dsn))
