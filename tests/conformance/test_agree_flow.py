"""The PostgreSQL backend hands out jobs under flow control in the engine's order
(hypothesis): FLW-2 to FLW-6.

Random sequences of calls on one queue with limits (enqueues with partition keys and
priorities, some delayed; claims; acks, retries, fails, lapses, back-offs and cancels of
the leases handed out; cancels; time passing) run in lock step on the memory backend and on
PostgreSQL, each on its own manual clock; every answer must match, ids and leases
compared by the order they were first seen. The examples are a fixed draw (derandomized):
docs/architecture.md says where PostgreSQL's turns may still differ from the engine's.
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

from conveyor.broker.backend import Backend, BackOff, Claim, Enqueue, Report
from conveyor.broker.engine import Limits
from conveyor.broker.scheduler import SteppedScheduler

from .conftest import START, make_backend
from .pg import database_sync, empty

KINDS = ["memory", "postgres"]

LIMITS = st.sampled_from(
    [
        Limits(partition_concurrency=1_000_000),
        Limits(partition_concurrency=1),
        Limits(partition_concurrency=2, concurrency=3),
        Limits(partition_rate=1, partition_per_s=5.0),
        Limits(rate=2, per_s=1.0, burst=2, partition_concurrency=1),
    ]
)
PUT = st.tuples(
    st.just("put"),
    st.integers(0, 1),  # priority
    st.sampled_from([None, None, None, 5.0]),  # delay_s
    st.sampled_from([None, "a", "b", "c", "d"]),  # partition
)
TAKE = st.tuples(st.just("take"), st.integers(1, 3))
ON_LEASE = st.tuples(
    st.sampled_from(["ack", "ack", "retry_now", "fail", "lapse", "back_off", "back_off_queue"]),
    st.integers(0, 20),
)
CANCEL = st.tuples(st.just("cancel"), st.integers(0, 20))
ADVANCE = st.tuples(st.just("advance"), st.sampled_from([1.0, 5.0, 20.0]))
CALLS = st.lists(st.one_of(PUT, PUT, TAKE, TAKE, ON_LEASE, CANCEL, ADVANCE), max_size=40)


class Run:
    def __init__(self, backend: Backend, clock: SteppedScheduler) -> None:
        self.backend = backend
        self.clock = clock
        self.ids: list[str] = []
        self.leases: list[tuple[str, str]] = []
        self.names: dict[str, str] = {}

    def name(self, token: str) -> str:
        return self.names.setdefault(token, f"#{len(self.names)}")

    async def call(self, call: tuple[Any, ...]) -> Any:
        b = self.backend
        op = call[0]
        if op == "put":
            _, priority, delay, partition = call
            (result,) = await b.enqueue(
                [Enqueue("q", None, priority=priority, delay_s=delay, partition=partition)]
            )
            assert isinstance(result, str), result
            self.ids.append(result)
            return self.name(result)
        if op == "take":
            (got,) = await b.claim([Claim("w", ("q",), call[1])])
            self.leases.extend((c.id, c.lease) for c in got)
            return [(self.name(c.id), self.name(c.lease), c.attempt) for c in got]
        if op == "cancel":
            if not self.ids:
                return None
            return await b.cancel([self.ids[call[1] % len(self.ids)]])
        if op == "advance":
            await asyncio.sleep(0)  # (the backend sets its timer once the loop turn is over)
            self.clock.advance(call[1])
            return None
        if not self.leases:
            return None
        lease = self.leases[call[1] % len(self.leases)]
        if op == "ack":
            return await b.ack([lease])
        if op == "lapse":
            return await b.lapse([lease])
        if op == "back_off":
            return await b.back_off([BackOff(*lease, 3.0)])
        if op == "back_off_queue":
            return await b.back_off([BackOff(*lease, 2.0, whole_queue=True)])
        delay = 0.0 if op == "retry_now" else None
        return await b.report([Report(*lease, retry=op != "fail", error="e", delay_s=delay)])


async def agree(limits: Limits, calls: list[tuple[Any, ...]], dsn: str) -> None:
    await empty(dsn)
    with tempfile.TemporaryDirectory() as folder:
        runs: dict[str, Run] = {}
        for kind in KINDS:
            clock = SteppedScheduler(start=START)
            backend = await make_backend(
                kind, Path(folder) / f"{kind}.db", dsn, clock, rng=random.Random(5)
            )
            runs[kind] = Run(backend, clock)
        try:
            for run in runs.values():
                await run.backend.set_limits("q", limits)
            for call in calls:
                answers = {kind: await run.call(call) for kind, run in runs.items()}
                want = answers["memory"]
                for kind, got in answers.items():
                    assert got == want, (kind, call, got, want)
        finally:
            for run in runs.values():
                await run.backend.close()


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    """One database for the module's examples (each one empties it first)."""
    with database_sync() as dsn:
        yield dsn


@settings(
    max_examples=120,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(LIMITS, CALLS)
def test_postgres_hands_out_jobs_under_limits_in_the_engines_order(
    pg_dsn: str, limits: Limits, calls: list[tuple[Any, ...]]
) -> None:
    asyncio.run(agree(limits, calls, pg_dsn))
