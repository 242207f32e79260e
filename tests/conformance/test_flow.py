"""Flow control through the backend interface (docs/contract.md FLW-1 to FLW-9).

Every test runs on every backend (``rig``: across three brokers on one database too, so
that limits are seen to hold across brokers); the restart tests on the durable ones.
Time moves only through the stepped clock. A queue's limits are set before its jobs
come, so that a claim takes the flow-control path from the start.
"""

from __future__ import annotations

import asyncio

import pytest

from conveyor.broker.backend import BackOff, Claim, Enqueue, Report
from conveyor.broker.engine import InvalidArgument, JobState, Limits, QueueStats
from conveyor.broker.scheduler import SteppedScheduler

from .conftest import START, Heard, Rig

# A limit that holds nothing back in these tests: it only puts the queue under flow
# control (partition keys take turns, back-offs hold).
LOOSE = Limits(partition_concurrency=1_000_000)


async def limit(rig: Rig, limits: Limits, queue: str = "q") -> None:
    await rig.backend.set_limits(queue, limits)


async def put_many(rig: Rig, n: int, queue: str = "q", **opts: object) -> list[str]:
    """``n`` jobs in one enqueue call; their ids."""
    got = await rig.backend.enqueue([Enqueue(queue, i, **opts) for i in range(n)])  # type: ignore[arg-type]
    assert all(isinstance(job_id, str) for job_id in got), got
    return [str(job_id) for job_id in got]


async def stats(rig: Rig, queue: str = "q") -> QueueStats:
    return (await rig.backend.stats([queue]))[queue]


# -- FLW-1: limits, checked; set_limits replaces them all ---------------------------------


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (Limits(concurrency=0), "concurrency"),
        (Limits(concurrency=2**31), "concurrency"),
        (Limits(rate=0), "rate"),
        (Limits(burst=2), "burst"),
        (Limits(rate=1, per_s=0), "per_s"),
        (Limits(rate=1, per_s=-1.0), "per_s"),
        (Limits(rate=1, per_s=float("inf")), "per_s"),
        (Limits(rate=1, per_s=float("nan")), "per_s"),
        (Limits(rate=2, burst=0), "burst"),
        (Limits(partition_concurrency=-1), "partition_concurrency"),
        (Limits(partition_rate=True), "partition_rate"),  # type: ignore[arg-type]
        (Limits(partition_burst=3), "partition_burst"),
        (Limits(partition_rate=1, partition_per_s=0.0), "partition_per_s"),
    ],
)
async def test_a_bad_limit_is_refused_naming_its_field_and_changes_nothing_flw_1(
    rig: Rig, bad: Limits, field: str
) -> None:
    kept = Limits(concurrency=2)
    await limit(rig, kept)
    with pytest.raises(InvalidArgument) as refused:
        await rig.backend.set_limits("q", bad)
    assert refused.value.field == field
    assert (await stats(rig)).limits == kept


async def test_set_limits_replaces_every_limit_at_once_flw_1(rig: Rig) -> None:
    await limit(rig, Limits(concurrency=1, partition_concurrency=1))
    assert (await stats(rig)).limits == Limits(concurrency=1, partition_concurrency=1)
    await limit(rig, Limits(partition_concurrency=5))
    assert (await stats(rig)).limits == Limits(partition_concurrency=5)
    await put_many(rig, 3)
    assert len(await rig.take(n=3)) == 3  # the queue's own concurrency is gone
    await limit(rig, Limits())
    assert (await stats(rig)).limits == Limits()


async def test_set_limits_makes_the_queue(rig: Rig) -> None:
    await limit(rig, Limits(concurrency=3), queue="fresh")
    assert "fresh" in await rig.backend.queues()
    assert (await stats(rig, "fresh")).limits == Limits(concurrency=3)


# -- FLW-2: slots -----------------------------------------------------------------------


async def test_concurrency_caps_the_valid_leases_across_claims_flw_2(rig: Rig) -> None:
    await limit(rig, Limits(concurrency=2))
    await put_many(rig, 5)
    assert len(await rig.take(n=5, worker="a")) == 2
    assert await rig.take(n=5, worker="b") == []
    assert await rig.take(n=5, worker="c") == []
    assert (await stats(rig)).processing == 2


async def test_partition_concurrency_caps_each_key_on_its_own_flw_2(rig: Rig) -> None:
    await limit(rig, Limits(partition_concurrency=1))
    a1, _a2 = await put_many(rig, 2, partition="a")
    (b1,) = await put_many(rig, 1, partition="b")
    plain = await put_many(rig, 2)  # no key: held to the queue's limits only
    got = {c.id for c in await rig.take(n=10)}
    assert got == {a1, b1, *plain}
    assert await rig.take(n=10) == []


async def _free(rig: Rig, how: str, claimed_id: str, lease: str) -> None:
    backend = rig.backend
    if how == "ack":
        assert await backend.ack([(claimed_id, lease)]) == [True]
    elif how == "retry":
        assert await backend.report([Report(claimed_id, lease, retry=True, delay_s=0.0)]) == [True]
    elif how == "fail":
        assert await backend.report([Report(claimed_id, lease, retry=False)]) == [True]
    elif how == "cancel":
        assert await backend.cancel([claimed_id]) == [True]
    elif how == "lapse":
        assert await backend.lapse([(claimed_id, lease)]) == [True]
    elif how == "deadline":
        await rig.advance(10)  # the lease's deadline passes: it lapses
    elif how == "back_off":
        assert await backend.back_off([BackOff(claimed_id, lease, 0.0)]) == [True]
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["ack", "retry", "fail", "cancel", "lapse", "deadline", "back_off"])
@pytest.mark.parametrize("scope", ["queue", "partition"])
async def test_each_end_of_a_lease_frees_its_slot_flw_2(rig: Rig, how: str, scope: str) -> None:
    if scope == "queue":
        await limit(rig, Limits(concurrency=1))
        await put_many(rig, 3, visibility_timeout_s=10.0)
    else:
        await limit(rig, Limits(partition_concurrency=1))
        await put_many(rig, 3, visibility_timeout_s=10.0, partition="k")
    (first,) = await rig.take(n=3)
    assert await rig.take(n=3) == []
    rig.heard.forget()
    await _free(rig, how, first.id, first.lease)
    assert rig.heard.told_work("q")  # waiting workers are told to claim again
    assert len(await rig.take(n=3)) == 1  # one slot: one job
    assert await rig.take(n=3) == []


async def test_a_limit_lowered_below_the_held_ends_no_lease_flw_2(rig: Rig) -> None:
    await limit(rig, Limits(concurrency=3))
    await put_many(rig, 5)
    held = await rig.take(n=5)
    assert len(held) == 3
    await limit(rig, Limits(concurrency=1))
    assert await rig.backend.heartbeat([(c.id, c.lease) for c in held]) == [True] * 3
    assert await rig.take(n=5) == []
    assert await rig.backend.ack([(held[0].id, held[0].lease)]) == [True]
    assert await rig.take(n=5) == []  # 2 held, limit 1
    assert await rig.backend.ack([(held[1].id, held[1].lease)]) == [True]
    assert await rig.take(n=5) == []  # 1 held, limit 1
    assert await rig.backend.ack([(held[2].id, held[2].lease)]) == [True]
    assert len(await rig.take(n=5)) == 1


async def test_a_limit_raised_hands_out_more_and_tells_the_listener_flw_1(rig: Rig) -> None:
    await limit(rig, Limits(concurrency=1))
    await put_many(rig, 3)
    assert len(await rig.take(n=3)) == 1
    rig.heard.forget()
    await limit(rig, Limits(concurrency=3))
    assert rig.heard.told_work("q")
    assert len(await rig.take(n=3)) == 2


# -- FLW-3: partition keys ----------------------------------------------------------------


async def test_a_jobs_partition_is_kept_and_shown_flw_3(rig: Rig) -> None:
    keyed = await rig.put(partition="tenant-1")
    plain = await rig.put(partition="")  # the empty string: none
    unset = await rig.put()
    for job_id, want in ((keyed, "tenant-1"), (plain, None), (unset, None)):
        job = await rig.job(job_id)
        assert job is not None and job.partition == want
    listed = await rig.backend.list_jobs("q", "ready")
    assert listed is not None
    assert {job.id: job.partition for job in listed.jobs} == {
        keyed: "tenant-1",
        plain: None,
        unset: None,
    }
    await rig.take(n=3)
    job = await rig.job(keyed)
    assert job is not None and job.state is JobState.PROCESSING and job.partition == "tenant-1"


async def test_a_bad_partition_is_refused_naming_the_field_flw_3(rig: Rig) -> None:
    fine = "p" * 1024
    got = await rig.backend.enqueue(
        [
            Enqueue("q", 1, partition="p" * 1025),
            Enqueue("q", 2, partition=5),  # type: ignore[arg-type]
            Enqueue("q", 3, partition=fine),
        ]
    )
    assert isinstance(got[0], InvalidArgument) and got[0].field == "partition"
    assert isinstance(got[1], InvalidArgument) and got[1].field == "partition"
    assert isinstance(got[2], str)
    job = await rig.job(got[2])
    assert job is not None and job.partition == fine


# -- FLW-4: rates ---------------------------------------------------------------------------


async def test_a_rate_gives_its_burst_at_once_then_one_per_interval_flw_4(rig: Rig) -> None:
    await limit(rig, Limits(rate=2, per_s=1.0, burst=3))  # T = 0.5 s
    await put_many(rig, 20)
    assert len(await rig.take(n=20)) == 3
    assert await rig.take(n=20) == []
    await rig.advance(0.5)
    assert len(await rig.take(n=20)) == 1
    await rig.advance(0.25)
    assert await rig.take(n=20) == []
    await rig.advance(0.25)
    assert len(await rig.take(n=20)) == 1
    await rig.advance(10)  # the bucket fills again: a burst, no more
    assert len(await rig.take(n=20)) == 3
    assert await rig.take(n=20) == []


async def test_a_rate_without_burst_spaces_claims_evenly_flw_4(rig: Rig) -> None:
    await limit(rig, Limits(rate=1, per_s=2.0))
    await put_many(rig, 5)
    assert len(await rig.take(n=5)) == 1
    await rig.advance(1.0)
    assert await rig.take(n=5) == []
    await rig.advance(1.0)
    assert len(await rig.take(n=5)) == 1


async def test_a_bucket_that_lets_work_through_again_tells_the_listener_flw_4(
    rig: Rig,
) -> None:
    await limit(rig, Limits(rate=1, per_s=4.0))
    await put_many(rig, 2)
    assert len(await rig.take(n=2)) == 1
    assert await rig.take(n=2) == []
    rig.heard.forget()
    await rig.advance(4.0)
    assert rig.heard.told_work("q")
    assert len(await rig.take(n=2)) == 1


async def test_a_partition_rate_holds_each_key_on_its_own_flw_4(rig: Rig) -> None:
    await limit(rig, Limits(partition_rate=1, partition_per_s=10.0))
    a = await put_many(rig, 3, partition="a")
    b = await put_many(rig, 3, partition="b")
    first = {c.id for c in await rig.take(n=6)}
    assert first == {a[0], b[0]}
    await rig.advance(5)
    assert await rig.take(n=6) == []
    await rig.advance(5)
    assert {c.id for c in await rig.take(n=6)} == {a[1], b[1]}


async def test_the_queues_rate_and_a_keys_rate_both_hold_flw_4(rig: Rig) -> None:
    await limit(rig, Limits(rate=3, per_s=1.0, burst=3, partition_rate=1, partition_per_s=1.0))
    await put_many(rig, 3, partition="a")
    await put_many(rig, 3, partition="b")
    got = await rig.take(n=6)
    assert len(got) == 2  # one per key: the keys' buckets hold first
    await rig.advance(1.0)
    assert len(await rig.take(n=6)) == 2


# -- FLW-5: claim order under limits --------------------------------------------------------


async def test_priority_comes_before_the_turns_of_keys_flw_5(rig: Rig) -> None:
    await limit(rig, LOOSE)
    await put_many(rig, 3, partition="a")
    (urgent,) = await put_many(rig, 1, partition="b", priority=5)
    (plain_urgent,) = await put_many(rig, 1, priority=9)
    got = [c.id for c in await rig.take(n=2)]
    assert got == [plain_urgent, urgent]


async def test_a_small_key_is_not_starved_by_a_big_one_flw_5(rig: Rig) -> None:
    await limit(rig, LOOSE)
    big = await put_many(rig, 900, partition="big")
    (small,) = await put_many(rig, 1, partition="small")
    got = [c.id for c in await rig.take(n=1)] + [c.id for c in await rig.take(n=1)]
    assert small in got
    assert got[0] == big[0]  # the key served longest ago (both new: the older first)


async def test_keys_take_turns_one_job_each_flw_5(rig: Rig) -> None:
    await limit(rig, LOOSE)
    a = await put_many(rig, 3, partition="a")
    b = await put_many(rig, 3, partition="b")
    got = [c.id for c in await rig.take(n=4)]
    assert got == [a[0], b[0], a[1], b[1]]
    # b was served last: a's turn comes first next time.
    assert [c.id for c in await rig.take(n=1)] == [a[2]]


async def test_jobs_with_no_key_take_turns_as_one_more_key_flw_5(rig: Rig) -> None:
    await limit(rig, LOOSE)
    a = await put_many(rig, 3, partition="a")
    plain = await put_many(rig, 3)
    got = [c.id for c in await rig.take(n=4)]
    # One of each in every two claims, each lot in its own order.
    assert {got[0], got[1]} == {a[0], plain[0]}
    assert {got[2], got[3]} == {a[1], plain[1]}


async def test_a_key_with_nothing_left_leaves_the_turns_and_comes_back_last_flw_5(
    rig: Rig,
) -> None:
    await limit(rig, LOOSE)
    (a1,) = await put_many(rig, 1, partition="a")
    (x,) = await rig.take(n=1)
    assert x.id == a1
    assert await rig.backend.ack([(x.id, x.lease)]) == [True]  # a: no job, no slot held
    (b1,) = await put_many(rig, 1, partition="b")
    (a2,) = await put_many(rig, 1, partition="a")
    # a comes back as a key new to the queue: after b, which came first.
    assert [c.id for c in await rig.take(n=2)] == [b1, a2]


async def test_a_key_holding_a_slot_keeps_its_turn_flw_5(rig: Rig) -> None:
    await limit(rig, LOOSE)
    (a1,) = await put_many(rig, 1, partition="a")
    (x,) = await rig.take(n=1)
    assert x.id == a1  # held: a stays a key of the queue, served at this claim
    (b1,) = await put_many(rig, 1, partition="b")
    (a2,) = await put_many(rig, 1, partition="a")
    assert [c.id for c in await rig.take(n=2)] == [a2, b1]


async def test_a_key_at_its_limit_is_skipped_not_waited_for_flw_5(rig: Rig) -> None:
    await limit(rig, Limits(partition_concurrency=1))
    a1, a2 = await put_many(rig, 2, partition="a")
    (b1,) = await put_many(rig, 1, partition="b")
    (first,) = await rig.take(n=1)
    assert first.id == a1
    assert [c.id for c in await rig.take(n=1)] == [b1]
    assert await rig.take(n=1) == []
    assert await rig.backend.ack([(first.id, first.lease)]) == [True]
    assert [c.id for c in await rig.take(n=1)] == [a2]


# -- FLW-6: back-offs -----------------------------------------------------------------------


async def test_a_back_off_puts_the_job_back_and_holds_its_key_flw_6(rig: Rig) -> None:
    await limit(rig, LOOSE)
    a1, a2 = await put_many(rig, 2, partition="a")
    (b1,) = await put_many(rig, 1, partition="b")
    (c,) = await rig.take(n=1)
    assert c.id == a1 and c.attempt == 1
    await rig.advance(1)
    assert await rig.backend.back_off([BackOff(c.id, c.lease, 10.0)]) == [True]
    job = await rig.job(a1)
    assert job is not None and job.state is JobState.PENDING
    assert job.attempts == 0 and job.ready_at == START  # not spent; its place kept
    assert job.worker_id is None and job.deadline is None
    assert await rig.backend.ack([(c.id, c.lease)]) == [False]  # the lease ended
    assert [x.id for x in await rig.take(n=3)] == [b1]
    await rig.advance(9.9)
    assert await rig.take(n=3) == []
    rig.heard.forget()
    await rig.advance(0.1)
    assert rig.heard.told_work("q")  # the back-off ran out: work waits again
    got = await rig.take(n=3)
    assert [x.id for x in got] == [a1, a2]
    assert got[0].attempt == 1


async def test_a_back_off_of_another_key_or_the_whole_queue_flw_6(rig: Rig) -> None:
    await limit(rig, LOOSE)
    (a1,) = await put_many(rig, 1, partition="a")
    (b1,) = await put_many(rig, 1, partition="b")
    (c1,) = await put_many(rig, 1, partition="c")
    (x,) = await rig.take(n=1)
    assert x.id == a1
    assert await rig.backend.back_off([BackOff(x.id, x.lease, 5.0, partition="b")]) == [True]
    assert {j.id for j in await rig.take(n=3)} == {a1, c1}  # a is free, b is held
    await rig.advance(5)
    assert [j.id for j in await rig.take(n=3)] == [b1]


async def test_a_whole_queue_back_off_holds_every_key_flw_6(rig: Rig) -> None:
    await limit(rig, LOOSE)
    await put_many(rig, 2, partition="a")
    await put_many(rig, 2)
    (x,) = await rig.take(n=1)
    assert await rig.backend.back_off([BackOff(x.id, x.lease, 5.0, whole_queue=True)]) == [True]
    assert await rig.take(n=4) == []
    assert (await stats(rig)).backoff_until == START + 5.0
    await rig.advance(5)
    assert len(await rig.take(n=4)) == 4
    assert (await stats(rig)).backoff_until is None


async def test_a_job_with_no_key_backs_off_the_whole_queue_flw_6(rig: Rig) -> None:
    await limit(rig, LOOSE)
    (plain,) = await put_many(rig, 1)
    (keyed,) = await put_many(rig, 1, partition="a")
    (x,) = await rig.take(n=1)
    assert x.id == plain
    assert await rig.backend.back_off([BackOff(x.id, x.lease, 3.0)]) == [True]
    assert await rig.take(n=2) == []
    await rig.advance(3)
    assert {j.id for j in await rig.take(n=2)} == {plain, keyed}


async def test_a_shorter_back_off_does_not_shorten_a_longer_one_flw_6(rig: Rig) -> None:
    await limit(rig, Limits(partition_concurrency=2))
    a1, a2, a3 = await put_many(rig, 3, partition="a")
    x, y = await rig.take(n=2)  # both of key a, held together
    assert await rig.backend.back_off([BackOff(x.id, x.lease, 10.0)]) == [True]
    assert await rig.backend.back_off([BackOff(y.id, y.lease, 2.0)]) == [True]
    await rig.advance(2)
    assert await rig.take(n=3) == []  # still held: until +10
    assert await rig.backend.back_off([]) == []
    await rig.advance(8)
    got = await rig.take(n=3)
    assert len(got) == 2  # the key's concurrency: 2
    assert {c.id for c in got} <= {a1, a2, a3}


async def test_a_longer_back_off_extends_a_shorter_one_flw_6(rig: Rig) -> None:
    await limit(rig, Limits(partition_concurrency=2))
    await put_many(rig, 3, partition="a")
    x, y = await rig.take(n=2)
    assert await rig.backend.back_off([BackOff(x.id, x.lease, 2.0)]) == [True]
    assert await rig.backend.back_off([BackOff(y.id, y.lease, 6.0)]) == [True]
    await rig.advance(2)
    assert await rig.take(n=3) == []
    await rig.advance(4)
    assert len(await rig.take(n=3)) == 2


async def test_a_back_off_on_a_lease_not_valid_changes_nothing_flw_6(rig: Rig) -> None:
    await limit(rig, LOOSE)
    job_id = await rig.put(partition="a", visibility_timeout_s=5.0)
    (x,) = await rig.take()
    await rig.advance(5)  # lapsed
    assert await rig.backend.back_off(
        [BackOff(x.id, x.lease, 60.0), BackOff(x.id, "nope", 60.0), BackOff("nojob", "L1", 1.0)]
    ) == [False, False, False]
    (again,) = await rig.take()  # the key is not held
    assert again.id == job_id and again.attempt == 2
    assert await rig.backend.back_off([BackOff(x.id, x.lease, 1.0)]) == [False]  # superseded
    assert await rig.backend.ack([(again.id, again.lease)]) == [True]


async def test_a_bad_back_off_is_refused_naming_the_field_flw_6(rig: Rig) -> None:
    await limit(rig, LOOSE)
    await rig.put(partition="a")
    (x,) = await rig.take()
    got = await rig.backend.back_off(
        [
            BackOff(x.id, x.lease, -1.0),
            BackOff(x.id, x.lease, float("nan")),
            BackOff(x.id, x.lease, 1.0, partition="p" * 1025),
        ]
    )
    fields = [r.field if isinstance(r, InvalidArgument) else r for r in got]
    assert fields == ["delay_s", "delay_s", "partition"]
    job = await rig.job(x.id)
    assert job is not None and job.state is JobState.PROCESSING  # nothing changed
    assert await rig.backend.back_off([BackOff(x.id, x.lease, 0.0)]) == [True]


async def test_a_back_off_works_on_a_queue_with_no_limits_flw_6(rig: Rig) -> None:
    (a1,) = await put_many(rig, 1, partition="a")
    (b1,) = await put_many(rig, 1, partition="b")
    (x,) = await rig.take()
    assert x.id == a1
    assert await rig.backend.back_off([BackOff(x.id, x.lease, 4.0)]) == [True]
    assert [j.id for j in await rig.take(n=2)] == [b1]
    await rig.advance(4)
    assert [j.id for j in await rig.take(n=2)] == [a1]


# -- FLW-7: pause ---------------------------------------------------------------------------


async def test_a_paused_queue_hands_out_nothing_whatever_its_limits_flw_7(rig: Rig) -> None:
    await limit(rig, Limits(concurrency=5, rate=10, burst=10, partition_concurrency=5))
    await put_many(rig, 3, partition="a")
    await put_many(rig, 3)
    await rig.backend.pause("q")
    assert await rig.take(n=6) == []
    await rig.advance(10)
    assert await rig.take(n=6) == []
    assert await rig.backend.resume("q") is True
    assert len(await rig.take(n=6)) == 5  # the queue's concurrency


# -- FLW-8: stats -----------------------------------------------------------------------------


async def test_stats_tell_the_limits_and_what_they_hold_back_flw_8(rig: Rig) -> None:
    limits = Limits(partition_concurrency=1)
    await limit(rig, limits)
    await put_many(rig, 2, partition="a")
    await put_many(rig, 3, partition="b")
    await put_many(rig, 1)
    seen = await stats(rig)
    assert seen.limits == limits
    assert (seen.ready, seen.limited, seen.partitions) == (6, 0, 2)
    assert seen.backoff_until is None
    assert len(await rig.take(n=6)) == 3  # a, b, and the one with no key
    seen = await stats(rig)
    assert (seen.ready, seen.limited, seen.partitions) == (3, 3, 2)
    await limit(rig, Limits(partition_concurrency=1, concurrency=3))
    await put_many(rig, 1, partition="c")
    seen = await stats(rig)  # the queue is at its concurrency: every ready job waits
    assert (seen.ready, seen.limited, seen.partitions) == (4, 4, 3)


async def test_stats_of_a_queue_without_limits_flw_8(rig: Rig) -> None:
    await put_many(rig, 2, partition="a")
    seen = await stats(rig)
    assert seen.limits == Limits() and seen.limited == 0 and seen.backoff_until is None


async def test_stats_count_a_queue_out_of_its_rate_as_limited_flw_8(rig: Rig) -> None:
    await limit(rig, Limits(rate=1, per_s=10.0))
    await put_many(rig, 3)
    assert len(await rig.take(n=3)) == 1
    seen = await stats(rig)
    assert (seen.ready, seen.limited) == (2, 2)
    await rig.advance(10)
    seen = await stats(rig)
    assert (seen.ready, seen.limited) == (2, 0)


# -- FLW-9: restarts ----------------------------------------------------------------------------


async def test_a_restart_keeps_the_limits_and_counts_slots_from_restored_leases_flw_9(
    durable: Rig,
) -> None:
    limits = Limits(concurrency=2, partition_concurrency=1, rate=100, burst=100)
    await durable.backend.set_limits("q", limits)
    await durable.backend.enqueue(
        [Enqueue("q", i, partition="a") for i in range(3)]
        + [Enqueue("q", i, partition="b") for i in range(3)]
    )
    held = await durable.take(n=6)
    assert len(held) == 2
    await durable.backend.close()
    clock = SteppedScheduler(start=START + 1)
    again = await durable.reopen(clock)
    again.listen(Heard())
    try:
        await asyncio.sleep(0)
        assert (await again.stats(["q"]))["q"].limits == limits
        first = (await again.get_jobs([held[0].id]))[0]
        assert first is not None and first.partition in ("a", "b")
        (got,) = await again.claim([Claim("w", ("q",), 6)])
        assert got == []  # both slots held by the restored leases
        assert await again.ack([(held[0].id, held[0].lease)]) == [True]
        (got,) = await again.claim([Claim("w", ("q",), 6)])
        assert len(got) == 1  # the freed slot; the other key's slot is still held
        job = (await again.get_jobs([got[0].id]))[0]
        assert job is not None and job.partition == first.partition
    finally:
        await again.close()
