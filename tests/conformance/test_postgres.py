"""What only the PostgreSQL backend has: brokers sharing one database, and its schema.

Each test makes a database of its own (``pg.database``) and drops it after.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import psycopg
import pytest

from conveyor.broker.backend import BackOff, Claim, Enqueue
from conveyor.broker.backend._pg_schema import MIGRATIONS, SCHEMA_VERSION
from conveyor.broker.backend.postgres import PostgresBackend, Unavailable
from conveyor.broker.engine import JobState, Limits, NewJob
from conveyor.broker.scheduler import SteppedScheduler
from conveyor.broker.store import StoreError

from .conftest import START, Heard
from .pg import database, db_now, open_backend
from .pg import until as _until


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    async with database() as made:
        yield made


async def test_two_brokers_claiming_at_once_never_share_a_job_clm_8(dsn: str) -> None:
    clock = SteppedScheduler(start=START)
    one = await open_backend(dsn, clock, 1)
    two = await open_backend(dsn, clock, 2)
    try:
        jobs = 200
        ids = await one.enqueue_all("q", [NewJob(i) for i in range(jobs)])

        async def drain(backend: PostgresBackend, worker: str) -> list[tuple[str, str]]:
            got: list[tuple[str, str]] = []
            while True:
                (claimed,) = await backend.claim([Claim(worker, ("q",), 3)])
                if not claimed:
                    return got
                got.extend((c.id, c.lease) for c in claimed)

        takers = [drain(backend, f"w{i}") for i in range(4) for backend in (one, two)]
        handed = [pair for taken in await asyncio.gather(*takers) for pair in taken]
        handed_ids = [job_id for job_id, _ in handed]
        assert len(handed_ids) == len(set(handed_ids)) == jobs  # no job twice
        assert set(handed_ids) == set(ids)
        # Each lease is the job's current one: every ack lands, from either broker.
        half = len(handed) // 2
        assert await one.ack(handed[:half]) == [True] * half
        assert await two.ack(handed[half:]) == [True] * (len(handed) - half)
        stats = (await two.stats(["q"]))["q"]
        assert (stats.ready, stats.processing, stats.totals.completed) == (0, 0, jobs)
    finally:
        await one.close()
        await two.close()


async def test_one_key_enqueued_by_two_brokers_at_once_is_one_job_enq_10(dsn: str) -> None:
    clock = SteppedScheduler(start=START)
    one = await open_backend(dsn, clock)
    two = await open_backend(dsn, clock)
    try:
        await one.set_queue("q")
        puts = [
            backend.enqueue([Enqueue("q", i, key="k")]) for i in range(10) for backend in (one, two)
        ]
        answers = [answer for answers in await asyncio.gather(*puts) for answer in answers]
        assert len(set(answers)) == 1
        assert (await one.stats(["q"]))["q"].totals.enqueued == 1
    finally:
        await one.close()
        await two.close()


async def test_a_broker_hears_of_another_brokers_work_and_cancels(dsn: str) -> None:
    clock = SteppedScheduler(start=START)
    one = await open_backend(dsn, clock)
    two = await open_backend(dsn, clock)
    heard_one, heard_two = Heard(), Heard()
    one.listen(heard_one)
    two.listen(heard_two)
    try:
        (job_id,) = await two.enqueue([Enqueue("q", 1)])
        assert isinstance(job_id, str)
        await _until(lambda: heard_one.told_work("q"))
        (claimed,) = (await one.claim([Claim("w", ("q",), 1)]))[0]
        heard_two.forget()
        assert await one.lapse([(claimed.id, claimed.lease)]) == [True]
        await _until(lambda: heard_two.told_work("q"))
        await two.pause("q")
        heard_one.forget()
        await two.resume("q")
        await _until(lambda: heard_one.told_work("q"))
        assert await two.cancel([job_id]) == [True]
        await _until(lambda: heard_one.cancels == [job_id])
        # A backend's own changes come to its listeners once: from its call, not the news.
        await asyncio.sleep(0.1)
        assert heard_two.cancels == [job_id]
    finally:
        await one.close()
        await two.close()


async def test_a_delayed_job_enqueued_through_another_broker_wakes_this_one_in_time(
    dsn: str,
) -> None:
    clock = SteppedScheduler(start=START)
    # (The fallback poll, which would find the job too, is set out of the way.)
    one, two = [
        await PostgresBackend.open(dsn, clock, max_payload_bytes=1 << 20, poll_s=3600.0)
        for _ in range(2)
    ]
    heard = Heard()
    one.listen(heard)
    try:
        await two.enqueue([Enqueue("q", 1, delay_s=60.0)])
        await _until(lambda: heard.told_work("q"))  # (the enqueue's notice)
        heard.forget()
        clock.advance(60.0)
        # Its timer was set from the enqueue's news of the job's time: it fires then.
        await _until(lambda: heard.told_work("q"), "one's timer, set from two's news")
        assert [c.id for c in (await one.claim([Claim("w", ("q",), 1)]))[0]] != []
    finally:
        await two.close()
        await one.close()


async def test_a_database_of_an_older_schema_is_migrated(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE conveyor_schema (version int NOT NULL)")
        await conn.execute("INSERT INTO conveyor_schema VALUES (1)")
        await conn.execute(MIGRATIONS[0].encode())
        await conn.execute("INSERT INTO conveyor_meta (id_prefix) VALUES ('old-')")
    backend = await open_backend(dsn, SteppedScheduler(start=START))
    try:
        (job_id,) = await backend.enqueue([Enqueue("q", 1)])
        assert job_id == "old-1"  # the table's prefix stays
    finally:
        await backend.close()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT version FROM conveyor_schema")
        assert await cur.fetchall() == [(SCHEMA_VERSION,)]


async def test_a_schema_newer_than_the_code_is_refused(dsn: str) -> None:
    backend = await open_backend(dsn, SteppedScheduler(start=START))
    await backend.close()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("UPDATE conveyor_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError) as raised:
        await open_backend(dsn, SteppedScheduler(start=START))
    message = str(raised.value)
    assert f"version {SCHEMA_VERSION + 1}" in message and f"{SCHEMA_VERSION}" in message


async def _terminate(dsn: str, pids: list[int] | None = None) -> None:
    """End the sessions ``pids`` (every other session on the database for ``None``), as a
    server restart or a network failure would."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND (%s::int[] IS NULL OR pid = ANY(%s::int[]))",
            (pids, pids),
        )


async def _available(backend: PostgresBackend, timeout: float = 20.0) -> None:
    """Wait (on the real clock) until the backend has its connections back."""
    await _until(lambda: backend.available, timeout)


async def test_a_lost_connection_makes_calls_unavailable_until_it_is_made_again(
    dsn: str,
) -> None:
    failures: list[StoreError] = []
    backend = await PostgresBackend.open(
        dsn, SteppedScheduler(start=START), max_payload_bytes=1 << 20,
        on_failure=failures.append,
    )  # fmt: skip
    heard = Heard()
    backend.listen(heard)
    try:
        (job_id,) = await backend.enqueue([Enqueue("q", 1)])
        assert isinstance(job_id, str)
        assert backend.is_leader
        heard.forget()
        await _terminate(dsn)
        with pytest.raises(Unavailable, match="unavailable"):
            await backend.get_jobs([job_id])
        await _available(backend)
        assert [job.id for job in await backend.get_jobs([job_id]) if job] == [job_id]
        (other,) = await backend.enqueue([Enqueue("q", 2)])
        assert isinstance(other, str)
        # The listener was told that work may be waiting: notices may have been missed,
        # and claims may have failed meanwhile.
        await _until(lambda: None in heard.work)
        await _until(lambda: backend.is_leader)  # the lead taken again with the session
        assert failures == []  # a lost connection does not stop the broker
    finally:
        await backend.close()


async def test_a_call_cut_off_in_flight_is_unavailable_and_did_not_happen(dsn: str) -> None:
    backend = await open_backend(dsn, SteppedScheduler(start=START))
    try:
        await backend.set_queue("q")
        main_pid = backend._conn.info.backend_pid
        async with await psycopg.AsyncConnection.connect(dsn) as blocker:
            # Another session holds the jobs' table: the enqueue waits for it, and its
            # connection is cut while it waits.
            await blocker.execute("LOCK TABLE conveyor_jobs IN ACCESS EXCLUSIVE MODE")
            put = backend.enqueue([Enqueue("q", 1)])
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as look:

                async def waiting() -> bool:
                    cur = await look.execute(
                        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                        (main_pid,),
                    )
                    row = await cur.fetchone()
                    return row is not None and row[0] == "Lock"

                loop = asyncio.get_running_loop()
                end = loop.time() + 10
                while not await waiting():
                    assert loop.time() < end, "the enqueue never waited for the lock"
                    await asyncio.sleep(0.01)
            await _terminate(dsn, [main_pid])
            with pytest.raises(Unavailable):
                await asyncio.wait_for(put, 10)
            await blocker.rollback()
        await _available(backend)
        assert (await backend.stats(["q"]))["q"].totals.enqueued == 0
    finally:
        await backend.close()


async def test_a_statement_the_server_refuses_fails_the_backend_for_good(dsn: str) -> None:
    failures: list[StoreError] = []
    backend = await PostgresBackend.open(
        dsn, SteppedScheduler(start=START), max_payload_bytes=1 << 20,
        on_failure=failures.append,
    )  # fmt: skip
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("DROP TABLE conveyor_counts CASCADE")
        with pytest.raises(StoreError, match="postgres") as raised:
            await backend.enqueue([Enqueue("q", 1)])
        assert not isinstance(raised.value, Unavailable)
        assert failures == [raised.value]
        with pytest.raises(StoreError):
            backend.get_jobs(["x"])  # failed: every later call raises
    finally:
        await backend.close()


async def test_an_unreachable_server_is_unavailable() -> None:
    with pytest.raises(Unavailable, match="unavailable: cannot connect"):
        await PostgresBackend.open(
            "host=127.0.0.1 port=1 user=postgres connect_timeout=2",
            SteppedScheduler(start=START),
            max_payload_bytes=1 << 20,
        )


async def test_one_broker_leads_and_another_takes_over_when_it_closes(dsn: str) -> None:
    clock = SteppedScheduler(start=START)
    retry = 10.0
    one = await open_backend(dsn, clock, 1)
    two = await PostgresBackend.open(
        dsn, clock, max_payload_bytes=1 << 20, rng=random.Random(2), lead_retry_s=retry
    )
    heard = Heard()
    two.listen(heard)
    try:
        assert (one.is_leader, two.is_leader) == (True, False)
        # A broker that does not lead still claims what matured, and its timer still
        # tells its listener when a delayed job matures.
        (later,) = await two.enqueue([Enqueue("q", 1, delay_s=2.0)])
        heard.forget()
        await asyncio.sleep(0)
        clock.advance(2.0)
        assert heard.told_work("q")
        (got,) = await two.claim([Claim("w", ("q",), 1)])
        assert [c.id for c in got] == [later]
        await one.close()
        # Nobody sweeps now: a job that expires stays as it was until a leader does.
        (doomed,) = await two.enqueue([Enqueue("q", 2, expires_s=1.0)])
        assert isinstance(doomed, str)
        await asyncio.sleep(0)
        clock.advance(1.0)
        await asyncio.sleep(0.3)
        (job,) = await two.get_jobs([doomed])
        assert job is not None and job.state is JobState.PENDING
        assert not two.is_leader
        # Its next try (on its clock) takes the lead, and it sweeps what is overdue.
        clock.advance(retry)
        await _until(lambda: two.is_leader)

        async def expired() -> bool:
            (job,) = await two.get_jobs([doomed])
            return job is not None and job.state is JobState.DEAD

        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while not await expired():
            assert loop.time() < end, "the new leader did not sweep"
            await asyncio.sleep(0.02)
    finally:
        await one.close()
        await two.close()


async def test_a_leader_that_closes_hands_the_lead_over_at_once(dsn: str) -> None:
    clock = SteppedScheduler(start=START)
    for _ in range(3):
        # The lock is let go as the leader closes: a broker started next leads from its
        # start (the manual-clock suite relies on a lone broker always leading).
        backend = await open_backend(dsn, clock)
        try:
            assert backend.is_leader
        finally:
            await backend.close()
        assert not backend.is_leader


async def test_the_lead_goes_with_the_leaders_session(dsn: str) -> None:
    clock = SteppedScheduler(start=START)
    one = await open_backend(dsn, clock, 1)
    two = await open_backend(dsn, clock, 2)
    try:
        assert (one.is_leader, two.is_leader) == (True, False)
        hearing = one._hearing
        assert hearing is not None
        await _terminate(dsn, [hearing.info.backend_pid])
        # One of the two takes the lead: the one cut off when it is connected again, or
        # the other at its next try. (Both may say so for the moment the one cut off
        # takes to notice; the lock itself is never held twice.)
        loop = asyncio.get_running_loop()
        end = loop.time() + 20
        while not (one._hearing not in (None, hearing) and one.is_leader != two.is_leader):
            assert loop.time() < end, "no broker took the lead"
            await asyncio.sleep(0.05)
            clock.advance(1.0)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND objid = %s AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                (0x636F6E6C,),
            )
            assert await cur.fetchall() == [(1,)]
    finally:
        await one.close()
        await two.close()


async def test_brokers_on_one_database_hear_each_others_announcements(dsn: str) -> None:
    clock = SteppedScheduler(start=START)
    a = await open_backend(dsn, clock)
    b = await open_backend(dsn, clock)
    try:
        assert await a.announce("a", {"workers": {"total": 1}}, 5.0) == []
        assert await b.announce("b", {"workers": {"total": 2}}, 5.0) == [{"workers": {"total": 1}}]
        clock.advance(3)
        assert await a.announce("a", {"workers": {"total": 3}}, 5.0) == [{"workers": {"total": 2}}]
        clock.advance(3)  # b said nothing for 6 s: gone from a's view
        assert await a.announce("a", {"workers": {"total": 3}}, 5.0) == []
        assert await b.announce("b", {"workers": {"total": 2}}, 5.0) == [{"workers": {"total": 3}}]
    finally:
        await b.close()
        await a.close()


async def test_limits_hold_across_brokers_claiming_at_once_flw_2(dsn: str) -> None:
    clock = SteppedScheduler(start=START)
    brokers = [await open_backend(dsn, clock, seed) for seed in range(3)]
    try:
        await brokers[0].set_limits("q", Limits(concurrency=5, partition_concurrency=2))
        jobs = [Enqueue("q", i, partition=f"k{i % 4}") for i in range(60)]
        assert all(isinstance(r, str) for r in await brokers[1].enqueue(jobs))

        async def grab(backend: PostgresBackend, worker: str) -> list[tuple[str, str]]:
            got: list[tuple[str, str]] = []
            for _ in range(5):
                (claimed,) = await backend.claim([Claim(worker, ("q",), 2)])
                got.extend((c.id, c.lease) for c in claimed)
            return got

        takers = [grab(b, f"w{i}") for i in range(4) for b in brokers]
        held = [pair for taken in await asyncio.gather(*takers) for pair in taken]
        assert len(held) == 5  # the queue's concurrency, whichever broker claimed
        keys = [
            job.partition
            for job in await brokers[2].get_jobs([job_id for job_id, _ in held])
            if job is not None
        ]
        assert all(keys.count(key) <= 2 for key in keys)  # and each key's
        # A release through one broker is heard by the others: their workers claim.
        heard = Heard()
        brokers[2].listen(heard)
        assert await brokers[0].ack([held[0]]) == [True]
        await _until(lambda: heard.told_work("q"), "the freed slot told to another broker")
        (claimed,) = await brokers[2].claim([Claim("w", ("q",), 5)])
        assert len(claimed) == 1
    finally:
        for backend in brokers:
            await backend.close()


async def test_a_back_off_through_one_broker_holds_the_key_for_all_flw_6(dsn: str) -> None:
    clock = SteppedScheduler(start=START)
    one = await open_backend(dsn, clock, 1)
    two = await open_backend(dsn, clock, 2)
    try:
        await one.enqueue([Enqueue("q", i, partition="a") for i in range(3)])
        (first,) = await one.claim([Claim("w", ("q",), 1)])
        (c,) = first
        assert await one.back_off([BackOff(c.id, c.lease, 30.0)]) == [True]
        (got,) = await two.claim([Claim("w", ("q",), 3)])
        assert got == []
        heard = Heard()
        two.listen(heard)
        await asyncio.sleep(0)
        clock.advance(30)
        await _until(lambda: heard.told_work("q"), "the end of the back-off")
        (got,) = await two.claim([Claim("w", ("q",), 3)])
        assert len(got) == 3
    finally:
        await two.close()
        await one.close()


async def test_claims_of_two_limited_queues_in_opposite_orders_never_deadlock(dsn: str) -> None:
    # Each broker's claims take the flow locks of both queues in one transaction, one
    # broker in the order qa, qb and the other in qb, qa (a worker's subscribe order, and
    # two workers' claims batched): the locks are waited for in one order only, so no
    # claim fails as unavailable (the server breaking a deadlock).
    clock = SteppedScheduler(start=START)
    one = await open_backend(dsn, clock, 1)
    two = await open_backend(dsn, clock, 2)
    try:
        for name in ("qa", "qb"):
            await one.set_limits(name, Limits(concurrency=4, partition_concurrency=2))
            jobs = [Enqueue(name, i, partition=f"k{i % 8}") for i in range(400)]
            assert all(isinstance(r, str) for r in await one.enqueue(jobs))
        orders = {one: ("qa", "qb"), two: ("qb", "qa")}

        async def rounds(backend: PostgresBackend, worker: str) -> int:
            first, second = orders[backend]
            handed = 0
            for i in range(30):
                if i % 2:
                    claims = [Claim(worker, (first, second), 8)]
                else:
                    claims = [Claim(worker, (first,), 4), Claim(worker + "b", (second,), 4)]
                got = [c for taken in await backend.claim(claims) for c in taken]
                handed += len(got)
                assert all(await backend.ack([(c.id, c.lease) for c in got]))
            return handed

        handed = await asyncio.gather(rounds(one, "w1"), rounds(two, "w2"))
        assert sum(handed) > 0
    finally:
        await two.close()
        await one.close()


async def test_a_queue_under_limits_in_a_database_of_schema_8_claims_in_turns_after_migrating(
    dsn: str,
) -> None:
    # Made as a version 8 broker leaves it: the queue's limits, jobs of two keys and of
    # none, and each key's row (its turn) made when its first job came.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE conveyor_schema (version int NOT NULL)")
        await conn.execute("INSERT INTO conveyor_schema VALUES (8)")
        for step in MIGRATIONS[:8]:
            await conn.execute(step.encode())
        await conn.execute("INSERT INTO conveyor_meta (id_prefix) VALUES ('old-')")
        for i, key in enumerate(["a", "a", "b", ""]):
            cur = await conn.execute("SELECT conveyor_enqueue('q', %s::json)", (str(i),))
            row = await cur.fetchone()
            assert row is not None
            await conn.execute(
                "UPDATE conveyor_jobs SET partition = %s WHERE seq = %s",
                (key, int(str(row[0]).removeprefix("old-"), 16)),
            )
        await conn.execute(
            "UPDATE conveyor_queues SET partition_concurrency = 1, flow_until = 'Infinity'"
        )
        await conn.execute(
            "INSERT INTO conveyor_parts (queue, name, turn) VALUES ('q', '', 0), "
            "('q', 'a', nextval('conveyor_turn_seq')), ('q', 'b', nextval('conveyor_turn_seq'))"
        )
    backend = await open_backend(dsn, SteppedScheduler(start=await db_now(dsn) + 60))
    try:
        (got,) = await backend.claim([Claim("w", ("q",), 10)])
        # The jobs of no key first (never served), then a and b in turn; a's second
        # waits for its key's slot.
        assert [c.id for c in got] == ["old-4", "old-1", "old-3"]
        assert await backend.ack([(got[1].id, got[1].lease)]) == [True]
        (got,) = await backend.claim([Claim("w", ("q",), 10)])
        assert [c.id for c in got] == ["old-2"]
    finally:
        await backend.close()
