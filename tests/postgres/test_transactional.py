"""Enqueue inside the application's transaction: ``conveyor_enqueue`` (schema v3) and the
SDK's ``enqueue_tx`` / ``enqueue_tx_async`` (docs/postgres.md).

A job stored by the function must be, for the brokers, a job like any other: heard of
once its transaction commits (never when it rolls back), claimed with the payload and
options it was given, counted, keyed (ENQ-10) and checked (ENQ-7 to ENQ-9) as the
backend's own enqueue does. Each test has a database of its own (``pg.database``), but
for the tables of refusals and resolutions, which share one and keep to queues of their
own. The brokers' clock is a ``SteppedScheduler`` started by the database's clock (the
function stamps jobs with the database's time); news from the database comes on the real
clock, waited for with a bound, never slept for.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from psycopg import sql

from conveyor import sdk
from conveyor.broker.backend import Claim, Enqueue, Report
from conveyor.broker.backend._pg_schema import SCHEMA_VERSION, migrate
from conveyor.broker.backend.postgres import PostgresBackend
from conveyor.broker.engine import InvalidArgument as EngineInvalidArgument
from conveyor.broker.engine import Job, Limits, QueueOpts
from conveyor.broker.scheduler import SteppedScheduler
from conveyor.sdk import InvalidArgument, TooLarge, enqueue_tx, enqueue_tx_async
from tests.conformance.conftest import Heard
from tests.conformance.pg import database, database_sync

from ..conformance.pg import db_now
from ..conformance.pg import until as _until

ROOT = Path(__file__).resolve().parent.parent.parent
# The size limit of the shared database, set as docs/postgres.md says, and the brokers'.
LIMIT = 1024


async def _open(
    dsn: str, *, limit: int = 1 << 20, ahead: float = 60.0
) -> tuple[PostgresBackend, SteppedScheduler]:
    """A broker's backend on ``dsn`` (its schema made), its clock ``ahead`` of the
    database's: a minute, so that a job the function stamps with the database's time is
    ready for it."""
    clock = SteppedScheduler(start=await db_now(dsn) + ahead)
    backend = await PostgresBackend.open(
        dsn, clock, max_payload_bytes=limit, rng=random.Random(0), id_prefix="j-"
    )
    return backend, clock


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    async with database() as made:
        yield made


@pytest.fixture
async def broker(dsn: str) -> AsyncIterator[tuple[PostgresBackend, SteppedScheduler, Heard]]:
    backend, clock = await _open(dsn)
    heard = Heard()
    backend.listen(heard)
    try:
        yield backend, clock, heard
    finally:
        await backend.close()


async def _app(dsn: str) -> psycopg.AsyncConnection[tuple[Any, ...]]:
    """The application's connection: transactions of its own, as psycopg makes them."""
    return await psycopg.AsyncConnection.connect(dsn)


async def _marker(dsn: str, heard: Heard, queue: str = "marker") -> None:
    """Commit a job on ``queue`` and wait until the broker heard of it. Notices reach
    the listening connection in commit order: whatever an earlier commit told has been
    heard by then, so what was not heard was not told."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await enqueue_tx_async(conn, queue, None)
    await _until(lambda: frozenset([queue]) in heard.work)


# -- commit and rollback -----------------------------------------------------------------


async def test_a_committed_job_is_heard_claimed_and_counted_as_the_brokers_own(
    dsn: str, broker: tuple[PostgresBackend, SteppedScheduler, Heard]
) -> None:
    backend, _, heard = broker
    async with await _app(dsn) as conn:
        async with conn.transaction():
            await conn.execute("CREATE TABLE orders (id int)")  # the application's own row
            await conn.execute("INSERT INTO orders VALUES (1)")
            job_id = await enqueue_tx_async(
                conn, "emails", {"to": "a", "n": [1, 2.5]}, priority=5, max_attempts=4
            )
            # Not there for the brokers before the commit, nor told of.
            assert await backend.get_jobs([job_id]) == [None]
            assert not heard.told_work("emails")
        await _until(lambda: heard.told_work("emails"))
    assert frozenset(["emails"]) in heard.work
    assert job_id.startswith(backend.id_prefix)
    stats = (await backend.stats(["emails"]))["emails"]
    assert (stats.ready, stats.scheduled, stats.totals.enqueued) == (1, 0, 1)
    ((claimed,),) = await backend.claim([Claim("w1", ("emails",), 5)])
    assert claimed.id == job_id
    assert claimed.payload_json == b'{"to":"a","n":[1,2.5]}'  # the bytes Client.enqueue sends
    assert (claimed.priority, claimed.attempt, claimed.max_attempts) == (5, 1, 4)
    assert claimed.visibility_timeout_s == QueueOpts().visibility_timeout_s
    assert await backend.ack([(claimed.id, claimed.lease)]) == [True]
    stats = (await backend.stats(["emails"]))["emails"]
    assert (stats.ready, stats.processing, stats.totals.completed) == (0, 0, 1)


async def test_a_rolled_back_job_is_neither_stored_nor_told(
    dsn: str, broker: tuple[PostgresBackend, SteppedScheduler, Heard]
) -> None:
    backend, _, heard = broker
    async with await _app(dsn) as conn:
        await conn.execute("SELECT 1")  # (the transaction psycopg opened)
        job_id = await enqueue_tx_async(conn, "emails", {"to": "a"})
        await conn.rollback()
    await _marker(dsn, heard)
    assert not heard.told_work("emails")
    assert await backend.get_jobs([job_id]) == [None]
    # The queue the function made went with it.
    assert "emails" not in await backend.queues()
    assert await backend.claim([Claim("w1", ("emails",), 5)]) == [[]]


async def test_one_notice_per_queue_and_transaction(
    dsn: str, broker: tuple[PostgresBackend, SteppedScheduler, Heard]
) -> None:
    backend, _, heard = broker
    async with await _app(dsn) as conn:
        async with conn.transaction():
            ids = [await enqueue_tx_async(conn, "a", i) for i in range(3)]
            ids.append(await enqueue_tx_async(conn, "b", 3))
    await _marker(dsn, heard)
    assert heard.work.count(frozenset(["a"])) == 1
    assert heard.work.count(frozenset(["b"])) == 1
    assert len(set(ids)) == 4
    (taken,) = await backend.claim([Claim("w1", ("a", "b"), 10)])
    assert [c.id for c in taken] == ids  # a's three in order, then b's


async def test_a_delayed_job_becomes_claimable_when_the_brokers_clock_reaches_it(
    dsn: str, broker: tuple[PostgresBackend, SteppedScheduler, Heard]
) -> None:
    backend, clock, heard = broker
    async with await _app(dsn) as conn:
        async with conn.transaction():
            job_id = await enqueue_tx_async(conn, "later", "x", delay_s=3600.0)
    await _until(lambda: heard.told_work("later"))
    stats = (await backend.stats(["later"]))["later"]
    assert (stats.ready, stats.scheduled) == (0, 1)
    assert await backend.claim([Claim("w1", ("later",), 1)]) == [[]]
    heard.forget()
    # The broker's timer is set for the job's ready time: when its clock passes it, the
    # broker tells its listeners that work may be waiting, and the job is handed out.
    await backend.settle()
    clock.advance(7200.0)
    await _until(lambda: None in heard.work)
    ((claimed,),) = await backend.claim([Claim("w1", ("later",), 1)])
    assert claimed.id == job_id


# -- partition keys (FLW-3) ----------------------------------------------------------------


async def test_a_partition_key_holds_the_job_to_its_keys_limit_flw_3(
    dsn: str, broker: tuple[PostgresBackend, SteppedScheduler, Heard]
) -> None:
    backend, _, heard = broker
    await backend.set_limits("tenants", Limits(partition_concurrency=1))
    async with await _app(dsn) as conn:
        async with conn.transaction():
            a1 = await enqueue_tx_async(conn, "tenants", 1, partition="a")
            a2 = await enqueue_tx_async(conn, "tenants", 2, partition="a")
            b1 = await enqueue_tx_async(conn, "tenants", 3, partition="b")
            plain = await enqueue_tx_async(conn, "tenants", 4, partition="")
    await _until(lambda: heard.told_work("tenants"))
    job = (await backend.get_jobs([a1]))[0]
    assert job is not None and job.partition == "a"
    (taken,) = await backend.claim([Claim("w1", ("tenants",), 10)])
    # One of key a at a time, the keys in turn, the jobs of no key as one more key
    # (never served yet: first, as in the engine).
    assert [c.id for c in taken] == [plain, a1, b1]
    assert await backend.claim([Claim("w1", ("tenants",), 10)]) == [[]]
    assert await backend.ack([(taken[1].id, taken[1].lease)]) == [True]  # a's slot frees
    ((again,),) = await backend.claim([Claim("w1", ("tenants",), 10)])
    assert again.id == a2


def test_a_sync_enqueue_with_a_partition_key(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate_sync(conn)
        job_id = enqueue_tx(conn, "q", {"n": 1}, partition="tenant-7")
        cur = conn.execute(
            "SELECT partition FROM conveyor_jobs WHERE seq = %s",
            (int(job_id.removeprefix(_prefix(conn)), 16),),
        )
        assert cur.fetchone() == ("tenant-7",)


async def test_a_job_waits_for_the_jobs_named_in_after_whichever_driver_dep_1_dep_7(
    dsn: str, broker: tuple[PostgresBackend, SteppedScheduler, Heard]
) -> None:
    backend, _, heard = broker
    (dep,) = await backend.enqueue([Enqueue("deps", "a")])
    assert isinstance(dep, str)
    async with await _app(dsn) as conn:
        async with conn.transaction():
            waits = await enqueue_tx_async(conn, "q", 1, after=[dep], partition="t")
        async with conn.transaction():
            with pytest.raises(InvalidArgument) as caught:
                await enqueue_tx_async(conn, "q", 2, after=[dep, "j-ffff"])
        assert caught.value.field == "after[1]"
    also = await _asyncpg(dsn, queue="q", payload=3, after=(dep,))
    with pytest.raises(InvalidArgument) as caught:
        await _asyncpg(dsn, queue="q", payload=4, after=dep)
    assert caught.value.field == "after"
    jobs = await backend.get_jobs([waits, also])
    assert [(j.state.value, j.after) for j in jobs if j is not None] == [("waiting", (dep,))] * 2
    ((claimed,),) = await backend.claim([Claim("w", ("deps", "q"), 5)])
    assert claimed.id == dep
    heard.forget()
    await backend.ack([(dep, claimed.lease)])
    assert heard.told_work("q")
    (taken,) = await backend.claim([Claim("w", ("q",), 5)])
    assert sorted(c.id for c in taken) == sorted([waits, also])


def migrate_sync(conn: psycopg.Connection[Any]) -> None:
    """The schema made on ``conn``'s database (as a broker makes it at its start)."""

    async def make() -> None:
        async with await psycopg.AsyncConnection.connect(conn.info.dsn, autocommit=True) as c:
            await migrate(c, "s-")

    asyncio.run(make())


def _prefix(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT id_prefix FROM conveyor_meta").fetchone()
    assert row is not None
    return str(row[0])


# -- keys (ENQ-10) -----------------------------------------------------------------------


async def test_a_key_is_one_job_whichever_path_enqueued_it(
    dsn: str, broker: tuple[PostgresBackend, SteppedScheduler, Heard]
) -> None:
    backend, _, _ = broker
    (by_broker,) = await backend.enqueue([Enqueue("q", 1, key="k1")])
    async with await _app(dsn) as conn:
        async with conn.transaction():
            assert await enqueue_tx_async(conn, "q", 2, key="k1") == by_broker
            by_function = await enqueue_tx_async(conn, "q", 3, key="k2")
            # A second call of the same transaction finds its own job.
            assert await enqueue_tx_async(conn, "q", 4, key="k2") == by_function
            # Keys of another queue never meet.
            assert await enqueue_tx_async(conn, "other", 5, key="k2") != by_function
    assert await backend.enqueue([Enqueue("q", 6, key="k2")]) == [by_function]
    stats = (await backend.stats(["q"]))["q"]
    assert stats.totals.enqueued == 2
    (one, two) = await backend.get_jobs([by_broker, by_function])
    assert one is not None and one.payload_json == b"1"
    assert two is not None and two.payload_json == b"3"
    # Once the job is gone, its key is free again.
    assert await backend.cancel([by_function]) == [True]
    async with await _app(dsn) as conn:
        async with conn.transaction():
            fresh = await enqueue_tx_async(conn, "q", 7, key="k2")
    assert fresh != by_function


async def _waits_on_a_lock(dsn: str, backend: PostgresBackend) -> None:
    """Until the backend's connection waits for a lock another transaction holds."""
    pid = backend._conn.info.backend_pid
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:

        async def waiting() -> bool:
            cur = await conn.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
            )
            row = await cur.fetchone()
            return row is not None and bool(row[0])

        loop = asyncio.get_running_loop()
        end = loop.time() + 10.0
        while not await waiting():
            assert loop.time() < end, "the broker's enqueue never waited"
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
async def test_a_key_held_by_an_open_transaction_decides_a_brokers_enqueue_at_its_end(
    dsn: str, broker: tuple[PostgresBackend, SteppedScheduler, Heard], commit: bool
) -> None:
    backend, _, _ = broker
    await backend.set_queue("q")
    async with await _app(dsn) as conn:
        await conn.execute("SELECT 1")
        held = await enqueue_tx_async(conn, "q", 1, key="k")
        put = backend.enqueue([Enqueue("q", 2, key="k")])
        await _waits_on_a_lock(dsn, backend)
        assert not put.done()
        await (conn.commit() if commit else conn.rollback())
        (answer,) = await put
    assert isinstance(answer, str)
    assert (answer == held) is commit
    (job,) = await backend.get_jobs([answer])
    assert job is not None and job.payload_json == (b"1" if commit else b"2")


async def test_a_dead_jobs_key_is_still_taken(
    dsn: str, broker: tuple[PostgresBackend, SteppedScheduler, Heard]
) -> None:
    backend, _, _ = broker
    async with await _app(dsn) as conn:
        async with conn.transaction():
            job_id = await enqueue_tx_async(conn, "q", 1, key="k", max_attempts=1)
    ((claimed,),) = await backend.claim([Claim("w1", ("q",), 1)])
    assert await backend.report([Report(claimed.id, claimed.lease, retry=False)]) == [True]
    async with await _app(dsn) as conn:
        async with conn.transaction():
            assert await enqueue_tx_async(conn, "q", 2, key="k") == job_id


# -- the three drivers, and plain SQL ----------------------------------------------------


async def _psycopg_sync(dsn: str, **job: Any) -> str:
    def run() -> str:
        with psycopg.connect(dsn) as conn:
            with conn.transaction():
                return enqueue_tx(conn, **job)

    return await asyncio.to_thread(run)


async def _psycopg_async(dsn: str, **job: Any) -> str:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction():
            return await enqueue_tx_async(conn, **job)


async def _asyncpg(dsn: str, **job: Any) -> str:
    conn = await asyncpg.connect(_url(dsn))
    try:
        async with conn.transaction():
            return await enqueue_tx_async(conn, **job)
    finally:
        await conn.close()


async def _asyncpg_pool(dsn: str, **job: Any) -> str:
    async with asyncpg.create_pool(_url(dsn), min_size=1, max_size=1) as pool:
        async with pool.acquire() as conn, conn.transaction():
            return await enqueue_tx_async(conn, **job)


def _url(dsn: str) -> str:
    """The libpq keyword DSN as the URL asyncpg takes."""
    parts = dict(item.split("=", 1) for item in dsn.split())
    return (
        f"postgresql://{parts.get('user', 'postgres')}@{parts.get('host', '127.0.0.1')}:"
        f"{parts.get('port', '5432')}/{parts['dbname']}"
    )


DRIVERS: dict[str, Callable[..., Awaitable[str]]] = {
    "psycopg": _psycopg_sync,
    "psycopg-async": _psycopg_async,
    "asyncpg": _asyncpg,
    "asyncpg-pool": _asyncpg_pool,
}


@pytest.mark.parametrize("driver", list(DRIVERS))
async def test_each_driver_stores_the_job_and_refuses_with_the_sdks_error(
    dsn: str, broker: tuple[PostgresBackend, SteppedScheduler, Heard], driver: str
) -> None:
    backend, _, heard = broker
    put = DRIVERS[driver]
    job_id = await put(
        dsn, queue="emails", payload={"to": "ü"}, priority=-3, expires_s=600.0, key="k"
    )
    await _until(lambda: heard.told_work("emails"))
    ((claimed,),) = await backend.claim([Claim("w1", ("emails",), 1)])
    assert (claimed.id, claimed.priority) == (job_id, -3)
    assert claimed.payload_json == '{"to":"ü"}'.encode()
    assert await put(dsn, queue="emails", payload=0, key="k") == job_id
    with pytest.raises(InvalidArgument) as refused:
        await put(dsn, queue="emails", payload=1, visibility_timeout_s=0.0)
    assert refused.value.field == "visibility_timeout_s"
    assert str(refused.value) == "visibility_timeout_s: must be > 0, got 0"
    assert isinstance(refused.value.__cause__, Exception)  # the driver's error, kept
    with pytest.raises(TooLarge) as too_large:
        await put(dsn, queue="emails", payload="x" * (2 << 20))
    assert too_large.value.field == "payload"
    assert str(too_large.value).startswith("payload: is 2097154 bytes encoded, over the limit")


async def test_a_wrong_connection_type_is_a_type_error(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        with pytest.raises(TypeError, match="enqueue_tx_async"):
            enqueue_tx(conn, "q", 1)  # type: ignore[arg-type]
    with psycopg.connect(dsn) as sync_conn:
        with pytest.raises(TypeError, match=r"use enqueue_tx for a sync connection"):
            await enqueue_tx_async(sync_conn, "q", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got builtins\.object"):
        await enqueue_tx_async(object(), "q", 1)  # type: ignore[arg-type]


async def test_plain_sql_as_another_language_would_call_it(
    dsn: str, broker: tuple[PostgresBackend, SteppedScheduler, Heard]
) -> None:
    backend, _, heard = broker
    conn = await asyncpg.connect(_url(dsn))
    try:
        async with conn.transaction():
            job_id = await conn.fetchval(
                """SELECT conveyor_enqueue('emails', '{"to": "a"}', priority => 5)"""
            )
        with pytest.raises(asyncpg.PostgresError) as refused:
            await conn.fetchval("SELECT conveyor_enqueue('emails', '1', priority => 2147483648)")
        error = refused.value
        assert error.sqlstate == "22023"
        assert error.message.startswith("invalid_argument: priority: ")
        assert error.column_name == "priority"  # type: ignore[attr-defined]
    finally:
        await conn.close()
    await _until(lambda: heard.told_work("emails"))
    ((claimed,),) = await backend.claim([Claim("w1", ("emails",), 1)])
    assert claimed.id == job_id
    assert claimed.payload_json == b'{"to": "a"}'  # the text as written
    assert claimed.priority == 5


async def test_the_function_finds_its_tables_whatever_the_callers_search_path(
    dsn: str, broker: tuple[PostgresBackend, SteppedScheduler, Heard]
) -> None:
    backend, _, _ = broker
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE SCHEMA app")
        await conn.execute("CREATE TEMP TABLE conveyor_jobs (seq bigint)")  # a decoy
        await conn.execute("SET search_path = app")
        cur = await conn.execute("SELECT public.conveyor_enqueue('q', '1')")
        row = await cur.fetchone()
    assert row is not None
    (job,) = await backend.get_jobs([row[0]])
    assert job is not None and job.queue == "q"


async def test_the_schema_is_at_the_version_that_has_the_function(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await migrate(conn, "p-")
        cur = await conn.execute(
            "SELECT version FROM conveyor_schema UNION ALL "
            "SELECT count(*) FROM pg_proc WHERE proname = 'conveyor_enqueue'"
        )
        assert [row[0] for row in await cur.fetchall()] == [SCHEMA_VERSION, 1]


# -- refusals and resolution against the backend's (shared database) ---------------------


@pytest.fixture(scope="module")
def shared_dsn() -> Iterator[str]:
    """One database for the tables below, its payload limit ``LIMIT`` (set as
    docs/postgres.md says), its schema made."""
    with database_sync() as made:
        with psycopg.connect(made, autocommit=True) as conn:
            name = conn.info.dbname
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET conveyor.max_payload_bytes = {}").format(
                    sql.Identifier(name), sql.Literal(LIMIT)
                )
            )

        async def make() -> None:
            backend, _ = await _open(made, limit=LIMIT)
            await backend.close()

        asyncio.run(make())
        yield made


_names = (f"t{i}" for i in itertools.count())


def _fresh_queue() -> str:
    return next(_names)


def _nest(levels: int) -> list[Any]:
    """A list ``levels`` deep: ``[[...]]``."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


# Each: the job's arguments (besides queue and payload where given), the field refused.
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"queue": "bad name"}, "queue"),
    ({"queue": ""}, "queue"),
    ({"queue": "x" * 129}, "queue"),
    ({"queue": 7}, "queue"),
    ({"priority": 2**31}, "priority"),
    ({"priority": -(2**31) - 1}, "priority"),
    ({"priority": 1.5}, "priority"),
    ({"priority": True}, "priority"),
    ({"priority": "1"}, "priority"),
    ({"delay_s": -1.0}, "delay_s"),
    ({"delay_s": math.nan}, "delay_s"),
    ({"delay_s": math.inf}, "delay_s"),
    ({"delay_s": True}, "delay_s"),
    ({"delay_s": "soon"}, "delay_s"),
    ({"delay_s": 10**400}, "delay_s"),
    ({"run_at": -math.inf}, "run_at"),
    ({"expires_s": 0.0}, "expires_s"),
    ({"expires_s": -5}, "expires_s"),
    ({"visibility_timeout_s": 0}, "visibility_timeout_s"),
    ({"visibility_timeout_s": math.nan}, "visibility_timeout_s"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": 2**31}, "max_attempts"),
    ({"max_attempts": 2.0}, "max_attempts"),
    ({"max_attempts": False}, "max_attempts"),
    ({"backoff_base_s": -1.0}, "backoff_base_s"),
    ({"backoff_base_s": 3600.5}, "backoff_base_s"),  # over the queue's backoff_max_s
    ({"timeout_s": 0}, "timeout_s"),
    ({"timeout_s": -2.5}, "timeout_s"),
    ({"timeout_s": math.inf}, "timeout_s"),
    ({"timeout_s": True}, "timeout_s"),
    ({"key": "k" * 1025}, "key"),
    ({"key": 5}, "key"),
    ({"key": "\ud800"}, "key"),
    ({"partition": "p" * 1025}, "partition"),
    ({"partition": 5}, "partition"),
    ({"partition": "\ud800"}, "partition"),
    ({"payload": math.nan}, "payload"),
    ({"payload": {"a": [math.inf]}}, "payload"),
    ({"payload": {1: 2}}, "payload"),
    ({"payload": {"a", "b"}}, "payload"),
    ({"payload": "\ud800"}, "payload"),
    ({"payload": _nest(255)}, "payload"),
    ({"payload": "x" * LIMIT}, "payload"),  # too_large: the quotes make it LIMIT + 2
]


def _job(queue: str, overrides: dict[str, Any]) -> dict[str, Any]:
    return {"queue": queue, "payload": {"n": 1}, **overrides}


@pytest.fixture
async def shared(shared_dsn: str) -> AsyncIterator[PostgresBackend]:
    # Behind the database's clock: the jobs compared are never claimed, and none the
    # function stamps may expire or lapse in this broker's eyes meanwhile.
    backend, _ = await _open(shared_dsn, limit=LIMIT, ahead=-3600.0)
    try:
        yield backend
    finally:
        await backend.close()


async def _by_function(dsn: str, job: dict[str, Any]) -> str | Exception:
    """The job through ``enqueue_tx_async`` in a transaction of its own: its id, or the
    error it raised (the transaction rolled back)."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        try:
            async with conn.transaction():
                return await enqueue_tx_async(conn, **job)
        except sdk.ConveyorError as exc:
            return exc


async def _by_backend(backend: PostgresBackend, job: dict[str, Any]) -> str | Exception:
    """The same job through the backend's own enqueue (the broker's)."""
    job = dict(job)
    try:
        (answer,) = await backend.enqueue([Enqueue(job.pop("queue"), job.pop("payload"), **job)])
    except EngineInvalidArgument as exc:  # (a bad queue name is raised, not answered)
        return exc
    return answer


@pytest.mark.parametrize(("overrides", "field"), REFUSED, ids=lambda v: repr(v)[:40])
async def test_each_refusal_names_its_field_as_the_backend_does(
    shared_dsn: str, shared: PostgresBackend, overrides: dict[str, Any], field: str
) -> None:
    job = _job(_fresh_queue(), overrides)
    got = await _by_function(shared_dsn, job)
    want = await _by_backend(shared, job)
    assert isinstance(want, EngineInvalidArgument), want
    assert isinstance(got, InvalidArgument | TooLarge), got
    assert (got.code, got.field) == (want.code, want.field) == (want.code, field)
    assert str(got).startswith(f"{field}: ")
    # Nothing of the refused job stayed: its transaction rolled back, queue and all.
    if isinstance(job["queue"], str):
        async with await psycopg.AsyncConnection.connect(shared_dsn) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM conveyor_jobs WHERE queue = %s", (job["queue"],)
            )
            assert await cur.fetchone() == (0,)


# Plain SQL, each refusal's message and field as a client in another language sees them.
SQL_REFUSED: list[tuple[str, str, str]] = [
    ("NULL, '1'", "queue", "invalid_argument: queue: must be a string, got null"),
    ("'a b', '1'", "queue", "invalid_argument: queue: must be 1 to 128 of A-Z a-z 0-9"),
    ("'q', '1', priority => 2147483648", "priority",
     "invalid_argument: priority: must be in [-2147483648, 2147483647], got 2147483648"),
    ("'q', '1', priority => 1.5", "priority", "invalid_argument: priority: must be an int"),
    ("'q', '1', delay_s => -1", "delay_s", "invalid_argument: delay_s: must be >= 0, got -1"),
    ("'q', '1', run_at => 'Infinity'", "run_at", "invalid_argument: run_at: must be finite"),
    ("'q', '1', expires_s => 0", "expires_s", "invalid_argument: expires_s: must be > 0"),
    ("'q', '1', max_attempts => 0", "max_attempts",
     "invalid_argument: max_attempts: must be >= 1, got 0"),
    ("'q', '1', backoff_base_s => 'NaN'", "backoff_base_s",
     "invalid_argument: backoff_base_s: must be finite"),
    ("'q', '1', timeout_s => 0", "timeout_s",
     "invalid_argument: timeout_s: must be > 0, got 0"),
    ("'q', '1', key => repeat('k', 1025)", "key",
     "invalid_argument: key: must be at most 1024 characters, got 1025"),
    ("'q', NULL", "payload", "invalid_argument: payload: must be JSON, got SQL NULL"),
    ("'q', '[1e400]'", "payload", "invalid_argument: payload: must be strict JSON, holds a"),
    ("'q', '\"\\ud800\"'", "payload", "invalid_argument: payload: must be strict JSON: Unicode"),
    (f"'q', '{'[' * 255}{']' * 255}'", "payload",
     "invalid_argument: payload: nests deeper than 254 levels"),
    (f"'q', '\"{'x' * LIMIT}\"'", "payload",
     f"too_large: payload: is {LIMIT + 2} bytes encoded, over the limit of {LIMIT} bytes"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "field", "message"), SQL_REFUSED, ids=lambda v: str(v)[:30])
def test_plain_sql_refusals_start_with_the_code_and_name_the_field(
    shared_dsn: str, args: str, field: str, message: str
) -> None:
    with psycopg.connect(shared_dsn) as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(f"SELECT conveyor_enqueue({args})")  # type: ignore[arg-type]
    error = refused.value
    assert error.diag.message_primary is not None
    assert error.diag.message_primary.startswith(message)
    assert error.diag.column_name == field
    assert error.sqlstate == ("54000" if message.startswith("too_large") else "22023")


async def test_edge_values_are_stored_as_the_backend_stores_them(
    shared_dsn: str, shared: PostgresBackend
) -> None:
    """What the guards let through at their edges, stored alike by both."""
    cases: list[dict[str, Any]] = [
        {"priority": 2**31 - 1},
        {"priority": -(2**31)},
        {"max_attempts": 2**31 - 1},
        {"delay_s": 0},
        {"key": ""},  # no key (LIM-1)
        {"key": "k" * 1024},
        {"partition": ""},  # no key (FLW-3)
        {"partition": "p" * 1024},
        {"payload": "x" * (LIMIT - 2)},
        {"payload": _nest(254)},
        {"payload": "\x00 nul and ü"},
        {"payload": None},
        {"backoff_base_s": 3600},
        {"timeout_s": 0.25},
        {"timeout_s": 1e9},
    ]
    for overrides in cases:
        name = _fresh_queue()
        got = await _by_function(shared_dsn, _job(name + "f", overrides))
        want = await _by_backend(shared, _job(name + "b", overrides))
        assert isinstance(got, str) and isinstance(want, str), (overrides, got, want)
        job, ref = await shared.get_jobs([got, want])
        assert job is not None and ref is not None
        assert _comparable(job) == _comparable(ref), overrides


def _comparable(job: Job, *, at: bool = False) -> dict[str, Any]:
    """A job's fields but ids, queue names and times; its times relative to its own
    enqueue (each path stamps its own "now"); ``at``: its ready time as it is (a
    ``run_at`` in the future, ENQ-5)."""
    fields = {
        name: getattr(job, name)
        for name in (
            "state", "priority", "attempts", "max_attempts", "visibility_timeout_s",
            "backoff_base_s", "backoff_max_s", "worker_id", "deadline", "last_error",
            "died_at", "key", "timeout_s", "partition",
        )
    }  # fmt: skip
    fields["payload"] = _decoded(job.payload_json)
    fields["ready"] = job.ready_at if at else round(job.ready_at - job.enqueued_at, 6)
    fields["expires_in"] = (
        None if job.expires_at is None else round(job.expires_at - job.enqueued_at, 6)
    )
    return fields


def _decoded(data: bytes) -> Any:
    return json.loads(data)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=5)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
QUEUE_OPTS = st.builds(
    lambda vis, attempts, base_cap, expires, retention: QueueOpts(
        visibility_timeout_s=vis, max_attempts=attempts, backoff_base_s=base_cap[0],
        backoff_max_s=base_cap[1], expires_s=expires, dead_letter_retention_s=retention,
    ),
    st.sampled_from([0.5, 30.0, 300.0]),
    st.sampled_from([1, 3, 10]),
    st.sampled_from([(0.0, 0.0), (2.0, 60.0), (5.0, 3600.0)]),
    st.sampled_from([None, 60.0, 3600.0]),
    st.sampled_from([None, 0.0, 86400.0]),
)  # fmt: skip
# Each option unset, set, or set to a value a guard refuses.
OVERRIDES = st.fixed_dictionaries(
    {},
    optional={
        "priority": st.sampled_from([0, 5, -7, 2**31 - 1, -(2**31), 2**31]),
        "delay_s": st.sampled_from([None, 0.0, 12.5, 86400, -1.0]),
        "run_at": st.sampled_from([None, "past", "future", math.nan]),
        "expires_s": st.sampled_from([None, 30.0, 7, 0.0]),
        "visibility_timeout_s": st.sampled_from([None, 10.0, 1, 0.0]),
        "max_attempts": st.sampled_from([None, 1, 7, 0]),
        "backoff_base_s": st.sampled_from([None, 0.0, 3.0, 10_000.0]),
        "key": st.sampled_from([None, "", "k", "k" * 1025]),
        "timeout_s": st.sampled_from([None, 30.0, 2, 0.0]),
        "partition": st.sampled_from([None, "", "p", "p" * 1025]),
    },
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(opts=QUEUE_OPTS, overrides=OVERRIDES, payload=JSON)
async def test_the_function_resolves_options_as_the_backend_does(
    shared_dsn: str,
    shared: PostgresBackend,
    opts: QueueOpts,
    overrides: dict[str, Any],
    payload: Any,
) -> None:
    """For the same queue options and job, both paths store the same job (ENQ-2 to
    ENQ-6), or both refuse it naming the same field (ENQ-7 to ENQ-9)."""
    now = await db_now(shared_dsn)
    if overrides.get("run_at") == "past":
        overrides["run_at"] = now - 1e6
    elif overrides.get("run_at") == "future":
        overrides["run_at"] = float(round(now + 1e6))
    name = _fresh_queue()
    results = []
    for queue in (name + "f", name + "b"):
        await shared.set_queue(queue, opts)
        job = {**_job(queue, overrides), "payload": payload}
        if queue.endswith("f"):
            results.append(await _by_function(shared_dsn, job))
        else:
            results.append(await _by_backend(shared, job))
    got, want = results
    if isinstance(want, Exception):
        assert isinstance(got, sdk.ConveyorError), (got, want)
        assert (got.code, got.field) == (getattr(want, "code", None), getattr(want, "field", 0))
        event(f"both refused: {got.field}")
        return
    assert isinstance(got, str), (got, want)
    event("both stored")
    job, ref = await shared.get_jobs([got, want])
    assert job is not None and ref is not None
    at = isinstance(overrides.get("run_at"), float) and overrides["run_at"] > now
    at = at and overrides.get("delay_s") is None  # (a delay wins over run_at)
    assert _comparable(job, at=at) == _comparable(ref, at=at)
    if at:
        assert job.ready_at == overrides["run_at"]


def test_importing_the_sdk_loads_neither_driver() -> None:
    code = (
        "import sys, conveyor; "
        "assert 'asyncpg' not in sys.modules and 'psycopg' not in sys.modules, "
        "sorted(m for m in sys.modules if m.startswith(('asyncpg', 'psycopg')))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
