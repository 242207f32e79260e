"""``docs/contract.md``, "Progress" (PRG-1 to PRG-5) in the engine: progress stored under
a valid lease, the latest kept, what a watched job's steps are (a lapse and a back-off
too, which the engine alone sees), and that a store writes the latest value of each job
once per commit (the ``table`` fixture's SQLite kind rebuilds the table from its file at
every clock step and compares, progress included)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor.broker.engine import MAX_PROGRESS_BYTES, JobTable, PayloadTooLarge, Step

if TYPE_CHECKING:
    from conftest import ManualClock


def test_progress_lands_only_under_a_valid_lease_prg_1(table: JobTable, clock: ManualClock) -> None:
    q = table.queue("q")
    job_id = q.enqueue(None, visibility_timeout_s=10.0)
    assert table.progress_many([(job_id, "nope", b"1")]) == [False]  # pending: no lease
    h = q.claim_one("w")
    assert h is not None
    assert table.progress_many([(job_id, h.lease, b"0.5")]) == [True]
    clock.advance(10)  # the lease lapses at its deadline
    assert table.progress_many([(job_id, h.lease, b"0.9")]) == [False]
    job = table.get_job(job_id)
    assert job is not None and job.progress == 0.5


def test_progress_over_the_cap_is_too_large_naming_the_field_prg_3(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    job_id = q.enqueue(None)
    h = q.claim_one("w")
    assert h is not None
    (refused,) = table.progress_many([(job_id, h.lease, b"1" * (MAX_PROGRESS_BYTES + 1))])
    assert isinstance(refused, PayloadTooLarge) and refused.field == "progress"
    assert table.progress_many([(job_id, h.lease, b"1" * MAX_PROGRESS_BYTES)]) == [True]
    small = JobTable(clock=clock, id_prefix="s", max_payload_bytes=100)
    sq = small.queue("q")
    other = sq.enqueue(None)
    sh = sq.claim_one("w")
    assert sh is not None
    (refused,) = small.progress_many([(other, sh.lease, b"1" * 101)])
    assert isinstance(refused, PayloadTooLarge)  # the payload limit, when it is smaller


def test_a_watched_job_tells_its_lapse_and_back_off_but_not_a_last_lapse_prg_5(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    job_id = q.enqueue(None, visibility_timeout_s=5.0, max_attempts=2)
    assert table.observe(job_id) is not None
    h = q.claim_one("w")
    assert h is not None
    table.progress_many([(job_id, h.lease, b"0.2")])
    clock.advance(5)
    q.stats()  # (any look at the queue moves lapsed leases on)
    again = q.claim_one("w")
    assert again is not None
    assert table.back_off(job_id, again.lease, 0.0, None, False)
    third = q.claim_one("w")
    assert third is not None and third.attempt == 2
    clock.advance(5)  # the last attempt's lease lapses: the job dies, told as its end
    table.sweep_expired()
    assert table.take_steps() == [
        Step(job_id, "progress", 1, b"0.2"),
        Step(job_id, "retry", 1, None, "lapsed", None),
        Step(job_id, "retry", 2, None, "backed_off", None),  # (attempt 2, given back)
    ]
    (end,) = table.take_finished()
    assert (end.id, end.state) == (job_id, "dead")
    clock.advance(1)


def test_unobserved_jobs_make_no_steps_prg_5(table: JobTable, clock: ManualClock) -> None:
    q = table.queue("q")
    job_id = q.enqueue(None)
    table.observe(job_id)
    table.unobserve(job_id)
    h = q.claim_one("w")
    assert h is not None
    table.progress_many([(job_id, h.lease, b"1")])
    assert table.retry(job_id, h.lease, "x", 0.0)
    assert table.take_steps() == []


def test_a_commit_writes_the_latest_progress_of_each_job_once_prg_2(clock: ManualClock) -> None:
    table = JobTable(clock=clock, id_prefix="t")
    table.start_journal()
    q = table.queue("q")
    a, b = q.enqueue(1), q.enqueue(2)
    ha, hb = q.claim_batch("w", 2)
    table.take_changes()
    for i in range(10_000):
        table.progress_many([(a, ha.lease, str(i).encode()), (b, hb.lease, b"7")])
    changes = table.take_changes()
    assert sorted(changes.progress) == [(b"7", 2), (b"9999", 1)]
    assert changes.updates == [] and changes.upserts == []
    assert table.take_changes().progress == []
    # A job gone before the commit has no progress to write.
    table.progress_many([(a, ha.lease, b"1")])
    assert table.cancel(a)
    assert table.take_changes().progress == []
