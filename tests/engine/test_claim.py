"""``docs/contract.md``, "Claiming" (CLM-1 to CLM-9): order, n, pause, reclaim, expiry,
meeting rows, exactly-once."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from conveyor.broker.engine import InvalidArgument, JobState, JobTable, QueueOpts

if TYPE_CHECKING:
    from conftest import ManualClock

START = 1000.0  # where the conftest's ManualClock starts


def test_claim_sets_processing_fields(table: JobTable, clock: ManualClock) -> None:
    # Contract: CLM-7.
    q = table.queue("q", QueueOpts(visibility_timeout_s=30))
    job_id = q.enqueue({"p": 1})
    clock.advance(2)
    h = q.claim_one("w1")
    assert h is not None
    assert h.id == job_id
    assert isinstance(h.lease, str)
    assert h.lease
    job = q.get_job(job_id)
    assert job is not None
    assert job.state == JobState.PROCESSING
    assert job.attempts == 1
    assert job.worker_id == "w1"
    assert job.deadline == START + 32
    assert job.payload == {"p": 1}


def test_claim_order_priority_descending(table: JobTable) -> None:
    # Contract: CLM-6.
    q = table.queue("q")
    low = q.enqueue("low", priority=-1)
    mid = q.enqueue("mid", priority=0)
    high = q.enqueue("high", priority=5)
    top = q.enqueue("top", priority=2**31 - 1)
    bottom = q.enqueue("bottom", priority=-(2**31))
    assert [h.id for h in q.claim_batch("w", 10)] == [top, high, mid, low, bottom]


def test_claim_order_ready_time_before_seq(table: JobTable, clock: ManualClock) -> None:
    # Contract: CLM-6.
    q = table.queue("q")
    late = q.enqueue("late", run_at=START + 10)  # older seq, ready at +10
    clock.advance(5)
    early = q.enqueue("early")  # younger seq, ready at +5
    clock.set(START + 10)
    assert [h.id for h in q.claim_batch("w", 10)] == [early, late]


def test_claim_order_fifo_seq_on_ties(table: JobTable, clock: ManualClock) -> None:
    # Contract: CLM-6.
    q = table.queue("q")
    a = q.enqueue("a", delay_s=10)  # ready at +10, seq 1
    clock.advance(10)
    b = q.enqueue("b")  # ready at +10, seq 2
    c = q.enqueue("c")  # ready at +10, seq 3
    assert [h.id for h in q.claim_batch("w", 2)] == [a, b]
    assert [h.id for h in q.claim_batch("w", 2)] == [c]


def test_claim_priority_beats_ready_time(table: JobTable, clock: ManualClock) -> None:
    # Contract: CLM-6.
    q = table.queue("q")
    old = q.enqueue("old")
    clock.advance(100)
    urgent = q.enqueue("urgent", priority=1)
    assert [h.id for h in q.claim_batch("w", 2)] == [urgent, old]


def test_scheduled_job_is_not_claimable_before_ready_at(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: CLM-2.
    q = table.queue("q")
    job_id = q.enqueue(1, delay_s=10)
    clock.advance(9.5)
    assert q.claim_one("w") is None
    clock.advance(0.5)  # now == ready_at
    h = q.claim_one("w")
    assert h is not None
    assert h.id == job_id


def test_reclaim_is_ordered_by_its_lapsed_deadline(table: JobTable, clock: ManualClock) -> None:
    # Contract: CLM-6.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10))
    x = q.enqueue("x")  # seq 1
    assert q.claim_one("w").id == x  # type: ignore[union-attr]  # deadline +10
    clock.set(START + 5)
    y = q.enqueue("y")  # ready +5
    clock.set(START + 12)
    z = q.enqueue("z")  # ready +12
    clock.set(START + 20)
    hs = q.claim_batch("w2", 3)
    assert [h.id for h in hs] == [y, x, z]
    assert hs[1].job.attempts == 2


def test_reclaim_issues_a_new_lease_and_the_old_one_is_dead(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: CLM-2, CLM-7, HND-1.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10))
    q.enqueue(1)
    h1 = q.claim_one("w1")
    assert h1 is not None
    clock.advance(10)
    h2 = q.claim_one("w2")
    assert h2 is not None
    assert h2.id == h1.id
    assert h2.lease != h1.lease
    assert h2.job.worker_id == "w2"
    assert h2.job.deadline == START + 20
    assert h1.ack() is False
    assert h1.heartbeat() is False
    assert h2.ack() is True


@pytest.mark.parametrize("n", [0, -1, -100])
def test_n_not_positive_claims_nothing(table: JobTable, n: int) -> None:
    # Contract: CLM-1.
    q = table.queue("q")
    job_id = q.enqueue(1)
    assert q.claim_batch("w", n) == []
    job = q.get_job(job_id)
    assert job is not None
    assert (job.state, job.attempts) == (JobState.PENDING, 0)


def test_n_zero_meets_no_row(table: JobTable, clock: ManualClock) -> None:
    # Contract: CLM-1, CLM-5.
    q = table.queue("q")
    job_id = q.enqueue(1, expires_s=5)
    clock.advance(5)
    assert q.claim_batch("w", 0) == []
    assert q.get_job(job_id).state == JobState.PENDING  # type: ignore[union-attr]


def test_claim_batch_returns_at_most_n(table: JobTable) -> None:
    # Contract: CLM-1.
    q = table.queue("q")
    ids = [q.enqueue(i) for i in range(5)]
    assert [h.id for h in q.claim_batch("w", 3)] == ids[:3]
    assert [h.id for h in q.claim_batch("w", 3)] == ids[3:]
    assert q.claim_batch("w", 3) == []
    assert q.claim_one("w") is None


@pytest.mark.parametrize("worker_id", ["", None, 5, b"w", "w" * 257, "\ud800"])
def test_worker_id_checked_before_n(table: JobTable, worker_id: object) -> None:
    # Contract: CLM-9.
    q = table.queue("q")
    q.enqueue(1)
    for n in (0, -1, 1, "x"):
        with pytest.raises(InvalidArgument) as info:
            q.claim_batch(worker_id, n)  # type: ignore[arg-type]
        assert info.value.field == "worker_id"
    with pytest.raises(InvalidArgument) as info:
        q.claim_one(worker_id)  # type: ignore[arg-type]
    assert info.value.field == "worker_id"
    assert q.stats().ready == 1


@pytest.mark.parametrize("n", [True, 1.0, "1", None])
def test_n_must_be_an_int(table: JobTable, n: object) -> None:
    # Contract: CLM-9.
    q = table.queue("q")
    q.enqueue(1)
    with pytest.raises(InvalidArgument) as info:
        q.claim_batch("w", n)  # type: ignore[arg-type]
    assert info.value.field == "n"
    assert q.stats().ready == 1


def test_paused_queue_hands_out_nothing_and_resume_restores(table: JobTable) -> None:
    # Contract: CLM-2, OPS-4.
    q = table.queue("q")
    other = table.queue("other")
    a = q.enqueue("a")
    held = q.claim_one("w")
    assert held is not None
    assert held.id == a
    b = q.enqueue("b")
    other.enqueue("o")
    q.pause()
    assert q.paused is True
    assert q.stats().paused is True
    assert q.claim_one("w") is None
    assert q.claim_batch("w", 5) == []
    # pausing stops hand-outs and nothing else
    assert other.claim_one("w") is not None
    c = q.enqueue("c")
    assert held.heartbeat() is True
    assert held.ack() is True
    assert q.stats().ready == 2
    q.resume()
    assert q.paused is False
    assert [h.id for h in q.claim_batch("w", 5)] == [b, c]


def test_paused_queue_claim_meets_no_row(table: JobTable, clock: ManualClock) -> None:
    # Contract: OPS-4.
    q = table.queue("q")
    job_id = q.enqueue(1, expires_s=5)
    q.pause()
    clock.advance(5)
    assert q.claim_one("w") is None
    assert q.get_job(job_id).state == JobState.PENDING  # type: ignore[union-attr]
    assert q.sweep_expired().expired == 1  # expiry is not a hand-out: a sweep still kills it
    assert q.get_job(job_id).state == JobState.DEAD  # type: ignore[union-attr]


def test_reclaim_consumes_an_attempt_and_used_up_job_dies_in_the_claim(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: CLM-3, CLM-5.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=2))
    a = q.enqueue("a")
    assert q.claim_one("w").job.attempts == 1  # type: ignore[union-attr]
    clock.set(START + 10)
    h2 = q.claim_one("w")
    assert h2 is not None
    assert (h2.id, h2.job.attempts) == (a, 2)
    clock.set(START + 20)
    b = q.enqueue("b")  # ready +20 like a's lapsed deadline, but a younger seq: a comes first
    h = q.claim_one("w")
    assert h is not None
    assert h.id == b  # the claim went on to the next row
    job = q.get_job(a)
    assert job is not None
    assert job.state == JobState.DEAD
    assert job.last_error == "max attempts exceeded"
    assert job.died_at == START + 20
    assert job.attempts == 2
    assert (job.worker_id, job.deadline) == (None, None)
    assert h2.ack() is False
    assert q.stats().dead == 1
    assert q.stats().totals.dead == 1


def test_used_up_lapsed_job_alone_dies_and_claim_returns_none(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: CLM-3.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=1))
    a = q.enqueue("a")
    assert q.claim_one("w") is not None
    clock.advance(10)
    assert q.claim_one("w") is None
    assert q.get_job(a).last_error == "max attempts exceeded"  # type: ignore[union-attr]


def test_expired_job_is_never_handed_out_and_dies_in_the_claim(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: CLM-4.
    q = table.queue("q")
    doomed = q.enqueue("doomed", priority=1, expires_s=10)
    fine = q.enqueue("fine")
    clock.set(START + 10)  # now == expires_at: expired
    h = q.claim_one("w")
    assert h is not None
    assert h.id == fine
    job = q.get_job(doomed)
    assert job is not None
    assert job.state == JobState.DEAD
    assert job.last_error == "expired"
    assert job.died_at == START + 10
    assert job.attempts == 0
    assert q.stats().totals.expired == 1


def test_job_just_before_expiry_is_handed_out(table: JobTable, clock: ManualClock) -> None:
    # Contract: CLM-2.
    q = table.queue("q")
    job_id = q.enqueue(1, expires_s=10)
    clock.set(START + 9.75)
    h = q.claim_one("w")
    assert h is not None
    assert h.id == job_id


def test_lapsed_expired_job_dies_expired_in_the_claim(table: JobTable, clock: ManualClock) -> None:
    # Contract: CLM-4.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=3))
    job_id = q.enqueue(1, expires_s=15)
    assert q.claim_one("w") is not None
    clock.set(START + 15)
    assert q.claim_one("w2") is None
    job = q.get_job(job_id)
    assert job is not None
    assert (job.state, job.last_error, job.died_at) == (JobState.DEAD, "expired", START + 15)


def test_expired_and_used_up_dies_as_expired(table: JobTable, clock: ManualClock) -> None:
    # Contract: CLM-4.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=1))
    job_id = q.enqueue(1, expires_s=20)
    assert q.claim_one("w") is not None
    clock.set(START + 20)
    assert q.claim_one("w2") is None
    job = q.get_job(job_id)
    assert job is not None
    assert (job.state, job.last_error) == (JobState.DEAD, "expired")
    assert q.stats().totals.expired == 1


def test_rows_a_claim_does_not_reach_are_untouched_until_sweep(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: CLM-5.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=1))
    used_hi = q.enqueue("used-hi", priority=8)
    used_lo = q.enqueue("used-lo", priority=0)
    assert [h.id for h in q.claim_batch("w", 2)] == [used_hi, used_lo]  # deadlines +10
    expired_hi = q.enqueue("expired-hi", priority=10, expires_s=5)
    handed = q.enqueue("handed", priority=7)
    expired_lo = q.enqueue("expired-lo", priority=1, expires_s=5)
    plain = q.enqueue("plain", priority=-1)
    clock.set(START + 10)
    # rows in claim order: expired-hi (10), used-hi (8), handed (7), expired-lo (1),
    # used-lo (0), plain (-1). The claim meets the first two, hands out the third, and stops.
    assert [h.id for h in q.claim_batch("w2", 1)] == [handed]
    assert q.get_job(expired_hi).last_error == "expired"  # type: ignore[union-attr]
    assert q.get_job(used_hi).last_error == "max attempts exceeded"  # type: ignore[union-attr]
    assert q.get_job(expired_lo).state == JobState.PENDING  # type: ignore[union-attr]
    assert q.get_job(used_lo).state == JobState.PROCESSING  # type: ignore[union-attr]
    assert q.get_job(used_lo).attempts == 1  # type: ignore[union-attr]
    assert q.get_job(plain).state == JobState.PENDING  # type: ignore[union-attr]
    result = q.sweep_expired()
    assert (result.expired, result.exhausted, result.purged) == (1, 1, 0)
    assert q.get_job(expired_lo).last_error == "expired"  # type: ignore[union-attr]
    assert q.get_job(expired_lo).died_at == START + 10  # type: ignore[union-attr]
    assert q.get_job(used_lo).last_error == "max attempts exceeded"  # type: ignore[union-attr]
    assert q.get_job(plain).state == JobState.PENDING  # type: ignore[union-attr]


def test_claim_meets_several_rows_before_filling(table: JobTable, clock: ManualClock) -> None:
    # Contract: CLM-5.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=1))
    used = q.enqueue("used", priority=3)
    assert q.claim_one("w") is not None
    e1 = q.enqueue("e1", priority=2, expires_s=10)
    ok1 = q.enqueue("ok1", priority=1)
    e2 = q.enqueue("e2", priority=1, expires_s=10)
    ok2 = q.enqueue("ok2", priority=0)
    after = q.enqueue("after", priority=-1, expires_s=10)
    clock.set(START + 10)
    assert [h.id for h in q.claim_batch("w", 2)] == [ok1, ok2]
    assert q.get_job(used).last_error == "max attempts exceeded"  # type: ignore[union-attr]
    assert q.get_job(e1).last_error == "expired"  # type: ignore[union-attr]
    assert q.get_job(e2).last_error == "expired"  # type: ignore[union-attr]
    assert q.get_job(after).state == JobState.PENDING  # type: ignore[union-attr]
    stats = q.stats()
    assert (stats.dead, stats.processing, stats.ready) == (3, 2, 1)


def test_exactly_once_while_lease_is_valid(table: JobTable, clock: ManualClock) -> None:
    # Contract: CLM-8.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10))
    job_id = q.enqueue(1)
    h = q.claim_one("w1")
    assert h is not None
    for t in (0, 5, 9.75):
        clock.set(START + t)
        assert q.claim_one("w2") is None
        assert q.claim_batch("w3", 100) == []
    assert h.heartbeat() is True  # deadline now +19.75
    clock.set(START + 19.5)
    assert q.claim_one("w2") is None
    clock.set(START + 19.75)
    h2 = q.claim_one("w2")
    assert h2 is not None
    assert h2.id == job_id
    assert q.claim_one("w3") is None


def test_batch_claim_never_returns_a_job_twice(table: JobTable) -> None:
    # Contract: CLM-8.
    q = table.queue("q")
    for i in range(20):
        q.enqueue(i, priority=i % 3)
    ids = [h.id for h in q.claim_batch("w", 100)]
    assert len(ids) == 20
    assert len(set(ids)) == 20


def test_claim_snapshot_is_unaffected_by_later_changes(table: JobTable, clock: ManualClock) -> None:
    # Contract: OPS-3.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10))
    q.enqueue({"list": [1, 2]})
    h = q.claim_one("w")
    assert h is not None
    snap = h.job
    clock.advance(5)
    assert h.heartbeat() is True
    assert q.get_job(h.id).deadline == START + 15  # type: ignore[union-attr]
    assert h.job.deadline == START + 10
    assert h.job.state == JobState.PROCESSING
    assert h.job.attempts == 1
    h.job.payload["list"].append(3)
    assert q.get_job(h.id).payload == {"list": [1, 2]}  # type: ignore[union-attr]
    assert h.retry(delay_s=0) is True
    assert h.job.state == JobState.PROCESSING
    assert h.job.worker_id == "w"
    assert snap.deadline == START + 10
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.job.attempts = 99  # type: ignore[misc]


def test_a_worker_id_of_256_characters_is_accepted(table: JobTable) -> None:
    # Contract: LIM-2.
    q = table.queue("q")
    q.enqueue(1)
    h = q.claim_one("w" * 256)
    assert h is not None and h.job.worker_id == "w" * 256
