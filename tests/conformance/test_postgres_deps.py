"""Job dependencies where only the PostgreSQL backend has something to show: brokers
sharing one table (docs/contract.md, DEP-1 to DEP-14), and a table made by the schema
before them.

Each test makes a database of its own (``pg.database``) and drops it after.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from conveyor.broker.backend import Claim, Enqueue, Report
from conveyor.broker.backend._pg_schema import MIGRATIONS
from conveyor.broker.engine import InvalidArgument, JobState
from conveyor.broker.scheduler import SteppedScheduler

from .conftest import START, Heard
from .pg import database, db_now, open_backend
from .pg import until as _until


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    async with database() as made:
        yield made


async def test_an_ack_through_one_broker_releases_a_dependent_claimed_through_another_dep_1(
    dsn: str,
) -> None:
    clock = SteppedScheduler(start=START)
    one, two = await open_backend(dsn, clock), await open_backend(dsn, clock, seed=1)
    heard = Heard()
    one.listen(heard)
    try:
        (dep,) = await one.enqueue([Enqueue("deps", "a")])
        (job,) = await one.enqueue([Enqueue("q", "b", after=(dep,))])
        assert isinstance(dep, str) and isinstance(job, str)
        assert (await one.claim([Claim("w", ("q",), 1)]))[0] == []
        ((claimed,),) = await two.claim([Claim("w2", ("deps",), 1)])
        heard.forget()
        assert await two.ack([(claimed.id, claimed.lease)], [b'{"n": 1}']) == [True]
        # The release is news to the first broker: its workers of q are told.
        await _until(lambda: heard.told_work("q"), "one hearing of two's release")
        ((got,),) = await one.claim([Claim("w", ("q",), 1)])
        assert got.id == job and got.dependencies == 1
        assert await one.dependency_results(job) == [(dep, b'{"n": 1}')]
    finally:
        await two.close()
        await one.close()


async def test_an_enqueue_racing_the_ack_of_its_dependency_never_leaves_it_waiting_dep_1(
    dsn: str,
) -> None:
    # The enqueue holds the dependency until its edge is committed, so either the ack
    # waits and then meets the edge, or the enqueue waits and finds the job gone.
    clock = SteppedScheduler(start=START)
    one, two = await open_backend(dsn, clock), await open_backend(dsn, clock, seed=1)
    try:
        outcomes = set()
        for _ in range(30):
            (dep,) = await two.enqueue([Enqueue("deps", 0)])
            ((claimed,),) = await two.claim([Claim("w", ("deps",), 1)])
            acked, (made,) = await asyncio.gather(
                two.ack([(claimed.id, claimed.lease)]),
                one.enqueue([Enqueue("q", 1, after=(str(dep),))]),
            )
            assert acked == [True]
            if isinstance(made, InvalidArgument):
                assert made.field == "after[0]"
                outcomes.add("refused")
                continue
            assert isinstance(made, str)
            (job,) = await one.get_jobs([made])
            assert job is not None and job.state is JobState.PENDING, job
            outcomes.add("released")
        assert outcomes  # (which ones came depends on timing; each is right)
    finally:
        await two.close()
        await one.close()


async def test_deaths_and_acks_through_two_brokers_at_once_keep_every_count_dep_3(
    dsn: str,
) -> None:
    # Fifty chains of three: the roots failed through one broker while jobs of the
    # other queue are acked through the other; every chain dies whole, nothing waits.
    clock = SteppedScheduler(start=START)
    one, two = await open_backend(dsn, clock), await open_backend(dsn, clock, seed=1)
    try:
        roots = []
        for i in range(50):
            (root,) = await one.enqueue([Enqueue("roots", i)])
            assert isinstance(root, str)
            await one.enqueue_group([Enqueue("q", i, after=(root,)), Enqueue("q", i, after=(0,))])
            roots.append(root)
        await two.enqueue([Enqueue("other", i) for i in range(50)])
        (mine,) = await one.claim([Claim("w", ("roots",), 50)])
        (theirs,) = await two.claim([Claim("w2", ("other",), 50)])
        await asyncio.gather(
            one.report([Report(c.id, c.lease, False, "no") for c in mine]),
            two.ack([(c.id, c.lease) for c in theirs]),
        )
        stats = (await two.stats(["q"]))["q"]
        assert (stats.waiting, stats.dead, stats.ready) == (0, 100, 0)
    finally:
        await two.close()
        await one.close()


async def test_a_database_of_the_schema_before_dependencies_takes_them_after_migrating(
    dsn: str,
) -> None:
    # Made as the broker before dependencies leaves it, with a job in it.
    before = len(MIGRATIONS) - 1
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE conveyor_schema (version int NOT NULL)")
        await conn.execute("INSERT INTO conveyor_schema VALUES (%s)", (before,))
        for step in MIGRATIONS[:before]:
            await conn.execute(step.encode())
        await conn.execute("INSERT INTO conveyor_meta (id_prefix) VALUES ('old-')")
        cur = await conn.execute("SELECT conveyor_enqueue('q', '\"old\"'::json)")
        row = await cur.fetchone()
        assert row is not None
        old = str(row[0])
    backend = await open_backend(dsn, SteppedScheduler(start=await db_now(dsn) + 1))
    try:
        (job,) = await backend.enqueue([Enqueue("q", "new", after=(old,))])
        assert isinstance(job, str)
        stats = (await backend.stats(["q"]))["q"]
        assert (stats.ready, stats.waiting) == (1, 1)
        ((claimed,),) = await backend.claim([Claim("w", ("q",), 5)])
        assert claimed.id == old and claimed.dependencies == 0
        await backend.ack([(old, claimed.lease)], [b'"A"'])
        ((claimed,),) = await backend.claim([Claim("w", ("q",), 5)])
        assert claimed.id == job and claimed.dependencies == 1
        assert await backend.dependency_results(job) == [(old, b'"A"')]
    finally:
        await backend.close()


async def test_an_applications_transaction_enqueues_a_dependent_with_after_dep_1_dep_7(
    dsn: str,
) -> None:
    # (The function stamps jobs with the server's clock: the broker's is set past them.)
    backend = await open_backend(dsn, SteppedScheduler(start=await db_now(dsn) + 60))
    try:
        (dep,) = await backend.enqueue([Enqueue("deps", "a")])
        assert isinstance(dep, str)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT conveyor_enqueue('q', '1', after => %s::text[])", ([dep, dep],)
            )
            row = await cur.fetchone()
            assert row is not None
            job = str(row[0])
            for named, field in (([dep, "nope"], "after[1]"), ([""], "after[0]")):
                with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
                    await conn.execute(
                        "SELECT conveyor_enqueue('q', '2', after => %s::text[])", (named,)
                    )
                assert caught.value.diag.column_name == field
        (got,) = await backend.get_jobs([job])
        assert got is not None and got.state is JobState.WAITING and got.after == (dep,)
        ((claimed,),) = await backend.claim([Claim("w", ("deps", "q"), 5)])
        assert claimed.id == dep
        await backend.ack([(dep, claimed.lease)], [b"7"])
        ((claimed,),) = await backend.claim([Claim("w", ("q",), 5)])
        assert claimed.id == job and claimed.dependencies == 1
        assert (await backend.stats(["q"]))["q"].totals.enqueued == 1
    finally:
        await backend.close()


async def test_an_ack_that_waited_for_an_enqueue_holding_its_job_meets_the_new_edge_dep_1(
    dsn: str,
) -> None:
    # The application's transaction names the job (holding it) and is still open when
    # the ack through a broker comes: the ack waits for its commit, and then, though its
    # statement began before the edge was committed, releases the new job.
    backend = await open_backend(dsn, SteppedScheduler(start=await db_now(dsn) + 60))
    try:
        (dep,) = await backend.enqueue([Enqueue("deps", "a")])
        ((claimed,),) = await backend.claim([Claim("w", ("deps",), 1)])
        async with await psycopg.AsyncConnection.connect(dsn) as app:
            cur = await app.execute(
                "SELECT conveyor_enqueue('q', '1', after => %s::text[])", ([dep],)
            )
            row = await cur.fetchone()
            assert row is not None
            job = str(row[0])
            ack = asyncio.ensure_future(backend.ack([(claimed.id, claimed.lease)], [b"5"]))
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watch:

                async def ack_waiting() -> None:
                    """Return once the ack's statement waits for the row's lock."""
                    while True:
                        assert not ack.done()
                        cur = await watch.execute(
                            "SELECT count(*) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                        )
                        row = await cur.fetchone()
                        if row is not None and row[0] == 1:
                            return

                await asyncio.wait_for(ack_waiting(), 30)
            await app.commit()
        assert await ack == [True]
        (got,) = await backend.get_jobs([job])
        assert got is not None and got.state is JobState.PENDING
        assert await backend.dependency_results(job) == [(dep, b"5")]
    finally:
        await backend.close()


async def test_a_chain_of_a_thousand_dies_in_one_change_without_recursion_dep_3(
    dsn: str,
) -> None:
    # Each level is a statement of conveyor_deps_doom's loop, not a trigger inside a
    # trigger: a chain far deeper than the server's stack would allow dies whole.
    clock = SteppedScheduler(start=START)
    backend = await open_backend(dsn, clock)
    try:
        (root,) = await backend.enqueue([Enqueue("q", "root")])
        assert isinstance(root, str)
        chain = await backend.enqueue_group(
            [Enqueue("chain", 0, after=(root,))]
            + [Enqueue("chain", i, after=(i - 1,)) for i in range(1, 1000)]
        )
        ((claimed,),) = await backend.claim([Claim("w", ("q",), 1)])
        assert await backend.report([Report(claimed.id, claimed.lease, False, "boom")]) == [True]
        stats = (await backend.stats(["chain"]))["chain"]
        assert (stats.waiting, stats.dead, stats.totals.dead) == (0, 1000, 1000)
        first, last = await backend.get_jobs([chain[0], chain[-1]])
        assert first is not None and first.last_error == f"dependency {root} died: boom"
        assert last is not None and last.last_error is not None
        assert len(last.last_error) == 4096 and last.last_error.endswith("...")
        assert last.last_error.startswith(f"dependency {chain[-2]} died: dependency ")
    finally:
        await backend.close()
