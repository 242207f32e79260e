"""``docs/contract.md``: cancel, get_job, sweep, retention, redrive, purge (OPS-*, DLQ-*),
stats (CST-4) and next_event_at (TIM-4)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from conveyor.broker.engine import JobHandle, JobState, JobTable, QueueOpts, SweepResult

if TYPE_CHECKING:
    from conftest import ManualClock

START = 1000.0  # where the conftest's ManualClock starts


def sweep(q: Any) -> tuple[int, int, int]:
    r = q.sweep_expired()
    assert isinstance(r, SweepResult)
    return (r.expired, r.exhausted, r.purged)


def current(q: Any) -> tuple[int, int, int, int, int]:
    s = q.stats()
    assert s.pending == s.ready + s.scheduled
    return (s.ready, s.scheduled, s.processing, s.dead, s.pending)


def totals(q: Any) -> dict[str, int]:
    t = q.stats().totals
    names = ("enqueued", "completed", "retried", "dead", "expired", "cancelled")
    return {n: getattr(t, n) for n in names}


def claim(q: Any, worker: str = "w") -> JobHandle:
    h = q.claim_one(worker)
    assert h is not None
    return h


# --- cancel ------------------------------------------------------------------------------


def test_cancel_pending_ready_and_scheduled(table: JobTable) -> None:
    # Contract: OPS-2.
    q = table.queue("q")
    ready, scheduled = q.enqueue(1), q.enqueue(2, delay_s=50)
    assert q.cancel(ready) is True
    assert table.cancel(scheduled) is True
    assert q.get_job(ready) is None
    assert table.get_job(scheduled) is None
    assert current(q) == (0, 0, 0, 0, 0)
    assert totals(q)["cancelled"] == 2
    assert q.claim_one("w") is None


def test_cancel_processing_invalidates_the_lease(table: JobTable) -> None:
    # Contract: OPS-2.
    q = table.queue("q")
    q.enqueue(1)
    h = claim(q)
    assert q.cancel(h.id) is True
    assert q.get_job(h.id) is None
    assert h.heartbeat() is False
    assert h.ack() is False
    assert h.retry(delay_s=0) is False
    assert h.fail() is False
    assert table.lapse(h.id, h.lease) is False
    assert q.ack_batch([(h.id, h.lease)]) == 0
    assert current(q) == (0, 0, 0, 0, 0)
    assert totals(q)["completed"] == 0


def test_cancel_lapsed_job(table: JobTable, clock: ManualClock) -> None:
    # Contract: OPS-2.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=1))
    q.enqueue(1)
    h = claim(q)
    clock.advance(10)
    assert table.cancel(h.id) is True
    assert q.claim_one("w") is None
    assert sweep(q) == (0, 0, 0)
    assert current(q) == (0, 0, 0, 0, 0)


def test_cancel_dead_job(table: JobTable) -> None:
    # Contract: OPS-2.
    q = table.queue("q")
    q.enqueue(1)
    h = claim(q)
    h.fail()
    assert q.cancel(h.id) is True
    assert q.get_job(h.id) is None
    assert current(q) == (0, 0, 0, 0, 0)
    assert q.redrive(h.id) is False


def test_cancel_unknown_and_twice(table: JobTable) -> None:
    # Contract: OPS-2, JOB-4.
    q = table.queue("q")
    job_id = q.enqueue(1)
    assert q.cancel("no-such-job") is False
    assert table.cancel("no-such-job") is False
    assert q.cancel(job_id) is True
    assert q.cancel(job_id) is False
    assert table.cancel(job_id) is False
    assert totals(q)["cancelled"] == 1


# --- get_job -----------------------------------------------------------------------------


def test_get_job_returns_a_copy(table: JobTable) -> None:
    # Contract: OPS-3.
    q = table.queue("q")
    job_id = q.enqueue({"a": [1, {"b": 2}]})
    job = q.get_job(job_id)
    assert job is not None
    payload = job.payload
    payload["a"].append(3)
    payload["a"][1]["b"] = 99
    assert job.payload == {"a": [1, {"b": 2}]}
    assert q.get_job(job_id).payload == {"a": [1, {"b": 2}]}  # type: ignore[union-attr]
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.priority = 5  # type: ignore[misc]
    assert q.get_job(job_id).priority == 0  # type: ignore[union-attr]


def test_get_job_snapshot_does_not_follow_the_job(table: JobTable) -> None:
    # Contract: OPS-3.
    q = table.queue("q")
    job_id = q.enqueue(1)
    before = q.get_job(job_id)
    assert before is not None
    claim(q).fail("x")
    assert (before.state, before.attempts, before.last_error) == (JobState.PENDING, 0, None)
    assert table.get_job(job_id).state == JobState.DEAD  # type: ignore[union-attr]


def test_ids_are_never_reused(table: JobTable) -> None:
    # Contract: JOB-3.
    q = table.queue("q")
    seen = set()
    for i in range(20):
        job_id = q.enqueue(i)
        assert job_id not in seen
        seen.add(job_id)
        if i % 2:
            q.cancel(job_id)
        else:
            claim(q).ack()


# --- sweep -------------------------------------------------------------------------------


def test_sweep_kills_expired_pending_and_processing(table: JobTable, clock: ManualClock) -> None:
    # Contract: DLQ-3.
    q = table.queue("q", QueueOpts(visibility_timeout_s=100))
    ready = q.enqueue("ready", expires_s=10)
    scheduled = q.enqueue("scheduled", delay_s=50, expires_s=10)
    q.enqueue("held", expires_s=10, priority=5)
    held = claim(q)
    alive = q.enqueue("alive", expires_s=10.5)
    clock.set(START + 9.75)
    assert sweep(q) == (0, 0, 0)
    clock.set(START + 10)  # expires_at == now: expired
    assert sweep(q) == (3, 0, 0)
    for job_id in (ready, scheduled, held.id):
        job = q.get_job(job_id)
        assert job is not None
        assert (job.state, job.last_error, job.died_at) == (JobState.DEAD, "expired", START + 10)
        assert (job.worker_id, job.deadline) == (None, None)
    assert held.ack() is False  # its lease was valid, but the job died with the sweep
    assert q.get_job(alive).state == JobState.PENDING  # type: ignore[union-attr]
    assert sweep(q) == (0, 0, 0)


def test_expired_job_with_valid_lease_acks_until_the_sweep(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: DLQ-3, HND-1.
    q = table.queue("q", QueueOpts(visibility_timeout_s=100))
    q.enqueue(1, expires_s=10)
    h = claim(q)
    clock.set(START + 20)
    assert h.ack() is True  # the validity predicate does not look at expiry


def test_sweep_kills_used_up_lapsed_leases_only(table: JobTable, clock: ManualClock) -> None:
    # Contract: DLQ-3.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=1))
    used = q.enqueue("used")
    has_more = q.enqueue("more", max_attempts=2)
    later = q.enqueue("later", visibility_timeout_s=20)
    assert len(q.claim_batch("w", 3)) == 3
    clock.set(START + 10)
    assert sweep(q) == (0, 1, 0)
    job = q.get_job(used)
    assert job is not None
    assert (job.state, job.last_error, job.died_at) == (
        JobState.DEAD,
        "max attempts exceeded",
        START + 10,
    )
    assert q.get_job(has_more).state == JobState.PROCESSING  # type: ignore[union-attr]
    assert q.get_job(later).state == JobState.PROCESSING  # type: ignore[union-attr]
    assert claim(q).id == has_more  # a lapsed job with attempts left stays reclaimable


def test_sweep_counts_expired_and_used_up_as_expired(table: JobTable, clock: ManualClock) -> None:
    # Contract: DLQ-3, CLM-4.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=1))
    job_id = q.enqueue(1, expires_s=20)
    claim(q)
    clock.set(START + 20)
    assert sweep(q) == (1, 0, 0)
    assert q.get_job(job_id).last_error == "expired"  # type: ignore[union-attr]


def test_queue_sweep_is_scoped_and_table_sweep_sums(table: JobTable, clock: ManualClock) -> None:
    # Contract: DLQ-5.
    a = table.queue("a")
    b = table.queue("b", QueueOpts(dead_letter_retention_s=0))
    a.enqueue(1, expires_s=5)
    b.enqueue(1, expires_s=5)
    b.enqueue(2, expires_s=5)
    clock.advance(5)
    assert sweep(a) == (1, 0, 0)
    assert b.stats().pending == 2
    result = table.sweep_expired()
    assert (result.expired, result.exhausted, result.purged) == (2, 0, 2)
    assert b.stats().dead == 0


# --- retention ---------------------------------------------------------------------------


def test_retention_none_keeps_dead_rows_forever(table: JobTable, clock: ManualClock) -> None:
    # Contract: DLQ-2.
    q = table.queue("q")
    q.enqueue(1)
    h = claim(q)
    h.fail()
    clock.advance(10**9)
    assert sweep(q) == (0, 0, 0)
    assert q.get_job(h.id).state == JobState.DEAD  # type: ignore[union-attr]


def test_retention_zero_deletes_in_the_same_sweep(table: JobTable, clock: ManualClock) -> None:
    # Contract: DLQ-4.
    q = table.queue("q", QueueOpts(dead_letter_retention_s=0, visibility_timeout_s=10))
    expiring = q.enqueue("e", expires_s=5)
    q.enqueue("u", max_attempts=1, priority=1)
    used = claim(q)
    failed_id = q.enqueue("f", priority=2)
    claim(q).fail()
    assert q.get_job(failed_id).state == JobState.DEAD  # type: ignore[union-attr]
    clock.set(START + 10)
    assert sweep(q) == (1, 1, 3)
    for job_id in (expiring, used.id, failed_id):
        assert q.get_job(job_id) is None
    assert current(q) == (0, 0, 0, 0, 0)


def test_retention_seconds(table: JobTable, clock: ManualClock) -> None:
    # Contract: DLQ-2, DLQ-3.
    q = table.queue("q", QueueOpts(dead_letter_retention_s=100))
    q.enqueue(1)
    h = claim(q)
    clock.set(START + 5)
    h.fail()
    clock.set(START + 104.75)
    assert sweep(q) == (0, 0, 0)
    assert q.get_job(h.id) is not None
    clock.set(START + 105)  # died_at + retention == now
    assert sweep(q) == (0, 0, 1)
    assert q.get_job(h.id) is None
    assert q.stats().dead == 0


# --- redrive and purge -------------------------------------------------------------------


def test_redrive_dead_job(table: JobTable, clock: ManualClock) -> None:
    # Contract: OPS-5.
    q = table.queue("q", QueueOpts(max_attempts=2))
    job_id = q.enqueue({"x": 1}, priority=4)
    h = claim(q)
    h.retry("first", delay_s=0)
    claim(q).fail("second")
    clock.set(START + 30)
    assert q.redrive(job_id) is True
    job = q.get_job(job_id)
    assert job is not None
    assert job.state == JobState.PENDING
    assert job.attempts == 0
    assert job.ready_at == START + 30
    assert job.died_at is None
    assert job.last_error == "second"
    assert (job.worker_id, job.deadline) == (None, None)
    assert (job.priority, job.payload, job.max_attempts) == (4, {"x": 1}, 2)
    assert current(q) == (1, 0, 0, 0, 1)
    h2 = claim(q)
    assert h2.job.attempts == 1
    assert h2.retry(delay_s=0) is True  # attempts start over: 1 < 2
    assert q.get_job(job_id).state == JobState.PENDING  # type: ignore[union-attr]


def test_redrive_only_moves_dead_jobs(table: JobTable) -> None:
    # Contract: OPS-5, OPS-1.
    q = table.queue("q")
    other = table.queue("other")
    pending = q.enqueue(1)
    q.enqueue(2)
    h = claim(q)
    assert q.redrive(pending) is False
    assert q.redrive(h.id) is False
    assert q.redrive("no-such-job") is False
    h.fail()
    assert other.redrive(h.id) is False
    assert q.get_job(h.id).state == JobState.DEAD  # type: ignore[union-attr]
    assert table.redrive(h.id) is True
    assert q.get_job(h.id).state == JobState.PENDING  # type: ignore[union-attr]


def test_purge_dead_removes_this_queues_dead_rows_only(table: JobTable) -> None:
    # Contract: OPS-6, OPS-1.
    q = table.queue("q")
    other = table.queue("other")
    for i in range(3):
        q.enqueue(i)
    other.enqueue("o")
    claim(q).fail()
    claim(q).fail()
    claim(other).fail()
    assert q.purge_dead() == 2
    assert q.purge_dead() == 0
    assert current(q) == (1, 0, 0, 0, 1)
    assert other.stats().dead == 1


# --- stats -------------------------------------------------------------------------------


def test_stats_follow_every_transition(table: JobTable, clock: ManualClock) -> None:
    # Contract: CST-4.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=2))
    assert current(q) == (0, 0, 0, 0, 0)
    assert q.stats().paused is False
    a = q.enqueue("a")
    b = q.enqueue("b", delay_s=20)
    q.enqueue("c", priority=-1)
    assert current(q) == (2, 1, 0, 0, 2 + 1)
    ha = claim(q)
    assert ha.id == a
    assert current(q) == (1, 1, 1, 0, 2)
    assert ha.retry("e", delay_s=5) is True
    assert current(q) == (1, 1 + 1, 0, 0, 3)
    assert totals(q) == dict(enqueued=3, completed=0, retried=1, dead=0, expired=0, cancelled=0)
    clock.set(START + 5)  # a matures
    assert current(q) == (2, 1, 0, 0, 3)
    ha = claim(q)
    assert ha.id == a
    hc = claim(q)
    assert current(q) == (0, 1, 2, 0, 1)
    assert ha.ack() is True
    assert totals(q)["completed"] == 1
    clock.set(START + 15)  # c's lease lapsed, not yet reclaimed: still processing
    assert current(q) == (0, 1, 1, 0, 1)
    assert hc.heartbeat() is False
    assert claim(q).fail() is True
    assert current(q) == (0, 1, 0, 1, 1)
    assert totals(q)["dead"] == 1
    clock.set(START + 20)  # b matures
    assert current(q) == (1, 0, 0, 1, 1)
    assert q.cancel(b) is True
    assert q.redrive(hc.id) is True
    assert current(q) == (1, 0, 0, 0, 1)
    t = totals(q)
    assert (t["enqueued"], t["completed"], t["dead"], t["expired"], t["cancelled"]) == (
        3,
        1,
        1,
        0,
        1,
    )


def test_stats_count_expiry_and_exhaustion(table: JobTable, clock: ManualClock) -> None:
    # Contract: CST-4.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=1))
    q.enqueue("e", expires_s=5)
    q.enqueue("u", priority=1)
    claim(q)
    clock.set(START + 10)
    assert sweep(q) == (1, 1, 0)
    assert current(q) == (0, 0, 0, 2, 0)
    assert totals(q)["expired"] == 1
    assert totals(q)["enqueued"] == 2


def test_stats_ready_and_scheduled_move_with_the_clock(table: JobTable, clock: ManualClock) -> None:
    # Contract: CST-4.
    q = table.queue("q")
    q.enqueue(1, delay_s=10)
    q.enqueue(2, run_at=START + 20)
    q.enqueue(3)
    assert current(q) == (1, 2, 0, 0, 3)
    clock.set(START + 9.75)
    assert current(q) == (1, 2, 0, 0, 3)
    clock.set(START + 10)
    assert current(q) == (2, 1, 0, 0, 3)
    clock.set(START + 25)
    assert current(q) == (3, 0, 0, 0, 3)


def test_stats_are_per_queue(table: JobTable) -> None:
    # Contract: CST-4.
    a, b = table.queue("a"), table.queue("b")
    a.enqueue(1)
    a.enqueue(2)
    b.enqueue(3, delay_s=1)
    assert current(a) == (2, 0, 0, 0, 2)
    assert current(b) == (0, 1, 0, 0, 1)
    assert totals(b)["enqueued"] == 1


# --- next_event_at -----------------------------------------------------------------------


def test_next_event_at_none_when_nothing_is_timed(table: JobTable) -> None:
    # Contract: TIM-4.
    assert table.next_event_at() is None
    q = table.queue("q")
    q.enqueue(1)  # ready, no expiry: nothing timed
    assert table.next_event_at() is None
    claim(q).fail()  # dead, kept forever
    assert table.next_event_at() is None


def test_next_event_at_scheduled_job(table: JobTable) -> None:
    # Contract: TIM-4.
    q = table.queue("q")
    q.enqueue(1, delay_s=40)
    q.enqueue(2, delay_s=15.5)
    assert table.next_event_at() == START + 15.5


def test_next_event_at_lease_lapse_and_heartbeat(table: JobTable, clock: ManualClock) -> None:
    # Contract: TIM-4.
    q = table.queue("q", QueueOpts(visibility_timeout_s=30))
    q.enqueue(1)
    h = claim(q)
    assert table.next_event_at() == START + 30
    clock.set(START + 10)
    assert h.heartbeat() is True
    assert table.next_event_at() == START + 40
    assert h.ack() is True
    assert table.next_event_at() is None


def test_next_event_at_expiry(table: JobTable) -> None:
    # Contract: TIM-4.
    q = table.queue("q")
    q.enqueue(1, expires_s=50)
    q.enqueue(2, delay_s=80)
    assert table.next_event_at() == START + 50


def test_next_event_at_retention(table: JobTable, clock: ManualClock) -> None:
    # Contract: TIM-4.
    q = table.queue("q", QueueOpts(dead_letter_retention_s=100))
    q.enqueue(1)
    h = claim(q)
    clock.set(START + 5)
    h.fail()
    assert table.next_event_at() == START + 105
    clock.set(START + 105)
    assert sweep(q) == (0, 0, 1)
    assert table.next_event_at() is None


def test_next_event_at_is_the_earliest_across_queues(table: JobTable) -> None:
    # Contract: TIM-4.
    a = table.queue("a", QueueOpts(visibility_timeout_s=30))
    b = table.queue("b")
    a.enqueue(1)
    claim(a)  # lapses at +30
    b.enqueue(2, delay_s=60)
    b.enqueue(3, expires_s=45)
    assert table.next_event_at() == START + 30


def test_next_event_at_due_sweep_is_not_in_the_future(table: JobTable, clock: ManualClock) -> None:
    # Contract: TIM-4.
    q = table.queue("q")
    q.enqueue(1, expires_s=10)
    clock.set(START + 15)
    due = table.next_event_at()
    assert due is not None
    assert due <= START + 15
    assert sweep(q) == (1, 0, 0)
    assert table.next_event_at() is None


def test_next_event_at_due_for_used_up_lapsed_lease(table: JobTable, clock: ManualClock) -> None:
    # Contract: TIM-4.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=1))
    q.enqueue(1)
    claim(q)
    assert table.next_event_at() == START + 10
    clock.set(START + 12)
    due = table.next_event_at()
    assert due is not None
    assert due <= START + 12  # the used-up row waits for a sweep that is due now
    assert sweep(q) == (0, 1, 0)
    assert table.next_event_at() is None


def test_only_the_id_as_written_names_the_job(table: JobTable) -> None:
    # Contract: JOB-3.
    q = table.queue("q")
    for n in range(0x1E):
        q.enqueue(n)
    job_id = q.enqueue("this one")
    assert job_id == "t1f"  # the table's prefix is "t": prefix + lowercase hex of the seq
    assert table.get_job(job_id) is not None
    # Spellings int(x, 16) would read as the same number name nothing, nor does junk.
    for other in ["t01f", "t1F", "t+1f", "t 1f", "t1f ", "t1_f", "t0x1f", "t", "1f", "T1f",
                  "t\uff11f", "t" + "f" * 33, "t-1f", "t0"]:  # fmt: skip
        assert table.get_job(other) is None, other
        assert table.cancel(other) is False, other
    assert table.get_job(job_id) is not None
