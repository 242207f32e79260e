"""``docs/contract.md``, "Handle operations" (HND-1 to HND-11): the validity predicate, ack,
retry, fail, heartbeat, lapse; and the limits on error strings (LIM-3, LIM-5)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import pytest

from conveyor.broker.engine import (
    CLAIM_FIELDS,
    ROW_FIELDS,
    UPDATE_FIELDS,
    InvalidArgument,
    JobHandle,
    JobState,
    JobTable,
    QueueOpts,
)

if TYPE_CHECKING:
    from conftest import ManualClock

START = 1000.0  # where the conftest's ManualClock starts


def claimed(table: JobTable, **opts: Any) -> JobHandle:
    q = table.queue("q", QueueOpts(**opts)) if opts else table.queue("q")
    q.enqueue({"n": 1})
    h = q.claim_one("w")
    assert h is not None
    return h


def snapshot(table: JobTable, job_id: str) -> Any:
    job = table.get_job(job_id)
    assert job is not None
    return job


# --- the validity predicate --------------------------------------------------------------


def test_lease_lapses_exactly_at_the_deadline(table: JobTable, clock: ManualClock) -> None:
    # Contract: HND-1.
    h = claimed(table, visibility_timeout_s=10)
    clock.set(START + 10)  # now == deadline
    before = snapshot(table, h.id)
    assert h.heartbeat() is False
    assert h.ack() is False
    assert h.retry("e") is False
    assert h.fail("e") is False
    assert table.ack(h.id, h.lease) is False
    assert snapshot(table, h.id) == before
    assert before.state == JobState.PROCESSING


def test_lease_valid_just_before_the_deadline(table: JobTable, clock: ManualClock) -> None:
    # Contract: HND-1.
    h = claimed(table, visibility_timeout_s=10)
    clock.set(START + 9.75)
    assert h.ack() is True
    assert table.get_job(h.id) is None


@pytest.mark.parametrize("op", ["ack", "retry", "fail", "heartbeat", "lapse"])
def test_wrong_lease_is_refused_and_changes_nothing(table: JobTable, op: str) -> None:
    # Contract: HND-1, HND-2.
    h = claimed(table)
    before = snapshot(table, h.id)
    assert getattr(table, op)(h.id, h.lease + "x") is False
    assert getattr(table, op)(h.id, "") is False
    assert snapshot(table, h.id) == before
    assert h.ack() is True


@pytest.mark.parametrize("op", ["ack", "retry", "fail", "heartbeat", "lapse"])
def test_unknown_id_is_refused(table: JobTable, op: str) -> None:
    # Contract: HND-2.
    h = claimed(table)
    assert getattr(table, op)("no-such-job", h.lease) is False
    assert h.heartbeat() is True


@pytest.mark.parametrize("op", ["ack", "retry", "fail", "heartbeat", "lapse"])
def test_a_lease_names_only_its_own_job(table: JobTable, op: str) -> None:
    """A report carrying one claim's lease but another job's id (or a malformed one) does
    not land on either job: a lease proves nothing about a job it was not issued for."""
    # Contract: HND-1.
    q = table.queue("q")
    q.enqueue({"n": 1})
    q.enqueue({"n": 2})
    h1, h2 = q.claim_batch("w", 2)
    before = (snapshot(table, h1.id), snapshot(table, h2.id))
    assert getattr(table, op)(h2.id, h1.lease) is False
    assert getattr(table, op)(h1.id.upper(), h1.lease) is False
    assert table.ack_many([(h2.id, h1.lease), (h1.id, h2.lease)]) == [False, False]
    assert (snapshot(table, h1.id), snapshot(table, h2.id)) == before
    assert table.ack_many([(h1.id, h1.lease), (h2.id, h2.lease)]) == [True, True]


def test_other_queues_id_is_unknown_to_queue_ops(table: JobTable) -> None:
    # Contract: OPS-1.
    h = claimed(table)
    other = table.queue("other")
    assert other.ack_batch([(h.id, h.lease)]) == 0
    assert other.get_job(h.id) is None
    assert other.cancel(h.id) is False
    assert other.redrive(h.id) is False
    assert snapshot(table, h.id).state == JobState.PROCESSING
    assert h.ack() is True


# --- heartbeat ---------------------------------------------------------------------------


def test_heartbeat_is_an_absolute_reset(table: JobTable, clock: ManualClock) -> None:
    # Contract: HND-8.
    h = claimed(table, visibility_timeout_s=10)
    clock.set(START + 4)
    assert h.heartbeat() is True
    assert snapshot(table, h.id).deadline == START + 14
    assert h.heartbeat() is True  # repeatable, and not additive
    assert h.heartbeat() is True
    assert snapshot(table, h.id).deadline == START + 14
    clock.set(START + 13.5)
    assert h.heartbeat() is True
    assert snapshot(table, h.id).deadline == START + 23.5
    clock.set(START + 23.25)
    assert table.heartbeat(h.id, h.lease) is True
    assert snapshot(table, h.id).deadline == START + 33.25
    assert snapshot(table, h.id).attempts == 1
    clock.set(START + 33.25)
    assert h.heartbeat() is False


def test_heartbeat_uses_the_jobs_own_visibility(table: JobTable, clock: ManualClock) -> None:
    # Contract: HND-8.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10))
    q.enqueue(1, visibility_timeout_s=2.5)
    h = q.claim_one("w")
    assert h is not None
    assert h.job.deadline == START + 2.5
    clock.advance(2)
    assert h.heartbeat() is True
    assert snapshot(table, h.id).deadline == START + 4.5


# --- one-shot terminal operations --------------------------------------------------------


@pytest.mark.parametrize("first", ["ack", "retry", "fail"])
def test_terminal_operations_are_one_shot(table: JobTable, first: str) -> None:
    # Contract: HND-9.
    h = claimed(table, max_attempts=5)
    assert getattr(h, first)() is True
    after = table.get_job(h.id)
    assert h.ack() is False
    assert h.retry() is False
    assert h.retry("e", delay_s=0) is False
    assert h.fail("e") is False
    assert h.heartbeat() is False
    assert table.lapse(h.id, h.lease) is False
    assert table.get_job(h.id) == after


def test_old_lease_stays_dead_after_the_job_is_claimed_again(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: HND-1, CLM-7.
    q = table.queue("q", QueueOpts(max_attempts=5))
    q.enqueue(1)
    h1 = q.claim_one("w1")
    assert h1 is not None
    assert h1.retry(delay_s=0) is True
    h2 = q.claim_one("w2")
    assert h2 is not None
    assert h2.id == h1.id
    assert h1.ack() is False
    assert h1.heartbeat() is False
    assert h2.ack() is True


# --- ack ---------------------------------------------------------------------------------


def test_ack_deletes_the_job(table: JobTable) -> None:
    # Contract: HND-5, JOB-4.
    h = claimed(table)
    q = table.queue("q")
    assert h.ack() is True
    assert table.get_job(h.id) is None
    assert q.get_job(h.id) is None
    s = q.stats()
    assert (s.processing, s.pending, s.dead, s.totals.completed) == (0, 0, 0, 1)


# --- retry -------------------------------------------------------------------------------


def test_retry_returns_job_to_pending(table: JobTable, clock: ManualClock) -> None:
    # Contract: HND-6.
    h = claimed(table, max_attempts=3)
    clock.set(START + 3)
    assert h.retry("boom", delay_s=7.5) is True
    job = snapshot(table, h.id)
    assert job.state == JobState.PENDING
    assert job.ready_at == START + 10.5
    assert job.last_error == "boom"
    assert (job.worker_id, job.deadline, job.died_at) == (None, None, None)
    assert job.attempts == 1
    q = table.queue("q")
    assert (q.stats().scheduled, q.stats().totals.retried) == (1, 1)
    clock.set(START + 10.25)
    assert q.claim_one("w") is None
    clock.set(START + 10.5)
    h2 = q.claim_one("w")
    assert h2 is not None
    assert h2.job.attempts == 2


def test_retry_delay_zero_is_ready_now(table: JobTable, clock: ManualClock) -> None:
    # Contract: HND-6.
    h = claimed(table)
    clock.set(START + 1)
    assert h.retry(delay_s=0) is True
    assert snapshot(table, h.id).ready_at == START + 1
    assert table.queue("q").stats().ready == 1


@pytest.mark.parametrize(
    ("error", "expected"),
    [("boom", "boom"), (None, "max attempts exceeded"), ("", "max attempts exceeded")],
)
def test_retry_at_max_attempts_dies(
    table: JobTable, clock: ManualClock, error: str | None, expected: str
) -> None:
    # Contract: HND-6.
    h = claimed(table, max_attempts=1)
    clock.set(START + 2)
    assert h.retry(error, delay_s=0) is True
    job = snapshot(table, h.id)
    assert job.state == JobState.DEAD
    assert job.last_error == expected
    assert job.died_at == START + 2
    assert (job.worker_id, job.deadline) == (None, None)
    q = table.queue("q")
    assert (q.stats().dead, q.stats().pending, q.stats().totals.dead) == (1, 0, 1)
    assert q.claim_one("w") is None


def test_retry_on_the_last_attempt_after_reclaims_dies(table: JobTable, clock: ManualClock) -> None:
    # Contract: HND-6, CLM-3.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=2))
    q.enqueue(1)
    assert q.claim_one("w") is not None
    clock.advance(10)
    h = q.claim_one("w")
    assert h is not None
    assert h.retry("late") is True
    job = snapshot(table, h.id)
    assert (job.state, job.last_error, job.attempts) == (JobState.DEAD, "late", 2)


def test_retry_keeps_last_error_when_none_or_empty(table: JobTable) -> None:
    # Contract: HND-4, HND-6.
    q = table.queue("q", QueueOpts(max_attempts=10))
    job_id = q.enqueue(1)
    for error, expected in [("e1", "e1"), (None, "e1"), ("", "e1"), ("e2", "e2"), (None, "e2")]:
        h = q.claim_one("w")
        assert h is not None
        assert h.retry(error, delay_s=0) is True
        assert snapshot(table, job_id).last_error == expected


def test_retry_with_no_error_ever_leaves_last_error_none(table: JobTable) -> None:
    # Contract: HND-6.
    h = claimed(table)
    assert h.retry(delay_s=0) is True
    assert snapshot(table, h.id).last_error is None


@pytest.mark.parametrize(
    "delay", [float("nan"), -1, -0.001, float("inf"), float("-inf"), True, "1"]
)
def test_retry_delay_guard_raises_and_changes_nothing(
    table: JobTable, rng: Any, delay: Any
) -> None:
    # Contract: HND-3.
    h = claimed(table, max_attempts=3)
    before = snapshot(table, h.id)
    state = rng.getstate()
    with pytest.raises(InvalidArgument) as info:
        h.retry("e", delay_s=delay)
    assert info.value.field == "delay_s"
    with pytest.raises(InvalidArgument):
        table.retry(h.id, h.lease, error="e", delay_s=delay)
    assert snapshot(table, h.id) == before
    assert rng.getstate() == state
    assert table.queue("q").stats().totals.retried == 0
    assert h.ack() is True  # the lease is still good


def test_retry_delay_guard_raises_even_when_lease_is_invalid(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: HND-3.
    h = claimed(table, visibility_timeout_s=10)
    clock.advance(10)
    with pytest.raises(InvalidArgument):
        h.retry(delay_s=-1)
    with pytest.raises(InvalidArgument):
        table.retry("no-such-job", "lease", delay_s=float("nan"))


def test_retry_at_max_attempts_still_guards_delay(table: JobTable) -> None:
    # Contract: HND-3.
    h = claimed(table, max_attempts=1)
    with pytest.raises(InvalidArgument):
        h.retry("e", delay_s=float("inf"))
    assert snapshot(table, h.id).state == JobState.PROCESSING


# --- fail --------------------------------------------------------------------------------


@pytest.mark.parametrize(("error", "expected"), [("bad", "bad"), (None, "failed"), ("", "failed")])
def test_fail_dies_at_once(
    table: JobTable, clock: ManualClock, error: str | None, expected: str
) -> None:
    # Contract: HND-7, HND-4.
    h = claimed(table, max_attempts=5)
    clock.set(START + 1.5)
    assert h.fail(error) is True
    job = snapshot(table, h.id)
    assert job.state == JobState.DEAD
    assert job.last_error == expected
    assert job.died_at == START + 1.5
    assert job.attempts == 1
    assert (job.worker_id, job.deadline) == (None, None)
    q = table.queue("q")
    assert (q.stats().dead, q.stats().processing, q.stats().totals.dead) == (1, 0, 1)


def test_fail_overwrites_an_earlier_error(table: JobTable) -> None:
    # Contract: HND-7.
    q = table.queue("q")
    q.enqueue(1)
    h = q.claim_one("w")
    assert h is not None
    h.retry("first", delay_s=0)
    h = q.claim_one("w")
    assert h is not None
    assert h.fail() is True
    assert snapshot(table, h.id).last_error == "failed"


# --- ack_batch ---------------------------------------------------------------------------


def test_ack_batch_counts_only_valid_entries(table: JobTable, clock: ManualClock) -> None:
    # Contract: HND-10.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10))
    other = table.queue("other")
    a, b, c, d = (q.enqueue(x) for x in "abcd")
    q.enqueue("short", visibility_timeout_s=5)
    hs = {h.job.payload: h for h in q.claim_batch("w", 5)}
    foreign = other.enqueue("f")
    hf = other.claim_one("w")
    assert hf is not None
    clock.set(START + 5)  # "short" lapses exactly now
    entries = [
        (a, hs["a"].lease),
        (a, hs["a"].lease),  # a duplicate of one entry lands once
        (b, hs["c"].lease),  # foreign lease
        (hs["short"].id, hs["short"].lease),  # lapsed
        ("no-such-job", hs["d"].lease),
        (foreign, hf.lease),  # another queue's job
        (d, hs["d"].lease),
    ]
    assert q.ack_batch(entries) == 2
    assert q.get_job(a) is None
    assert q.get_job(d) is None
    assert q.get_job(b).state == JobState.PROCESSING  # type: ignore[union-attr]
    assert q.get_job(c).state == JobState.PROCESSING  # type: ignore[union-attr]
    assert q.get_job(hs["short"].id).state == JobState.PROCESSING  # type: ignore[union-attr]
    assert other.get_job(foreign).state == JobState.PROCESSING  # type: ignore[union-attr]
    assert q.stats().totals.completed == 2
    assert q.ack_batch([]) == 0
    assert q.ack_batch([(b, hs["b"].lease), (c, hs["c"].lease)]) == 2


# --- lapse -------------------------------------------------------------------------------


def test_lapse_makes_the_job_reclaimable_at_once(table: JobTable, clock: ManualClock) -> None:
    # Contract: HND-11.
    h = claimed(table, visibility_timeout_s=10, max_attempts=3)
    clock.set(START + 3)
    assert table.lapse(h.id, h.lease) is True
    job = snapshot(table, h.id)
    assert (job.state, job.deadline, job.attempts) == (JobState.PROCESSING, START + 3, 1)
    assert h.ack() is False
    assert h.heartbeat() is False
    assert table.lapse(h.id, h.lease) is False
    h2 = table.queue("q").claim_one("w2")
    assert h2 is not None
    assert (h2.id, h2.job.attempts, h2.job.deadline) == (h.id, 2, START + 13)


def test_lapse_of_last_attempt_dies_at_next_claim(table: JobTable, clock: ManualClock) -> None:
    # Contract: HND-11, CLM-3.
    h = claimed(table, visibility_timeout_s=10, max_attempts=1)
    clock.set(START + 3)
    assert table.lapse(h.id, h.lease) is True
    assert table.queue("q").claim_one("w2") is None
    job = snapshot(table, h.id)
    assert (job.state, job.last_error, job.died_at) == (
        JobState.DEAD,
        "max attempts exceeded",
        START + 3,
    )


def test_lapse_of_lapsed_lease_is_refused(table: JobTable, clock: ManualClock) -> None:
    # Contract: HND-11, HND-1.
    h = claimed(table, visibility_timeout_s=10)
    clock.set(START + 10)
    assert table.lapse(h.id, h.lease) is False
    assert snapshot(table, h.id).deadline == START + 10


# --- table-level ops by id alone ---------------------------------------------------------


def test_table_ops_by_id_match_the_handle(table: JobTable) -> None:
    # Contract: HND-5 to HND-8, OPS-1.
    q = table.queue("q", QueueOpts(max_attempts=5))
    ids = [q.enqueue(i) for i in range(3)]
    h0, h1, h2 = q.claim_batch("w", 3)
    assert table.ack(h0.id, h0.lease) is True
    assert table.retry(h1.id, h1.lease, error="e", delay_s=0) is True
    assert table.fail(h2.id, h2.lease, error="f") is True
    assert table.get_job(ids[0]) is None
    assert snapshot(table, ids[1]).state == JobState.PENDING
    assert snapshot(table, ids[1]).last_error == "e"
    assert snapshot(table, ids[2]).last_error == "f"


def test_table_ack_many_answers_each_entry_in_order(table: JobTable, clock: ManualClock) -> None:
    # Contract: HND-10.
    q = table.queue("q", QueueOpts(visibility_timeout_s=10))
    other = table.queue("other")
    for x in "ab":
        q.enqueue(x)
    q.enqueue("short", visibility_timeout_s=5)
    hs = {h.job.payload: h for h in q.claim_batch("w", 3)}
    other.enqueue("f")
    hf = other.claim_one("w")
    assert hf is not None
    clock.set(START + 5)  # "short" lapses exactly now: the batch is judged at this instant
    a, b, short = hs["a"], hs["b"], hs["short"]
    landed = table.ack_many(
        [
            (a.id, a.lease),
            (a.id, a.lease),  # the same entry again: already gone
            (b.id, a.lease),  # another job's lease
            (short.id, short.lease),  # lapsed
            ("no-such-job", b.lease),
            (hf.id, hf.lease),  # another queue's job: the table acks it
            (b.id, b.lease),
        ]
    )
    assert landed == [True, False, False, False, False, True, True]
    assert table.get_job(a.id) is None and table.get_job(b.id) is None
    assert table.get_job(hf.id) is None
    assert table.get_job(short.id).state == JobState.PROCESSING  # type: ignore[union-attr]
    assert q.stats().totals.completed == 2
    assert table.ack_many([]) == []


def test_take_changes_sends_a_stored_row_only_its_changing_fields(clock: ManualClock) -> None:
    table = JobTable(clock=clock, rng=random.Random(1), id_prefix="t")
    table.start_journal()
    q = table.queue("q")
    gone = q.enqueue("short-lived")
    kept = q.enqueue({"big": "x" * 100})
    h = q.claim_one("w")
    assert h is not None and h.id == gone and h.ack()
    first = table.take_changes()
    # New rows come whole; one enqueued and acked in the same batch does not come at all.
    assert [row[ROW_FIELDS.index("seq")] for row in first.upserts] == [2]
    assert first.deleted == [] and first.updates == []
    h = q.claim_one("w")
    assert h is not None and h.id == kept
    second = table.take_changes()
    assert second.upserts == [] and second.deleted == [] and second.updates == []
    # Claimed and nothing else: the claim's fields only, and no queue (no total moved).
    [claim] = second.claims
    assert dict(zip(CLAIM_FIELDS, claim, strict=True)) == {
        "state": "processing",
        "attempts": 1,
        "worker_id": "w",
        "deadline": h.deadline,
        "lease": h.lease,
        "seq": 2,
    }
    assert second.queues == []
    # Retried and claimed again since the last take: more than a claim's fields changed
    # (the error, the ready time), so the row comes as a whole update.
    assert h.retry("boom", delay_s=0)
    h = q.claim_one("w")
    assert h is not None and h.id == kept
    third = table.take_changes()
    assert third.claims == []
    [update] = third.updates
    assert dict(zip(UPDATE_FIELDS, update, strict=True)) == {
        "state": "processing",
        "attempts": 2,
        "ready_at": clock.now,
        "worker_id": "w",
        "deadline": h.deadline,
        "lease": h.lease,
        "last_error": "boom",
        "died_at": None,
        "result": None,
        "completed_at": None,
        "seq": 2,
    }
    assert h.ack()
    assert table.take_changes().deleted == [2]


def test_a_long_error_is_kept_cut_to_its_limit(table: JobTable) -> None:
    # Contract: LIM-3.
    # A traceback of any length is kept, not refused; only its first 4,096 characters.
    h = claimed(table)
    assert h.fail("x" * 100_000) is True
    error = snapshot(table, h.id).last_error
    assert error is not None and len(error) == 4096 and error.endswith("...")


def test_an_error_with_a_lone_surrogate_is_refused_and_nothing_changes(table: JobTable) -> None:
    # Contract: LIM-5, HND-3.
    h = claimed(table)
    with pytest.raises(InvalidArgument) as info:
        h.retry("bad \udc80 text")
    assert info.value.field == "error"
    assert snapshot(table, h.id).state == JobState.PROCESSING
