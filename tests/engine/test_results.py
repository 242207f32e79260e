"""``docs/contract.md``, "Results" (RES-1 to RES-6) in the engine: results stored by a
valid ack, completed jobs kept and let go, followed jobs' ends; and that the journal
carries completed rows and results through a restore (the ``table`` fixture's SQLite
kind rebuilds the table from its file at every clock step and compares)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from conveyor.broker.engine import (
    ROW_FIELDS,
    UPDATE_FIELDS,
    Finish,
    InvalidArgument,
    JobState,
    JobTable,
    PayloadTooLarge,
    QueueOpts,
)

if TYPE_CHECKING:
    from conftest import ManualClock


def _keeping(table: JobTable, keep_s: float | None = 100.0) -> None:
    table.queue("q", QueueOpts(completed_retention_s=keep_s))


def test_an_ack_keeps_the_job_completed_with_its_result(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: RES-1, RES-3, RES-4.
    _keeping(table)
    q = table.queue("q")
    job_id = q.enqueue({"n": 1}, key="k", expires_s=5.0)
    h = q.claim_one("w")
    assert h is not None
    clock.advance(1)
    assert table.ack_many([(h.id, h.lease)], [b'{"ok":1}']) == [True]
    job = table.get_job(job_id)
    assert job is not None and job.state is JobState.COMPLETED
    assert job.result == {"ok": 1} and job.completed_at == clock.now
    assert q.enqueue({"n": 2}, key="k") == job_id  # its key is held
    clock.advance(10)  # past its expiry: a completed job does not expire
    assert q.sweep_expired().expired == 0
    stats = q.stats()
    assert (stats.completed, stats.dead, stats.totals.completed) == (1, 0, 1)
    assert table.next_event_at() == clock.now - 10 + 100


def test_retention_is_a_timed_event_and_the_sweep_lets_go(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: RES-3, TIM-4.
    _keeping(table, 30.0)
    q = table.queue("q")
    first = q.enqueue(1, key="a")
    second = q.enqueue(2)
    a, b = q.claim_batch("w", 2)
    assert a.ack(b"1")
    acked_at = clock.now
    clock.advance(10)
    assert b.ack(None)
    jobs, _ = q.list_jobs("completed")
    assert [j.id for j in jobs] == [second, first]
    assert table.next_event_at() == acked_at + 30
    clock.advance(20)
    assert q.sweep_expired().purged == 1
    assert table.get_job(first) is None
    assert q.enqueue(3, key="a") != first  # the key is free again
    assert table.next_event_at() == acked_at + 40
    clock.advance(10)
    assert q.sweep_expired().purged == 1
    assert q.stats().completed == 0


def test_a_late_ack_stores_nothing(table: JobTable, clock: ManualClock) -> None:
    # Contract: RES-1.
    _keeping(table)
    q = table.queue("q", QueueOpts(visibility_timeout_s=5.0, completed_retention_s=100.0))
    job_id = q.enqueue(None)
    h = q.claim_one("w")
    assert h is not None
    clock.advance(5)
    assert table.ack(h.id, h.lease, b'"late"') is False
    job = table.get_job(job_id)
    assert job is not None and job.result_json is None and job.state is JobState.PROCESSING


def test_a_result_too_big_is_refused_before_any_ack() -> None:
    # Contract: RES-2.
    table = JobTable(id_prefix="t", max_payload_bytes=10)
    q = table.queue("q")
    q.enqueue(1)
    q.enqueue(2)
    a, b = q.claim_batch("w", 2)
    with pytest.raises(PayloadTooLarge) as caught:
        table.ack_many([(a.id, a.lease), (b.id, b.lease)], [b"1", b'"' + b"x" * 10 + b'"'])
    assert caught.value.field == "result"
    assert q.stats().processing == 2
    with pytest.raises(InvalidArgument):
        table.ack_many([(a.id, a.lease)], [])


def test_without_retention_an_ack_deletes_and_tells_the_watcher(table: JobTable) -> None:
    # Contract: RES-5, JOB-4.
    q = table.queue("q")
    job_id = q.enqueue(None)
    assert table.watch(job_id) is None
    h = q.claim_one("w")
    assert h is not None and h.ack(b"7")
    assert table.take_finished() == [Finish(job_id, "q", "completed", b"7", None)]
    assert table.take_finished() == []
    assert table.get_job(job_id) is None
    assert table.watch(job_id) == Finish(job_id, "", "unknown", None, None)


def test_watchers_hear_of_deaths_and_cancels_once(table: JobTable, clock: ManualClock) -> None:
    # Contract: RES-5, RES-6.
    q = table.queue("q", QueueOpts(visibility_timeout_s=5.0, max_attempts=1))
    failed, expiring, cancelled, unwatched = (
        q.enqueue(1),
        q.enqueue(2, expires_s=3.0, delay_s=50.0),
        q.enqueue(3, delay_s=50.0),
        q.enqueue(4, delay_s=50.0),
    )
    for job_id in (failed, expiring, cancelled):
        assert table.watch(job_id) is None
    h = q.claim_one("w")
    assert h is not None and h.fail("boom")
    assert q.cancel(cancelled) and q.cancel(unwatched)
    clock.advance(3)
    q.sweep_expired()
    assert table.take_finished() == [
        Finish(failed, "q", "dead", None, "boom"),
        Finish(cancelled, "q", "cancelled", None, None),
        Finish(expiring, "q", "dead", None, "expired"),
    ]
    # Already finished and kept: told at once, not watched.
    assert table.watch(failed) == Finish(failed, "q", "dead", None, "boom")
    assert q.redrive(failed)
    q.cancel(failed)
    assert table.take_finished() == []


def test_unwatch_stops_the_telling(table: JobTable) -> None:
    # Contract: RES-5.
    q = table.queue("q")
    job_id = q.enqueue(None)
    table.watch(job_id)
    table.unwatch(job_id)
    q.cancel(job_id)
    assert table.take_finished() == []


def test_the_journal_carries_completed_rows_through_a_restore(clock: ManualClock) -> None:
    # Contract: RES-3 (durable backends keep completed jobs and results).
    table = JobTable(clock=clock, id_prefix="t")
    table.start_journal()
    _keeping(table)
    q = table.queue("q")
    job_id = q.enqueue(None, key="k")
    h = q.claim_one("w")
    assert h is not None
    changes = table.take_changes()
    rows = {values[0]: values for values in changes.upserts}
    clock.advance(2)
    assert h.ack(b'{"r":1}')
    later = table.take_changes()
    [update] = later.updates
    seq = update[-1]
    row = dict(zip(ROW_FIELDS, rows[seq], strict=True))
    row.update(zip(UPDATE_FIELDS, update, strict=True))
    assert (row["state"], row["result"], row["completed_at"]) == (
        "completed",
        b'{"r":1}',
        clock.now,
    )
    restored = JobTable.restore(
        later.meta, later.queues, [tuple(row[name] for name in ROW_FIELDS)], clock=clock
    )
    restored.queue("q", QueueOpts(completed_retention_s=100.0))
    assert restored.get_job(job_id) == table.get_job(job_id)
    assert restored.queue("q").stats() == q.stats()
    assert restored.queue("q").enqueue(None, key="k") == job_id
    assert restored.next_event_at() == table.next_event_at()
    clock.advance(100)
    assert restored.sweep_expired().purged == 1
