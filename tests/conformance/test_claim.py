"""Claiming through the backend interface (docs/contract.md CLM, OPS-4)."""

from __future__ import annotations

from conveyor.broker.backend import Claim
from conveyor.broker.engine import JobState, QueueOpts

from .conftest import START, Rig


async def test_a_claim_hands_out_at_most_n_clm_1(rig: Rig) -> None:
    for _ in range(5):
        await rig.put()
    assert len(await rig.take(n=3)) == 3
    assert len(await rig.take(n=3)) == 2
    assert await rig.take(n=3) == []
    assert await rig.take(n=0) == []


async def test_a_claim_sets_the_lease_the_attempt_and_the_deadline_clm_7(rig: Rig) -> None:
    job_id = await rig.put(payload={"x": 1}, priority=2, visibility_timeout_s=30.0)
    await rig.advance(5)
    (claimed,) = await rig.take(worker="w-1")
    assert claimed.id == job_id and claimed.queue == "q"
    assert claimed.attempt == 1 and claimed.max_attempts == 3
    assert claimed.deadline == START + 5 + 30.0
    assert claimed.priority == 2 and claimed.visibility_timeout_s == 30.0
    assert claimed.payload_json == b'{"x":1}'
    assert claimed.ready_since == START
    job = await rig.job(job_id)
    assert job is not None
    assert job.state is JobState.PROCESSING and job.attempts == 1
    assert job.worker_id == "w-1" and job.deadline == claimed.deadline


async def test_order_is_priority_then_ready_time_then_seq_clm_6(rig: Rig) -> None:
    low = await rig.put(priority=0)
    high_late = await rig.put(priority=9, delay_s=10)
    high = await rig.put(priority=9)
    low_2 = await rig.put(priority=0)
    await rig.advance(10)
    got = [c.id for c in await rig.take(n=4)]
    assert got == [high, high_late, low, low_2]


async def test_queues_are_taken_in_the_order_given(rig: Rig) -> None:
    later = await rig.put("b")
    first = await rig.put("a")
    got = await rig.take(queues=("a", "b"), n=1)
    assert [c.id for c in got] == [first]
    got = await rig.take(queues=("a", "b"), n=5)
    assert [c.id for c in got] == [later]


async def test_a_queue_that_does_not_exist_hands_out_nothing(rig: Rig) -> None:
    assert await rig.take(queues=("nowhere",)) == []
    assert "nowhere" not in await rig.backend.queues()


async def test_one_call_serves_each_claim_in_order_and_never_gives_a_job_twice_clm_8(
    rig: Rig,
) -> None:
    ids = {await rig.put() for _ in range(5)}
    got = await rig.backend.claim(
        [Claim("a", ("q",), 2), Claim("b", ("q",), 2), Claim("c", ("q",), 2)]
    )
    assert [len(g) for g in got] == [2, 2, 1]
    handed = [c.id for g in got for c in g]
    assert sorted(handed) == sorted(ids)  # each once
    leases = [c.lease for g in got for c in g]
    assert len(set(leases)) == 5


async def test_a_lapsed_lease_is_reclaimed_and_the_reclaim_costs_an_attempt_clm_2_3(
    rig: Rig,
) -> None:
    job_id = await rig.put(visibility_timeout_s=10.0, max_attempts=2)
    (first,) = await rig.take(worker="a")
    await rig.advance(9.9)
    assert await rig.take(worker="b") == []  # still valid
    await rig.advance(0.1)  # now == deadline: lapsed (HND-1)
    (second,) = await rig.take(worker="b")
    assert second.id == job_id and second.attempt == 2 and second.lease != first.lease
    assert await rig.backend.ack([(job_id, first.lease)]) == [False]
    await rig.advance(10)
    assert await rig.take(worker="c") == []  # used up: it dies instead
    job = await rig.job(job_id)
    assert job is not None and job.state is JobState.DEAD
    assert job.last_error == "max attempts exceeded"


async def test_an_expired_job_is_never_handed_out_clm_4(rig: Rig) -> None:
    job_id = await rig.put(expires_s=5.0)
    await rig.advance(5)
    assert await rig.take() == []
    job = await rig.job(job_id)
    assert job is not None and job.state is JobState.DEAD and job.last_error == "expired"


async def test_a_claim_skips_a_paused_queue_and_resume_hands_out_again_ops_4(rig: Rig) -> None:
    job_id = await rig.put()
    await rig.backend.pause("q")
    assert await rig.take() == []
    assert (await rig.backend.stats(["q"]))["q"].paused
    rig.heard.forget()
    assert await rig.backend.resume("q") is True
    assert rig.heard.told_work("q")
    assert await rig.backend.resume("nowhere") is False  # no such queue (none made)
    assert "nowhere" not in await rig.backend.queues()
    assert [c.id for c in await rig.take()] == [job_id]


async def test_a_delayed_job_waits_for_its_time_and_the_listener_hears_of_it(rig: Rig) -> None:
    job_id = await rig.put(delay_s=60.0)
    assert await rig.take() == []
    rig.heard.forget()
    await rig.advance(59)
    assert not rig.heard.work  # nothing is due yet: the timer has not fired
    await rig.advance(1)
    assert rig.heard.told_work("q")  # the backend's timer, on the manual clock
    assert [c.id for c in await rig.take()] == [job_id]


async def test_a_claim_reports_the_last_attempt(rig: Rig) -> None:
    await rig.backend.set_queue("q", QueueOpts(max_attempts=1))
    await rig.put()
    (claimed,) = await rig.take()
    assert claimed.attempt == claimed.max_attempts == 1  # its last


async def test_round_robin_claims_take_one_job_each_in_turn(rig: Rig) -> None:
    ids = [await rig.put() for _ in range(5)]
    got = await rig.backend.claim(
        [Claim("a", ("q",), 3), Claim("b", ("q",), 1), Claim("c", ("q",), 3)], round_robin=True
    )
    assert [[c.id for c in g] for g in got] == [[ids[0], ids[3]], [ids[1]], [ids[2], ids[4]]]


async def test_round_robin_claims_keep_each_workers_queue_order(rig: Rig) -> None:
    a1 = await rig.put("a")
    b1 = await rig.put("b")
    b2 = await rig.put("b")
    got = await rig.backend.claim(
        [Claim("x", ("b", "a"), 2), Claim("y", ("a", "b"), 2)], round_robin=True
    )
    assert [[c.id for c in g] for g in got] == [[b1, b2], [a1]]


async def test_claim_bound_is_never_below_what_claims_take_then(rig: Rig) -> None:
    """A pass asks only as much of a queue's waiting line as ``claim_bound`` says may get
    a job: were it ever below what a claim takes, a worker would wait beside a job."""

    async def takes_within_bound(n: int, queue: str = "q") -> None:
        bound = rig.backend.claim_bound(queue)
        got = await rig.take(queues=(queue,), n=100)
        assert len(got) == n
        assert bound is None or bound >= n, (bound, n)

    assert rig.backend.claim_bound("nowhere") in (None, 0)
    await rig.put(visibility_timeout_s=10.0)
    await rig.put(visibility_timeout_s=10.0)
    await rig.put(delay_s=5.0)
    await rig.put("p", partition="k")
    await takes_within_bound(2)  # the two ready; the delayed one is not yet
    await rig.advance(5)
    await takes_within_bound(1)  # matured since the last look
    await rig.advance(10)  # the first two leases lapse, with attempts left
    await takes_within_bound(2)
    await takes_within_bound(1, "p")  # with a partition key
    await rig.backend.pause("q")
    await rig.put()
    await takes_within_bound(0)
