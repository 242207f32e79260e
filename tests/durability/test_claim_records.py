"""The SQLite store's claim records (schema 2).

A commit's claims are written as one record, not as an update of each claimed row, and
``load`` lays each over its row when the claim came after the row was last written whole.
A hypothesis state machine drives a table kept in SQLite through claims, acks, retries,
fails, heartbeats, lapses and reclaims, redrives, cancels and sweeps, commits at random
points, and now and then restarts: the table rebuilt from the file must agree with the
live one on every job, every queue's counts, the leases held and the next timed event,
and the run goes on with the rebuilt table and a new store (so the store's bookkeeping of
which record holds which claim is rebuilt at load, too). After every commit the file holds
no claim record without a live claim, so no more records than jobs under a lease.

The fixed cases below pin orderings the machine may take long to find: a claim superseded
by a retry, a record kept across restarts by its last live claim, and a stale entry whose
job was since redriven (attempts back to 0) in a record another claim keeps.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from conveyor.broker.engine import JobTable, Limits, QueueOpts
from conveyor.broker.store import SqliteStore, StoreError
from conveyor.broker.store import sqlite as sqlite_store

START = 1000.0
OPTS = {
    "q1": QueueOpts(visibility_timeout_s=5.0, max_attempts=3, backoff_base_s=1.0),
    "q2": QueueOpts(
        visibility_timeout_s=2.0, max_attempts=2, backoff_base_s=0.5, dead_letter_retention_s=9.0
    ),
}


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def _open(path: Path, clock: Clock) -> tuple[SqliteStore, JobTable]:
    store = SqliteStore(path, sync="normal")
    table = store.load(clock=clock, rng=random.Random(7), max_payload_bytes=1 << 20)
    for name, opts in OPTS.items():  # options are configuration, not stored state
        table.queue(name, opts)
    return store, table


def _records(store: SqliteStore) -> int:
    assert store._db is not None
    count: int = store._db.execute("SELECT count(*) FROM claims").fetchone()[0]
    return count


def _assert_same(live: JobTable, restored: JobTable, ids: list[str]) -> None:
    for job_id in ids:
        assert restored.get_job(job_id) == live.get_job(job_id), job_id
    for name in OPTS:
        assert restored.queue(name).stats() == live.queue(name).stats(), name
    assert sorted(restored.held_leases()) == sorted(live.held_leases())
    assert restored.next_event_at() == live.next_event_at()


class StoreRoundTrip(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="conveyor-claims-"))
        self.path = self.dir / "conveyor.db"
        self.clock = Clock()
        self.store, self.table = _open(self.path, self.clock)
        self.ids: list[str] = []
        self.leases: list[tuple[str, str]] = []  # (job id, lease), kept after they go stale

    def teardown(self) -> None:
        store = getattr(self, "store", None)
        if store is not None:
            store.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- what users and time do

    @rule(
        queue=st.sampled_from(sorted(OPTS)),
        n=st.integers(1, 3),
        delay=st.sampled_from([None, 0.0, 1.5]),
    )
    def enqueue(self, queue: str, n: int, delay: float | None) -> None:
        for _ in range(n):
            self.ids.append(self.table.queue(queue).enqueue({"n": len(self.ids)}, delay_s=delay))

    @rule(
        queue=st.sampled_from(sorted(OPTS)),
        worker=st.sampled_from(["w1", "w2"]),
        n=st.integers(1, 4),
    )
    def claim(self, queue: str, worker: str, n: int) -> None:
        for handle in self.table.queue(queue).claim_batch(worker, n):
            self.leases.append((handle.id, handle.lease))

    @precondition(lambda self: self.leases)
    @rule(
        i=st.integers(0, 1000),
        action=st.sampled_from(["ack", "retry", "fail", "heartbeat", "lapse"]),
    )
    def report(self, i: int, action: str) -> None:
        job_id, lease = self.leases[i % len(self.leases)]
        if action == "ack":
            self.table.ack(job_id, lease)
        elif action == "retry":
            self.table.retry(job_id, lease, "again")
        elif action == "fail":
            self.table.fail(job_id, lease, "broken")
        elif action == "heartbeat":
            self.table.heartbeat(job_id, lease)
        else:
            self.table.lapse(job_id, lease)

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 1000), action=st.sampled_from(["redrive", "cancel"]))
    def operate(self, i: int, action: str) -> None:
        job_id = self.ids[i % len(self.ids)]
        if action == "redrive":
            self.table.redrive(job_id)
        else:
            self.table.cancel(job_id)

    @rule(dt=st.sampled_from([0.5, 1.0, 2.5, 6.0]))
    def advance(self, dt: float) -> None:
        self.clock.now += dt

    @rule()
    def sweep(self) -> None:
        self.table.sweep_expired()

    # -- what the broker does with the store

    @rule()
    def commit(self) -> None:
        self.store.write(self.table.take_changes())
        processing = sum(self.table.queue(name).stats().processing for name in OPTS)
        # Every record left holds a live claim, which is a job under a lease.
        assert _records(self.store) == len(self.store._claims_live) <= processing

    @rule()
    def restart(self) -> None:
        self.commit()
        self.store.close()
        store, restored = _open(self.path, self.clock)
        self.store = store
        _assert_same(self.table, restored, self.ids)
        self.table = restored


StoreRoundTrip.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreRoundTrip = StoreRoundTrip.TestCase


# -- fixed orderings ------------------------------------------------------------------------


def test_a_claim_then_a_retry_restores_as_pending(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "c.db"
    store, table = _open(path, clock)
    job_id = table.queue("q1").enqueue({"x": 1})
    store.write(table.take_changes())
    [handle] = table.queue("q1").claim_batch("w1", 1)
    store.write(table.take_changes())  # the claim: a record, the row untouched
    assert _records(store) == 1
    assert table.retry(job_id, handle.lease, "later", delay_s=5.0)
    store.write(table.take_changes())  # the retry rewrites the row: the record goes
    assert _records(store) == 0
    store.close()
    store, restored = _open(path, clock)
    try:
        _assert_same(table, restored, [job_id])
        job = restored.get_job(job_id)
        assert job is not None and job.state == "pending" and job.attempts == 1
    finally:
        store.close()


def test_a_claim_kept_across_restarts_until_its_ack(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "c.db"
    store, table = _open(path, clock)
    ids = [table.queue("q1").enqueue({"x": i}) for i in range(3)]
    store.write(table.take_changes())
    handles = table.queue("q1").claim_batch("w1", 3)
    store.write(table.take_changes())
    assert table.ack(handles[0].id, handles[0].lease)
    store.write(table.take_changes())
    assert _records(store) == 1  # two of its three claims are still live
    store.close()
    store, restored = _open(path, clock)  # a restart: the record still counts
    _assert_same(table, restored, ids)
    assert restored.ack(handles[1].id, handles[1].lease)
    assert restored.ack(handles[2].id, handles[2].lease)
    store.write(restored.take_changes())
    assert _records(store) == 0
    store.close()


def test_a_stale_claim_in_a_record_kept_live_by_another_is_not_laid_over_its_row(
    tmp_path: Path,
) -> None:
    # The job's claim entry outlives its claim, in a record another job's claim keeps.
    # After a fail and a redrive the row's attempts are 0, below the entry's 1: only the
    # commit order (jobs.v), not the attempts, tells that the entry is older.
    clock = Clock()
    path = tmp_path / "c.db"
    store, table = _open(path, clock)
    first = table.queue("q2").enqueue({"x": 1})
    second = table.queue("q2").enqueue({"x": 2})
    store.write(table.take_changes())
    one, two = table.queue("q2").claim_batch("w1", 2)
    store.write(table.take_changes())  # one record, two entries
    assert table.fail(first, one.lease, "broken")
    store.write(table.take_changes())
    assert table.redrive(first)
    store.write(table.take_changes())
    assert _records(store) == 1  # kept by the second job's claim
    store.close()
    store, restored = _open(path, clock)
    try:
        _assert_same(table, restored, [first, second])
        job = restored.get_job(first)
        assert job is not None and (job.state, job.attempts, job.worker_id) == ("pending", 0, None)
        assert restored.ack(second, two.lease)
    finally:
        store.close()


def test_a_version_1_database_is_upgraded_and_keeps_its_claimed_rows(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    # A database as schema 1 wrote it: a claim was an update of its row.
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    for statement in sqlite_store._SCHEMA_V1.split(";"):
        if statement.strip():
            db.execute(statement)
    db.execute("PRAGMA user_version=1")
    db.execute(f"PRAGMA application_id={sqlite_store._APPLICATION_ID}")
    db.execute("INSERT INTO meta VALUES (1, 'old', 2, 1)")
    db.execute("INSERT INTO queues VALUES ('q1', 0, 2, 0, 0, 0, 0, 0)")
    columns = (
        "seq, queue, state, payload, priority, attempts, max_attempts, visibility_timeout_s,"
        " backoff_base_s, backoff_max_s, enqueued_at, ready_at, expires_at, worker_id,"
        " deadline, lease, last_error, died_at, key"
    )
    insert = f"INSERT INTO jobs ({columns}) VALUES ({', '.join('?' * 19)})"
    fixed = (3, 5.0, 1.0, 3600.0, START, START, None)  # max_attempts .. expires_at
    db.execute(
        insert, (1, "q1", "pending", b'{"a":1}', 0, 0, *fixed, None, None, None, None, None, None)
    )
    db.execute(
        insert,
        (
            2,
            "q1",
            "processing",
            b'{"b":2}',
            0,
            1,
            *fixed,
            "w1",
            START + 5.0,
            "oldL1",
            None,
            None,
            None,
        ),
    )
    db.close()

    clock = Clock()
    store, table = _open(path, clock)
    try:
        assert store._db is not None
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == sqlite_store._VERSION
        first, second = table.get_job("old1"), table.get_job("old2")
        assert first is not None and first.state == "pending"
        assert second is not None and (second.state, second.worker_id, second.attempts) == (
            "processing",
            "w1",
            1,
        )
        assert first.timeout_s is None  # schema 3's column, NULL for the jobs before it
        assert first.partition is None  # schema 4's, the same
        assert table.queue("q1").limits == Limits()  # and a queue's limits: none
        assert table.ack("old2", "oldL1")  # the lease stored by schema 1 still holds
        store.write(table.take_changes())
    finally:
        store.close()


def test_a_claim_record_that_is_not_json_stops_the_load(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "c.db"
    store, table = _open(path, clock)
    table.queue("q1").enqueue({"x": 1})
    store.write(table.take_changes())
    table.queue("q1").claim_batch("w1", 1)
    store.write(table.take_changes())
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE claims SET texts = '[[\"processing\"],'")
    with pytest.raises(StoreError, match="a stored row makes no sense"):
        _open(path, clock)
