"""``docs/contract.md``, "Flow control" (FLW-1 to FLW-9), at the engine, on the manual
clock: limits and their checks, slots and what frees them, rate buckets to the exact
instant, partition keys' turns, back-offs, pause, stats, expiry and cancel of held-back
jobs, and a table restored from what a store keeps.

Most tests here build an in-memory table of their own: buckets and back-offs are not
stored (FLW-9), so the ``table`` fixture's SQLite run, which compares a rebuilt table's
stats with the live one's, applies only to the tests of slots held, which are.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

import pytest

from conveyor.broker.engine import (
    InvalidArgument,
    JobHandle,
    JobState,
    JobTable,
    Limits,
    Queue,
    QueueOpts,
)
from tests.stored_rows import Stored

if TYPE_CHECKING:
    from conftest import ManualClock

START = 1000.0  # where the conftest's ManualClock starts


@pytest.fixture
def mem(clock: ManualClock) -> JobTable:
    """An in-memory table on the manual clock (for buckets and back-offs, not stored)."""
    return JobTable(clock=clock, rng=random.Random(1), id_prefix="t")


def limited(table: JobTable, limits: Limits, name: str = "q", **opts: Any) -> Queue:
    q = table.queue(name, QueueOpts(**opts) if opts else None)
    q.set_limits(limits)
    return q


def ids(handles: list[JobHandle]) -> list[str]:
    return [h.id for h in handles]


def claim_ids(q: Queue, n: int = 100) -> list[str]:
    return ids(q.claim_batch("w", n))


def one(q: Queue) -> JobHandle:
    h = q.claim_one("w")
    assert h is not None
    return h


def keys_of(handles: list[JobHandle]) -> list[str]:
    """Each handle's partition key, ``"-"`` for none."""
    return [h.partition or "-" for h in handles]


# -- FLW-1: limits and their checks ---------------------------------------------------------


def test_a_queue_has_no_limits_until_set(mem: JobTable) -> None:
    # Contract: FLW-1, FLW-8.
    q = mem.queue("q")
    assert q.limits == Limits()
    assert q.stats().limits == Limits()
    for i in range(50):
        q.enqueue(i, partition="a")
    assert len(q.claim_batch("w", 100)) == 50


BAD_LIMITS = [
    ("concurrency", {"concurrency": 0}),
    ("concurrency", {"concurrency": -1}),
    ("concurrency", {"concurrency": 2**31}),
    ("concurrency", {"concurrency": True}),
    ("concurrency", {"concurrency": 1.0}),
    ("concurrency", {"concurrency": "2"}),
    ("rate", {"rate": 0}),
    ("rate", {"rate": 2**31}),
    ("per_s", {"rate": 1, "per_s": 0}),
    ("per_s", {"rate": 1, "per_s": -1.0}),
    ("per_s", {"rate": 1, "per_s": math.inf}),
    ("per_s", {"rate": 1, "per_s": math.nan}),
    ("per_s", {"per_s": "1"}),
    ("burst", {"rate": 1, "burst": 0}),
    ("burst", {"burst": 3}),  # a burst needs its rate
    ("partition_concurrency", {"partition_concurrency": 0}),
    ("partition_concurrency", {"partition_concurrency": 2**31}),
    ("partition_rate", {"partition_rate": -5}),
    ("partition_per_s", {"partition_rate": 1, "partition_per_s": 0.0}),
    ("partition_per_s", {"partition_per_s": math.inf}),
    ("partition_burst", {"partition_rate": 2, "partition_burst": 2**31}),
    ("partition_burst", {"partition_burst": 2}),  # needs partition_rate
    ("partition_burst", {"rate": 2, "partition_burst": 2}),  # the queue's rate is not its
]


@pytest.mark.parametrize(("field", "values"), BAD_LIMITS)
def test_bad_limits_are_refused_naming_the_field_and_nothing_changes(
    mem: JobTable, clock: ManualClock, field: str, values: dict[str, Any]
) -> None:
    # Contract: FLW-1.
    good = Limits(concurrency=5, rate=1, per_s=10.0, partition_concurrency=1)
    q = limited(mem, good)
    q.enqueue(1, partition="a")
    q.enqueue(2, partition="a")
    q.enqueue(3, partition="b")
    assert len(q.claim_batch("w", 1)) == 1  # the queue's bucket is now empty for 10 s
    with pytest.raises(InvalidArgument) as exc:
        q.set_limits(Limits(**values))
    assert exc.value.field == field
    assert q.limits == good
    # The bucket was not started afresh either: still nothing until 10 s on.
    assert q.claim_batch("w", 5) == []
    clock.advance(10)
    assert len(q.claim_batch("w", 5)) == 1


def test_limits_must_be_a_limits(mem: JobTable) -> None:
    # Contract: FLW-1.
    q = mem.queue("q")
    with pytest.raises(InvalidArgument) as exc:
        q.set_limits({"concurrency": 1})  # type: ignore[arg-type]
    assert exc.value.field == "limits"
    assert q.limits == Limits()


def test_the_largest_counts_are_accepted(mem: JobTable) -> None:
    # Contract: FLW-1.
    top = 2**31 - 1
    limits = Limits(
        concurrency=top,
        rate=top,
        per_s=1e-9,
        burst=top,
        partition_concurrency=top,
        partition_rate=top,
        partition_per_s=1e9,
        partition_burst=top,
    )
    q = limited(mem, limits)
    assert q.limits == limits
    q.enqueue(1, partition="a")
    assert len(q.claim_batch("w", 5)) == 1


def test_set_limits_replaces_every_limit_at_once(mem: JobTable) -> None:
    # Contract: FLW-1.
    q = limited(mem, Limits(concurrency=1, partition_concurrency=1))
    for i in range(4):
        q.enqueue(i, partition="a")
    assert len(claim_ids(q)) == 1
    q.set_limits(Limits(rate=100))  # concurrency and partition_concurrency gone with it
    assert q.limits == Limits(rate=100)
    assert len(claim_ids(q)) == 1  # the fresh bucket: a burst of 1
    q.set_limits(Limits())
    assert len(claim_ids(q)) == 2


def test_limits_hold_from_the_next_claim_on(mem: JobTable) -> None:
    # Contract: FLW-1, FLW-2.
    q = mem.queue("q")
    for i in range(5):
        q.enqueue(i)
    assert len(q.claim_batch("w", 2)) == 2
    q.set_limits(Limits(concurrency=3))
    assert len(claim_ids(q)) == 1
    q.set_limits(Limits(concurrency=4))  # raising it lets the next claim have one more
    assert len(claim_ids(q)) == 1
    assert claim_ids(q) == []


# -- FLW-2: slots --------------------------------------------------------------------------


def release_by(op: str, table: JobTable, clock: ManualClock, h: JobHandle) -> None:
    if op == "ack":
        assert h.ack() is True
    elif op == "ack via table":
        assert table.ack(h.id, h.lease) is True
    elif op == "retry":
        assert h.retry(delay_s=0.0) is True
    elif op == "retry to death":
        assert table.retry(h.id, h.lease, "used up") is True
    elif op == "fail":
        assert table.fail(h.id, h.lease, "boom") is True
    elif op == "cancel":
        assert table.cancel(h.id) is True
    elif op == "lapse":
        assert table.lapse(h.id, h.lease) is True
    elif op == "deadline passes":
        clock.advance(30)
    elif op == "expires":
        clock.advance(20)
        assert table.sweep_expired().expired == 1
    else:
        raise AssertionError(op)


RELEASES = [
    "ack",
    "ack via table",
    "retry",
    "retry to death",
    "fail",
    "cancel",
    "lapse",
    "deadline passes",
    "expires",
]


@pytest.mark.parametrize("op", RELEASES)
def test_a_queue_slot_frees_when_the_lease_ends(
    table: JobTable, clock: ManualClock, op: str
) -> None:
    # Contract: FLW-2, ENQ-6.
    q = limited(table, Limits(concurrency=1), visibility_timeout_s=30, max_attempts=1)
    first = q.enqueue("first", expires_s=20 if op == "expires" else None)
    second = q.enqueue("second", priority=-1)  # after first, whatever first's fate
    h = one(q)
    assert h.id == first
    assert claim_ids(q) == []
    assert h.heartbeat() is True  # a heartbeat keeps the slot
    assert claim_ids(q) == []
    table.take_freed()
    release_by(op, table, clock, h)
    if op == "deadline passes":
        table.next_event_at()  # a lapse is noticed when the table next looks
    assert table.take_freed() == ["q"]
    assert claim_ids(q) == [second]
    assert claim_ids(q) == []
    assert q.stats().processing == 1


@pytest.mark.parametrize("op", RELEASES)
def test_a_partition_slot_frees_when_the_lease_ends(
    table: JobTable, clock: ManualClock, op: str
) -> None:
    # Contract: FLW-2, FLW-3.
    q = limited(table, Limits(partition_concurrency=1), visibility_timeout_s=30, max_attempts=1)
    first = q.enqueue("a1", partition="a", expires_s=20 if op == "expires" else None)
    second = q.enqueue("a2", partition="a", priority=-1)
    other = q.enqueue("b1", partition="b")
    h = one(q)
    assert h.id == first
    assert claim_ids(q) == [other]  # b has its own slot; a's is taken
    assert claim_ids(q) == []
    release_by(op, table, clock, h)
    # (When the deadline passes, b's lease lapses too: its job comes back after a2,
    # being ready only from its deadline.)
    assert claim_ids(q)[:1] == [second]
    assert claim_ids(q) == []


def test_back_off_frees_its_slot(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-2, FLW-6.
    q = limited(mem, Limits(concurrency=1))
    first = q.enqueue("first", partition="a")
    second = q.enqueue("second", partition="b")
    h = one(q)
    assert h.id == first
    mem.take_freed()
    assert mem.back_off(h.id, h.lease, 5.0) is True  # backs off key a
    assert mem.take_freed() == ["q"]
    assert claim_ids(q) == [second]


def test_a_stale_lease_frees_nothing(table: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-2, HND-1.
    q = limited(table, Limits(concurrency=1))
    q.enqueue(1)
    q.enqueue(2)
    h = one(q)
    table.take_freed()  # (the limits' change)
    assert table.ack(h.id, "tL999") is False
    assert table.retry(h.id, "tL999") is False
    assert table.fail(h.id, "tL999") is False
    assert table.back_off(h.id, "tL999", 1.0) is False
    assert table.take_freed() == []
    assert claim_ids(q) == []


def test_a_reclaim_takes_a_slot_again(table: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-2, CLM-3.
    q = limited(table, Limits(concurrency=1), visibility_timeout_s=10)
    job = q.enqueue("only")
    other = q.enqueue("other", priority=-1)
    h = one(q)
    clock.advance(10)  # lapsed: its slot is free, and it is claimable again, first
    again = one(q)
    assert again.id == job and again.lease != h.lease and again.attempt == 2
    assert claim_ids(q) == []  # the reclaim holds the one slot
    assert again.ack() is True
    assert claim_ids(q) == [other]


def test_a_limit_lowered_below_held_ends_no_lease(table: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-2.
    q = limited(table, Limits(concurrency=3), visibility_timeout_s=60)
    for i in range(6):
        q.enqueue(i)
    held = q.claim_batch("w", 10)
    assert len(held) == 3
    q.set_limits(Limits(concurrency=1))
    assert all(h.heartbeat() for h in held)  # every lease still valid
    assert claim_ids(q) == []
    assert held[0].ack() is True  # 2 held: still not below 1
    assert claim_ids(q) == []
    assert held[1].ack() is True  # 1 held
    assert claim_ids(q) == []
    assert held[2].ack() is True  # 0 held
    assert len(claim_ids(q)) == 1
    assert claim_ids(q) == []


def test_a_partition_limit_lowered_below_held(table: JobTable) -> None:
    # Contract: FLW-2.
    q = limited(table, Limits(partition_concurrency=2))
    for i in range(4):
        q.enqueue(i, partition="a")
    b = q.enqueue("b", partition="b")
    held = [h for h in q.claim_batch("w", 10) if h.partition == "a"]
    assert len(held) == 2
    q.set_limits(Limits(partition_concurrency=1))
    assert claim_ids(q) == []
    assert held[0].ack() is True
    assert claim_ids(q) == []
    assert held[1].ack() is True
    assert len(claim_ids(q)) == 1
    assert b not in claim_ids(q)


def test_per_partition_concurrency(table: JobTable) -> None:
    # Contract: FLW-2, FLW-3.
    q = limited(table, Limits(partition_concurrency=2))
    for key in ("a", "b", "c"):
        for i in range(4):
            q.enqueue(f"{key}{i}", partition=key)
    plain = [q.enqueue(f"plain{i}") for i in range(5)]
    handles = q.claim_batch("w", 100)
    keys = keys_of(handles)
    assert keys.count("a") == keys.count("b") == keys.count("c") == 2
    assert keys.count("-") == 5  # jobs of no key: only the queue's limits hold them
    assert set(plain) <= set(ids(handles))
    assert claim_ids(q) == []


def test_queue_and_partition_concurrency_together(table: JobTable) -> None:
    # Contract: FLW-2.
    q = limited(table, Limits(concurrency=3, partition_concurrency=1))
    for key in ("a", "b", "c", "d"):
        for i in range(2):
            q.enqueue(i, partition=key)
    handles = q.claim_batch("w", 100)
    assert sorted(keys_of(handles)) == ["a", "b", "c"]  # the queue's 3, one per key
    assert handles[0].ack() is True
    again = q.claim_batch("w", 100)
    assert keys_of(again) == ["d"]  # a's second would be allowed too; d's turn first


def test_empty_partition_means_none(table: JobTable) -> None:
    # Contract: FLW-3.
    q = limited(table, Limits(partition_concurrency=1))
    a = q.enqueue(1, partition="")
    b = q.enqueue(2, partition="")
    job = q.get_job(a)
    assert job is not None and job.partition is None
    assert claim_ids(q) == [a, b]  # held to the queue's limits only


def test_partition_key_length(table: JobTable) -> None:
    # Contract: FLW-3.
    q = table.queue("q")
    longest = "k" * 1024
    job_id = q.enqueue(1, partition=longest)
    job = q.get_job(job_id)
    assert job is not None and job.partition == longest
    with pytest.raises(InvalidArgument) as exc:
        q.enqueue(2, partition="k" * 1025)
    assert exc.value.field == "partition"
    with pytest.raises(InvalidArgument) as exc:
        q.enqueue(3, partition=7)  # type: ignore[arg-type]
    assert exc.value.field == "partition"
    assert q.stats().ready == 1


# -- FLW-4: rate buckets -------------------------------------------------------------------


def test_rate_with_burst_exact_timings(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-4. T = 0.5 s; a burst of 3 at once, then one every 0.5 s.
    q = limited(mem, Limits(rate=2, per_s=1.0, burst=3))
    for i in range(20):
        q.enqueue(i)
    assert len(q.claim_batch("w", 10)) == 3
    assert claim_ids(q) == []
    assert mem.next_event_at() == START + 0.5
    clock.set(START + 0.499)
    assert claim_ids(q) == []
    clock.set(START + 0.5)
    assert len(claim_ids(q)) == 1
    assert claim_ids(q) == []
    assert mem.next_event_at() == START + 1.0
    clock.set(START + 1.0)
    assert len(claim_ids(q)) == 1
    # Idle for long: the bucket fills to its burst, not beyond.
    clock.set(START + 100.0)
    assert len(claim_ids(q)) == 3
    assert claim_ids(q) == []
    clock.set(START + 100.5)
    assert len(claim_ids(q)) == 1


def test_rate_without_burst_spaces_claims_evenly(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-4 (burst 1 when not set).
    q = limited(mem, Limits(rate=1, per_s=2.0))
    for i in range(5):
        q.enqueue(i)
    got = []
    for step in range(9):  # 0, 1, ..., 8 s: claims at 0, 2, 4, 6, 8
        clock.set(START + step)
        got.append(len(claim_ids(q)))
    assert got == [1, 0, 1, 0, 1, 0, 1, 0, 1]


def test_a_partial_refill_lets_through_what_it_earned(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-4: after the burst, 1.2 s earns 2 claims at T = 0.5 s (not 3).
    q = limited(mem, Limits(rate=2, burst=3))
    for i in range(20):
        q.enqueue(i)
    assert len(claim_ids(q)) == 3
    clock.set(START + 1.2)
    assert len(claim_ids(q)) == 2
    clock.set(START + 1.5)
    assert len(claim_ids(q)) == 1


def test_an_empty_claim_spends_no_token(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-4: only a claim that hands out a job counts.
    q = limited(mem, Limits(rate=1, per_s=10.0))
    assert claim_ids(q) == []
    q.enqueue("a", run_at=START + 1)  # not ready yet
    assert claim_ids(q) == []
    clock.set(START + 1)
    assert len(claim_ids(q)) == 1


def test_a_claim_that_meets_only_dead_rows_spends_no_token(
    mem: JobTable, clock: ManualClock
) -> None:
    # Contract: FLW-4, CLM-4: an expired row dies in the claim, handed out to nobody.
    q = limited(mem, Limits(rate=1, per_s=10.0, partition_rate=1, partition_per_s=10.0))
    doomed = q.enqueue("doomed", expires_s=1, partition="a")
    clock.advance(1)
    assert claim_ids(q) == []
    job = q.get_job(doomed)
    assert job is not None and job.state == JobState.DEAD
    live = q.enqueue("live", partition="a")
    assert claim_ids(q) == [live]


def test_per_partition_rate(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-4 per key; no key: the queue's limits only.
    q = limited(mem, Limits(partition_rate=1, partition_per_s=10.0, partition_burst=2))
    for key in ("a", "b"):
        for i in range(5):
            q.enqueue(i, partition=key)
    for i in range(3):
        q.enqueue(i)
    first = q.claim_batch("w", 100)
    assert sorted(keys_of(first)) == ["-"] * 3 + ["a", "a", "b", "b"]
    assert claim_ids(q) == []
    assert mem.next_event_at() == START + 10.0
    clock.set(START + 9.999)
    assert claim_ids(q) == []
    clock.set(START + 10.0)
    assert sorted(keys_of(q.claim_batch("w", 100))) == ["a", "b"]
    clock.set(START + 20.0)
    assert sorted(keys_of(q.claim_batch("w", 100))) == ["a", "b"]


def test_a_key_bucket_outlives_its_jobs(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-4: a key whose jobs ran out, then gets a new one, is still at its rate.
    q = limited(mem, Limits(partition_rate=1, partition_per_s=10.0))
    q.enqueue(1, partition="a")
    one(q).ack()
    clock.advance(3)
    second = q.enqueue(2, partition="a")
    assert claim_ids(q) == []
    clock.set(START + 10)
    assert claim_ids(q) == [second]


def test_queue_rate_and_partition_rate_together(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-4: a claim must pass both buckets; a key's bucket is spent only
    # by its own claims.
    q = limited(mem, Limits(rate=3, burst=3, partition_rate=1, partition_per_s=1.0))
    for key in ("a", "b"):
        for i in range(5):
            q.enqueue(i, partition=key)
    assert sorted(keys_of(q.claim_batch("w", 100))) == ["a", "b"]
    clock.set(START + 1)
    assert sorted(keys_of(q.claim_batch("w", 100))) == ["a", "b"]


# -- FLW-5: order --------------------------------------------------------------------------


def test_a_late_key_is_not_starved_by_a_deep_one(mem: JobTable) -> None:
    # Contract: FLW-5.
    q = mem.queue("q")
    q.set_limits(Limits(concurrency=10_000))
    for i in range(900):
        q.enqueue(i, partition="A")
    b = q.enqueue("b", partition="B")
    first = claim_ids(q, 2)
    assert b in first


def test_keys_take_turns_and_no_key_is_one_more(mem: JobTable) -> None:
    # Contract: FLW-5.
    q = limited(mem, Limits(concurrency=100))
    for i in range(3):
        q.enqueue(i, partition="a")
        q.enqueue(i, partition="b")
        q.enqueue(i)
    handles = q.claim_batch("w", 100)
    keys = keys_of(handles)
    assert len(keys) == 9
    for start in range(0, 9, 3):  # each round gives each of the three one job
        assert sorted(keys[start : start + 3]) == ["-", "a", "b"]
    assert keys[3:6] == keys[0:3] == keys[6:9]  # and in the same order every round


def test_one_key_at_a_time_claims_still_alternate(mem: JobTable) -> None:
    # Contract: FLW-5: the key served longest ago goes first, claim by claim.
    q = limited(mem, Limits(partition_concurrency=100))
    for i in range(4):
        q.enqueue(i, partition="a")
    for i in range(4):
        q.enqueue(i, partition="b")
    keys = [one(q).partition for _ in range(8)]
    assert keys == ["a", "b"] * 4


def test_within_a_key_the_claim_order_holds(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-5, CLM-6.
    q = limited(mem, Limits(partition_concurrency=100))
    low = q.enqueue("low", partition="a", priority=-1)
    late = q.enqueue("late", partition="a", run_at=START + 5)
    clock.advance(1)
    early = q.enqueue("early", partition="a")
    high = q.enqueue("high", partition="a", priority=3)
    clock.set(START + 5)
    assert claim_ids(q) == [high, early, late, low]


def test_priority_comes_before_turns(mem: JobTable) -> None:
    # Contract: FLW-5.
    q = limited(mem, Limits(partition_concurrency=100))
    a0 = q.enqueue("a0", partition="a")
    b0 = q.enqueue("b0", partition="b")
    assert claim_ids(q, 1) == [a0]  # a served: b's turn is next
    a_high = q.enqueue("a-high", partition="a", priority=5)
    plain_high = q.enqueue("plain-high", priority=9)
    assert claim_ids(q) == [plain_high, a_high, b0]


def test_a_new_key_goes_last(mem: JobTable) -> None:
    # Contract: FLW-5.
    q = limited(mem, Limits(partition_concurrency=100))
    for i in range(3):
        q.enqueue(i, partition="a")
        q.enqueue(i, partition="b")
    assert [one(q).partition for _ in range(2)] == ["a", "b"]
    q.enqueue("c", partition="c")
    assert [one(q).partition for _ in range(3)] == ["a", "b", "c"]


def test_a_key_at_its_limit_is_skipped_and_keeps_its_place(mem: JobTable) -> None:
    # Contract: FLW-5.
    q = limited(mem, Limits(partition_concurrency=1))
    a = [q.enqueue(f"a{i}", partition="a") for i in range(3)]
    b = [q.enqueue(f"b{i}", partition="b") for i in range(3)]
    ha = one(q)
    assert ha.id == a[0]
    hb = one(q)
    assert hb.id == b[0]  # a at its limit: skipped, not waited for
    assert q.claim_one("w") is None
    assert ha.ack() is True
    assert claim_ids(q) == [a[1]]  # a's next, in its order
    assert hb.ack() is True
    assert claim_ids(q) == [b[1]]


def test_a_rate_limited_key_is_skipped_for_the_others(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-5, FLW-4.
    q = limited(mem, Limits(partition_rate=1, partition_per_s=10.0))
    for i in range(3):
        q.enqueue(i, partition="a", priority=5)  # a outranks b, but only while it may go
    for i in range(3):
        q.enqueue(i, partition="b")
    assert keys_of(q.claim_batch("w", 10)) == ["a", "b"]
    clock.advance(10)
    assert keys_of(q.claim_batch("w", 10)) == ["a", "b"]


def test_a_higher_priority_job_of_a_limited_key_blocks_no_one(mem: JobTable) -> None:
    # Contract: FLW-5: among the jobs the limits let through, priority first.
    q = limited(mem, Limits(partition_concurrency=1))
    h = q.enqueue("a0", partition="a", priority=9)
    a1 = q.enqueue("a1", partition="a", priority=9)
    low = q.enqueue("low", priority=-5)
    assert claim_ids(q) == [h, low]
    assert a1 not in claim_ids(q)


# -- FLW-6: back-offs ----------------------------------------------------------------------


def test_back_off_of_its_key(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-6.
    q = mem.queue("q", QueueOpts(max_attempts=1))
    a1 = q.enqueue("a1", partition="a")
    a2 = q.enqueue("a2", partition="a")
    b1 = q.enqueue("b1", partition="b")
    clock.advance(1)
    h = one(q)
    assert h.id == a1
    assert mem.back_off(h.id, h.lease, 5.0) is True
    job = q.get_job(a1)
    assert job is not None
    assert job.state == JobState.PENDING
    assert job.attempts == 0  # the claim did not count
    assert job.ready_at == START  # its ready time unchanged
    assert job.worker_id is None and job.deadline is None
    assert h.heartbeat() is False  # the lease ended
    assert claim_ids(q) == [b1]  # a is held; b is not
    assert mem.next_event_at() == START + 6.0
    clock.set(START + 5.999)
    assert claim_ids(q) == []
    clock.set(START + 6.0)
    got = q.claim_batch("w", 10)
    assert ids(got) == [a1, a2]  # back in its place, first of its key
    assert got[0].attempt == 1  # max_attempts 1: the back-off did not use it up


def test_back_off_of_the_whole_queue(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-6, FLW-8.
    q = mem.queue("q")
    q.enqueue("a", partition="a")
    q.enqueue("b", partition="b")
    q.enqueue("plain")
    h = one(q)
    assert mem.back_off(h.id, h.lease, 4.0, whole_queue=True) is True
    s = q.stats()
    assert s.backoff_until == START + 4.0
    assert s.limited == s.ready == 3
    assert claim_ids(q) == []
    assert mem.next_event_at() == START + 4.0
    clock.set(START + 4.0)
    assert q.stats().backoff_until is None
    assert q.stats().limited == 0
    assert len(claim_ids(q)) == 3


def test_back_off_of_a_job_with_no_key_holds_the_queue(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-6.
    q = mem.queue("q")
    q.enqueue("plain")
    q.enqueue("a", partition="a")
    h = one(q)
    assert h.partition is None
    assert mem.back_off(h.id, h.lease, 2.0) is True
    assert claim_ids(q) == []
    assert q.stats().backoff_until == START + 2.0
    clock.advance(2)
    assert len(claim_ids(q)) == 2


def test_back_off_of_another_key(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-6: the partition given, not the job's own.
    q = mem.queue("q")
    a = q.enqueue("a", partition="a")
    b = q.enqueue("b", partition="b")
    h = one(q)
    assert h.id == a
    assert mem.back_off(h.id, h.lease, 3.0, partition="b") is True
    assert claim_ids(q) == [a]  # a is free; b is held
    clock.advance(3)
    assert claim_ids(q) == [b]


def test_a_later_back_off_extends_never_shortens(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-6.
    q = mem.queue("q")
    for i in range(3):
        q.enqueue(i, partition="a")
    h = one(q)
    assert mem.back_off(h.id, h.lease, 10.0) is True
    q.back_off("a", 2.0)  # shorter: no change
    clock.set(START + 9.0)
    assert claim_ids(q) == []
    q.back_off("a", 5.0)  # to START + 14
    clock.set(START + 10.0)
    assert claim_ids(q) == []
    clock.set(START + 14.0)
    assert len(claim_ids(q)) == 3


def test_a_later_whole_queue_back_off_extends_never_shortens(
    mem: JobTable, clock: ManualClock
) -> None:
    # Contract: FLW-6.
    q = mem.queue("q")
    q.enqueue(1)
    q.back_off(None, 10.0)
    q.back_off(None, 1.0)
    assert q.stats().backoff_until == START + 10.0
    clock.set(START + 9.5)
    assert claim_ids(q) == []
    q.back_off(None, 1.0)
    assert q.stats().backoff_until == START + 10.5
    clock.set(START + 10.5)
    assert len(claim_ids(q)) == 1


def test_back_off_of_zero_holds_nothing(mem: JobTable) -> None:
    # Contract: FLW-6: until now + 0, which is now.
    q = mem.queue("q")
    a = q.enqueue("a", partition="a")
    h = one(q)
    assert mem.back_off(h.id, h.lease, 0.0) is True
    assert claim_ids(q) == [a]


def test_back_off_on_a_stale_lease_changes_nothing(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-6, HND-1.
    q = mem.queue("q", QueueOpts(visibility_timeout_s=5))
    a1 = q.enqueue("a1", partition="a")
    a2 = q.enqueue("a2", partition="a")
    h = one(q)
    clock.advance(5)  # lapsed
    assert mem.back_off(h.id, h.lease, 60.0) is False
    assert mem.back_off(h.id, h.lease, 60.0, whole_queue=True) is False
    assert mem.back_off("t999", "tL999", 60.0) is False
    assert q.stats().backoff_until is None
    # No back-off of key a came of it: a2, then a1's reclaim (ready at its deadline).
    assert claim_ids(q) == [a2, a1]


@pytest.mark.parametrize(
    ("field", "args"),
    [
        ("delay_s", {"delay_s": -1.0}),
        ("delay_s", {"delay_s": math.nan}),
        ("delay_s", {"delay_s": math.inf}),
        ("delay_s", {"delay_s": "1"}),
        ("partition", {"delay_s": 1.0, "partition": 5}),
        ("partition", {"delay_s": 1.0, "partition": "p" * 1025}),
        ("whole_queue", {"delay_s": 1.0, "whole_queue": 1}),
    ],
)
def test_back_off_refuses_a_bad_argument(mem: JobTable, field: str, args: dict[str, Any]) -> None:
    # Contract: FLW-6: refused on a valid lease and on none alike; nothing changed.
    q = mem.queue("q")
    q.enqueue(1, partition="a")
    q.enqueue(2, partition="a")
    h = one(q)
    for job_id, lease in ((h.id, h.lease), ("t999", "tL999")):
        with pytest.raises(InvalidArgument) as exc:
            mem.back_off(job_id, lease, **args)
        assert exc.value.field == field
    assert h.heartbeat() is True
    assert len(claim_ids(q)) == 1


# -- FLW-7: pause; what limits do not touch ------------------------------------------------


def test_pause_composes_with_limits(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-7, OPS-4.
    q = limited(mem, Limits(rate=1, per_s=10.0, burst=2, concurrency=5))
    for i in range(5):
        q.enqueue(i)
    q.pause()
    assert claim_ids(q) == []
    clock.advance(1)
    q.resume()
    assert len(claim_ids(q)) == 2  # the paused claims spent no token: the full burst
    q.pause()
    clock.advance(10)
    assert claim_ids(q) == []
    q.resume()
    assert len(claim_ids(q)) == 1


def test_a_held_back_job_expires_as_any_other(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-7, ENQ-6.
    q = limited(mem, Limits(partition_concurrency=1))
    first = q.enqueue("first", partition="a")
    doomed = q.enqueue("doomed", partition="a", expires_s=5)
    h = one(q)
    assert h.id == first
    assert q.stats().limited == 1
    clock.advance(5)
    assert mem.next_event_at() == START + 5  # the expiry is due: a sweep
    assert mem.sweep_expired().expired == 1
    job = q.get_job(doomed)
    assert job is not None and job.state == JobState.DEAD and job.last_error == "expired"
    s = q.stats()
    assert (s.ready, s.limited, s.partitions, s.dead) == (0, 0, 0, 1)
    assert h.ack() is True
    assert claim_ids(q) == []
    assert mem.next_event_at() is None
    assert q._flow.parts == {}  # nothing of key a is kept once it has nothing left


def test_a_cancelled_held_back_job_leaves_no_part(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-7, FLW-8, OPS-2.
    q = limited(mem, Limits(partition_concurrency=1))
    first = q.enqueue("first", partition="a")
    held_back = q.enqueue("held back", partition="a")
    h = one(q)
    assert h.id == first
    assert q.cancel(held_back) is True
    s = q.stats()
    assert (s.ready, s.limited, s.partitions) == (0, 0, 0)
    assert h.ack() is True
    assert claim_ids(q) == []
    assert q._flow.parts == {}
    # The key comes back as a new one, and is handed out as any other.
    again = q.enqueue("again", partition="a")
    assert claim_ids(q) == [again]


def test_a_cancelled_backed_off_key_leaves_no_part(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-6, FLW-8.
    q = mem.queue("q")
    job = q.enqueue("a", partition="a")
    h = one(q)
    assert mem.back_off(h.id, h.lease, 5.0) is True
    assert q.stats().limited == 1
    assert q.cancel(job) is True
    assert q.stats().limited == 0 and q.stats().partitions == 0
    clock.advance(5)
    assert mem.next_event_at() is None
    assert q._flow.parts == {}


def test_retry_under_limits_keeps_its_curve_and_order(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-7: limits do not touch retry; the retried job waits its delay only.
    q = limited(mem, Limits(concurrency=1, partition_concurrency=1))
    a = q.enqueue("a", partition="a")
    b = q.enqueue("b", partition="a")
    h = one(q)
    assert h.retry("x", delay_s=2.0) is True
    job = q.get_job(a)
    assert job is not None and job.ready_at == START + 2.0 and job.attempts == 1
    assert claim_ids(q) == [b]
    clock.advance(2)
    assert claim_ids(q) == []  # a is ready again, but b holds the one slot
    assert q.stats().limited == 1


def test_limits_do_not_touch_enqueue_or_death(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-7.
    q = limited(mem, Limits(concurrency=1), max_attempts=1, visibility_timeout_s=5)
    job_ids = [q.enqueue(i) for i in range(3)]
    assert q.stats().ready == 3
    h = one(q)
    clock.advance(5)
    assert mem.sweep_expired().exhausted == 1  # the lapsed, used-up job dies as always
    dead = q.get_job(h.id)
    assert dead is not None and dead.state == JobState.DEAD
    assert claim_ids(q) == [job_ids[1]]


# -- FLW-8: stats --------------------------------------------------------------------------


def test_stats_of_keys_at_their_limits(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-8.
    limits = Limits(partition_concurrency=1)
    q = limited(mem, limits)
    for i in range(3):
        q.enqueue(i, partition="a")
    for i in range(2):
        q.enqueue(i, partition="b")
    q.enqueue("plain")
    q.enqueue("later", partition="c", delay_s=10)  # scheduled: neither ready nor limited
    s = q.stats()
    assert (s.ready, s.scheduled, s.limited, s.partitions) == (6, 1, 0, 2)
    assert s.limits == limits and s.backoff_until is None
    got = q.claim_batch("w", 10)
    assert sorted(keys_of(got)) == ["-", "a", "b"]
    s = q.stats()
    assert (s.ready, s.limited, s.partitions) == (3, 3, 2)
    clock.advance(10)
    s = q.stats()
    assert (s.ready, s.scheduled, s.limited, s.partitions) == (4, 0, 3, 3)


def test_stats_when_the_queue_itself_is_held(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-8: at its concurrency or out of its rate, every ready job is limited.
    q = limited(mem, Limits(concurrency=1))
    for i in range(3):
        q.enqueue(i, partition="a" if i else None)
    h = one(q)
    assert q.stats().limited == q.stats().ready == 2
    assert h.ack() is True
    assert q.stats().limited == 0
    q.set_limits(Limits(rate=1, per_s=5.0))
    one(q)
    assert q.stats().limited == q.stats().ready == 1
    clock.advance(5)
    assert q.stats().limited == 0


def test_stats_of_a_rate_limited_key(mem: JobTable, clock: ManualClock) -> None:
    # Contract: FLW-8.
    q = limited(mem, Limits(partition_rate=1, partition_per_s=3.0))
    for i in range(3):
        q.enqueue(i, partition="a")
    one(q)
    assert q.stats().limited == 2
    clock.advance(3)
    assert q.stats().limited == 0


# -- FLW-9: restore ------------------------------------------------------------------------


def journaled(clock: ManualClock) -> JobTable:
    table = JobTable(clock=clock, rng=random.Random(1), id_prefix="t")
    table.start_journal()
    return table


def test_restore_keeps_limits_and_slots_held(clock: ManualClock) -> None:
    # Contract: FLW-9.
    table = journaled(clock)
    limits = Limits(concurrency=3, partition_concurrency=1, partition_rate=5, partition_burst=2)
    q = limited(table, limits, visibility_timeout_s=30)
    for key in ("a", "a", "b", "b", None):
        q.enqueue(key, partition=key)
    held = q.claim_batch("w", 10)
    assert sorted(keys_of(held)) == ["-", "a", "b"]
    stored = Stored()
    stored.write(table.take_changes())
    restored = stored.restore(clock)
    rq = restored.queue("q")
    assert rq.limits == limits
    assert rq.stats() == q.stats()
    assert rq.claim_batch("w", 10) == []  # 3 slots held, from the restored leases
    a = next(h for h in held if h.partition == "a")
    assert restored.ack(a.id, a.lease) is True  # the lease the first table issued
    got = rq.claim_batch("w", 10)
    assert keys_of(got) == ["a"]  # a's slot and the queue's, freed; b's still held


def test_restore_frees_the_slots_of_leases_lapsed_meanwhile(clock: ManualClock) -> None:
    # Contract: FLW-9, FLW-2.
    table = journaled(clock)
    q = limited(table, Limits(concurrency=1, partition_concurrency=1), visibility_timeout_s=10)
    first = q.enqueue("a1", partition="a")
    second = q.enqueue("a2", partition="a")
    one(q)
    stored = Stored()
    stored.write(table.take_changes())
    clock.advance(10)  # down while the lease lapsed
    rq = stored.restore(clock).queue("q")
    h = one(rq)
    assert h.id == second  # a's slot is free: its next job in order (CLM-6)
    assert rq.claim_batch("w", 10) == []
    assert h.ack() is True
    again = one(rq)
    assert again.id == first and again.attempt == 2  # the reclaim


def test_restore_starts_buckets_and_back_offs_afresh(clock: ManualClock) -> None:
    # Contract: FLW-9: not stored.
    table = journaled(clock)
    q = limited(table, Limits(rate=1, per_s=60.0, partition_rate=1, partition_per_s=60.0))
    q.enqueue(1, partition="a")
    q.enqueue(2, partition="a")
    q.enqueue(3, partition="b")
    h = one(q)
    q.back_off("b", 60.0)
    assert q.claim_batch("w", 10) == []
    stored = Stored()
    stored.write(table.take_changes())
    assert h.ack() is True
    stored.write(table.take_changes())
    rq = stored.restore(clock).queue("q")
    assert rq.stats().backoff_until is None
    got = rq.claim_batch("w", 10)
    assert len(got) == 1  # the queue's bucket is full again: one claim
    assert rq.stats().limited == rq.stats().ready == 1


def test_restore_of_no_limits(clock: ManualClock) -> None:
    # Contract: FLW-9.
    table = journaled(clock)
    q = table.queue("q")
    q.set_limits(Limits(concurrency=1))
    q.set_limits(Limits())
    q.enqueue(1, partition="a")
    stored = Stored()
    stored.write(table.take_changes())
    assert stored.queues["q"][-1] is None
    assert stored.restore(clock).queue("q").limits == Limits()


# -- found by the model (tests/engine/test_flow_model.py) ----------------------------------


def test_next_event_tells_when_a_lapsed_job_of_a_key_may_be_reclaimed(
    mem: JobTable, clock: ManualClock
) -> None:
    # Contract: FLW-4, TIM-4: the queue's bucket holds the reclaim back; the dispatcher
    # must be told when it lets it through, or the job waits for some other event.
    q = limited(mem, Limits(rate=1, per_s=10.0), visibility_timeout_s=2)
    job = q.enqueue("a", partition="a")
    one(q)
    assert mem.next_event_at() == START + 2  # the lease lapses
    clock.set(START + 2)
    assert claim_ids(q) == []
    assert mem.next_event_at() == START + 10
    clock.set(START + 10)
    assert claim_ids(q) == [job]


@pytest.mark.parametrize("how", ["cancel", "expiry", "used up"])
def test_a_key_whose_last_job_goes_while_the_queue_is_held_is_dropped(
    mem: JobTable, clock: ManualClock, how: str
) -> None:
    # Contract: FLW-8, FLW-10: the key is not held, the queue is (at its concurrency),
    # so the key waits in the turns; its last job going must not leave it there.
    q = limited(mem, Limits(concurrency=1), visibility_timeout_s=10, max_attempts=1)
    blocker = one_of(q, q.enqueue("plain", priority=5))
    keyed = q.enqueue("a", partition="a", expires_s=3 if how == "expiry" else None)
    if how == "used up":  # claimed, lapsed: a reclaim waiting in its key, used up
        assert blocker.ack() is True
        assert claim_ids(q) == [keyed]
        q.enqueue("plain", priority=5)
        clock.advance(10)
        blocker = one(q)
    if how != "used up":
        assert q.stats().limited == 1  # held back by the queue's concurrency
    if how == "cancel":
        assert q.cancel(keyed) is True
    else:
        clock.advance(3 if how == "expiry" else 0)
        swept = mem.sweep_expired()
        assert (swept.expired, swept.exhausted) == ((1, 0) if how == "expiry" else (0, 1))
    assert q._flow.parts == {}
    s = q.stats()
    assert (s.ready, s.limited, s.partitions) == (0, 0, 0)


def one_of(q: Queue, job_id: str) -> JobHandle:
    h = one(q)
    assert h.id == job_id
    return h
