"""Ack, retry, fail, heartbeat and lapse through the backend interface (docs/contract.md
HND, RTY)."""

from __future__ import annotations

import pytest

from conveyor.broker.backend import Report
from conveyor.broker.engine import InvalidArgument, JobState

from .conftest import START, Rig


async def test_an_ack_deletes_the_job_hnd_5_job_4(rig: Rig) -> None:
    job_id = await rig.put()
    (c,) = await rig.take()
    assert await rig.backend.ack([(c.id, c.lease)]) == [True]
    assert await rig.job(job_id) is None
    assert (await rig.backend.stats(["q"]))["q"].totals.completed == 1


async def test_a_wrong_or_lapsed_lease_lands_nothing_and_raises_nothing_hnd_1_2(
    rig: Rig,
) -> None:
    job_id = await rig.put(visibility_timeout_s=10.0)
    (c,) = await rig.take()
    assert await rig.backend.ack([(c.id, "not-the-lease"), ("nope", c.lease)]) == [False, False]
    await rig.advance(10)  # at the deadline the lease has lapsed
    assert await rig.backend.ack([(c.id, c.lease)]) == [False]
    assert await rig.backend.heartbeat([(c.id, c.lease)]) == [False]
    assert await rig.backend.report([Report(c.id, c.lease, retry=True)]) == [False]
    job = await rig.job(job_id)
    assert job is not None and job.state is JobState.PROCESSING  # unchanged, until reclaimed


async def test_a_report_with_a_bad_argument_is_refused_alone_hnd_3(rig: Rig) -> None:
    await rig.put()
    await rig.put()
    a, b = await rig.take(n=2)
    results = await rig.backend.report(
        [Report(a.id, a.lease, retry=True, delay_s=-1.0), Report(b.id, b.lease, retry=False)]
    )
    assert isinstance(results[0], InvalidArgument) and results[0].field == "delay_s"
    assert results[1] is True
    # The guard holds for a lease that would not land too: an argument is never "False".
    (bad,) = await rig.backend.report([Report("unknown", "x", retry=True, delay_s=float("inf"))])
    assert isinstance(bad, InvalidArgument)


async def test_ack_retry_and_fail_are_one_shot_hnd_9(rig: Rig) -> None:
    await rig.put()
    (c,) = await rig.take()
    assert await rig.backend.report([Report(c.id, c.lease, retry=True, delay_s=0.0)]) == [True]
    assert await rig.backend.ack([(c.id, c.lease)]) == [False]
    assert await rig.backend.report([Report(c.id, c.lease, retry=False)]) == [False]


async def test_retry_with_a_delay_puts_the_job_back_hnd_6(rig: Rig) -> None:
    job_id = await rig.put()
    (c,) = await rig.take()
    rig.heard.forget()
    assert await rig.backend.report(
        [Report(c.id, c.lease, retry=True, error="boom", delay_s=20.0)]
    ) == [True]
    assert rig.heard.told_work("q")
    job = await rig.job(job_id)
    assert job is not None
    assert job.state is JobState.PENDING and job.last_error == "boom"
    assert job.ready_at == START + 20.0 and job.worker_id is None and job.deadline is None
    assert await rig.take() == []
    await rig.advance(20)
    (again,) = await rig.take()
    assert again.attempt == 2


async def test_retry_without_a_delay_draws_from_the_curve_rty_2_3(rig: Rig) -> None:
    job_id = await rig.put(backoff_base_s=8.0)
    (c,) = await rig.take()
    await rig.backend.report([Report(c.id, c.lease, retry=True)])
    job = await rig.job(job_id)
    assert job is not None
    assert START + 4.0 <= job.ready_at <= START + 8.0  # the first retry: [base/2, base]


async def test_a_retry_of_the_last_attempt_kills_the_job_hnd_6(rig: Rig) -> None:
    job_id = await rig.put(max_attempts=1)
    (c,) = await rig.take()
    await rig.backend.report([Report(c.id, c.lease, retry=True, error="still broken")])
    job = await rig.job(job_id)
    assert job is not None and job.state is JobState.DEAD
    assert job.last_error == "still broken" and job.died_at == START


async def test_fail_kills_at_once_hnd_7_dlq_1(rig: Rig) -> None:
    job_id = await rig.put()
    (c,) = await rig.take()
    await rig.backend.report([Report(c.id, c.lease, retry=False)])
    job = await rig.job(job_id)
    assert job is not None and job.state is JobState.DEAD
    assert job.last_error == "failed" and job.worker_id is None and job.deadline is None


async def test_a_heartbeat_resets_the_deadline_from_now_hnd_8(rig: Rig) -> None:
    await rig.put(visibility_timeout_s=10.0)
    (c,) = await rig.take()
    await rig.advance(6)
    assert await rig.backend.heartbeat([(c.id, c.lease)]) == [True]
    job = await rig.job(c.id)
    assert job is not None and job.deadline == START + 6 + 10.0
    await rig.advance(9)
    assert await rig.backend.ack([(c.id, c.lease)]) == [True]  # past the first deadline


async def test_lapse_ends_a_lease_now_and_keeps_the_attempt_spent_hnd_11(rig: Rig) -> None:
    await rig.put()
    (c,) = await rig.take(worker="gone")
    rig.heard.forget()
    assert await rig.backend.lapse([(c.id, c.lease), (c.id, "other")]) == [True, False]
    assert rig.heard.told_work("q")
    (again,) = await rig.take(worker="next")
    assert again.id == c.id and again.attempt == 2


async def test_reattach_keeps_the_jobs_its_worker_still_holds(rig: Rig) -> None:
    await rig.put(visibility_timeout_s=10.0)
    await rig.put(visibility_timeout_s=10.0)
    a, b = await rig.take(n=2, worker="w")
    await rig.advance(5)
    assert await rig.backend.reattach("someone-else", [(a.id, a.lease)]) == []
    assert await rig.backend.reattach("w", [(a.id, a.lease), (b.id, "stale")]) == [(a.id, a.lease)]
    job = await rig.job(a.id)
    assert job is not None and job.deadline == START + 5 + 10.0  # reattaching heartbeats


async def test_held_leases_lists_every_valid_lease(rig: Rig) -> None:
    await rig.put(visibility_timeout_s=10.0)
    await rig.put(visibility_timeout_s=100.0)
    short, long = await rig.take(n=2, worker="w")
    assert sorted(await rig.backend.held_leases()) == sorted(
        [(short.id, short.lease, "w"), (long.id, long.lease, "w")]
    )
    await rig.advance(10)
    assert await rig.backend.held_leases() == [(long.id, long.lease, "w")]


async def test_held_leases_of_one_worker_lists_only_its_valid_leases(rig: Rig) -> None:
    for _ in range(3):
        await rig.put(visibility_timeout_s=10.0)
    (mine,) = await rig.take(worker="w")
    (theirs,) = await rig.take(worker="other")
    (lapsing,) = await rig.take(worker="w")
    assert (await rig.backend.heartbeat([(mine.id, mine.lease)])) == [True]
    assert sorted(await rig.backend.held_leases("w")) == sorted(
        [(mine.id, mine.lease, "w"), (lapsing.id, lapsing.lease, "w")]
    )
    assert await rig.backend.held_leases("other") == [(theirs.id, theirs.lease, "other")]
    assert await rig.backend.lapse([(lapsing.id, lapsing.lease)]) == [True]
    assert await rig.backend.held_leases("w") == [(mine.id, mine.lease, "w")]
    assert await rig.backend.held_leases("nobody") == []


@pytest.mark.parametrize("n", [1, 50])
async def test_acks_in_one_call_each_land_on_their_own_hnd_10(rig: Rig, n: int) -> None:
    for _ in range(n):
        await rig.put()
    claimed = await rig.take(n=n)
    leases = [(c.id, c.lease) for c in claimed]
    assert await rig.backend.ack([*leases, ("x", "y")]) == [True] * n + [False]
    assert (await rig.backend.stats(["q"]))["q"].processing == 0


async def test_reattach_names_the_lease_that_holds_not_a_stale_one_of_the_same_job(
    rig: Rig,
) -> None:
    await rig.put(visibility_timeout_s=10.0)
    (first,) = await rig.take(worker="w")
    await rig.backend.lapse([(first.id, first.lease)])
    (second,) = await rig.take(worker="w")
    pairs = [(first.id, first.lease), (second.id, second.lease)]
    assert await rig.backend.reattach("w", pairs) == [(second.id, second.lease)]
