"""Enqueue through the backend interface (docs/contract.md ENQ, JOB)."""

from __future__ import annotations

from conveyor.broker.backend import Enqueue, Report
from conveyor.broker.egress import Out
from conveyor.broker.engine import InvalidArgument, JobState, NewJob, QueueOpts

from .conftest import START, Rig


async def test_a_job_gets_the_plain_defaults_and_its_fields(rig: Rig) -> None:
    job_id = await rig.put("q", {"n": 1}, priority=5)
    job = await rig.job(job_id)
    assert job is not None
    assert job.id == job_id and job.queue == "q"
    assert job.state is JobState.PENDING
    assert job.payload == {"n": 1}
    assert job.priority == 5 and job.attempts == 0
    # ENQ-1: the plain defaults.
    assert (job.visibility_timeout_s, job.max_attempts, job.backoff_base_s) == (300.0, 3, 5.0)
    assert job.enqueued_at == START and job.ready_at == START
    assert job.worker_id is None and job.deadline is None and job.last_error is None


async def test_seq_grows_with_each_enqueue_job_1(rig: Rig) -> None:
    first = await rig.job(await rig.put())
    second = await rig.job(await rig.put())
    assert first is not None and second is not None
    assert second.seq > first.seq


async def test_queue_options_are_the_defaults_an_enqueue_may_override_enq_2(rig: Rig) -> None:
    await rig.backend.set_queue("slow", QueueOpts(visibility_timeout_s=60.0, max_attempts=7))
    plain = await rig.job(await rig.put("slow"))
    override = await rig.job(await rig.put("slow", max_attempts=2))
    assert plain is not None and override is not None
    assert (plain.visibility_timeout_s, plain.max_attempts) == (60.0, 7)
    assert override.max_attempts == 2


async def test_bad_queue_options_are_refused_naming_the_field_enq_3(rig: Rig) -> None:
    try:
        await rig.backend.set_queue("q", QueueOpts(max_attempts=0))
    except InvalidArgument as exc:
        assert exc.field == "max_attempts"
    else:
        raise AssertionError("max_attempts 0 was accepted")


async def test_delay_and_run_at_set_the_ready_time_delay_wins_enq_5(rig: Rig) -> None:
    delayed = await rig.job(await rig.put(delay_s=30.0, run_at=START + 500))
    at = await rig.job(await rig.put(run_at=START + 500))
    assert delayed is not None and at is not None
    assert delayed.ready_at == START + 30.0
    assert at.ready_at == START + 500


async def test_expiry_is_relative_to_the_enqueue_enq_6(rig: Rig) -> None:
    job = await rig.job(await rig.put(expires_s=10.0))
    assert job is not None and job.expires_at == START + 10.0


async def test_each_job_stands_alone_its_error_names_the_field(rig: Rig) -> None:
    results = await rig.backend.enqueue(
        [
            Enqueue("q", 1),
            Enqueue("q", 2, priority=True),  # ENQ-8: a bool is no number
            Enqueue("bad name!", 3),
            Enqueue("q", 4, delay_s=-1.0),
            Enqueue("q", 5),
        ]
    )
    assert isinstance(results[0], str) and isinstance(results[4], str)
    errors = [r for r in results if isinstance(r, InvalidArgument)]
    assert [e.field for e in errors] == ["priority", "queue", "delay_s"]
    stats = await rig.backend.stats(["q"])
    assert stats["q"].ready == 2  # ENQ-7: a refused job changed nothing


async def test_a_key_while_its_job_lives_returns_that_job_enq_10(rig: Rig) -> None:
    first = await rig.put("q", 1, key="order-7")
    again = await rig.put("q", 2, key="order-7")
    other_queue = await rig.put("r", 3, key="order-7")
    assert again == first
    assert other_queue != first  # keys of different queues never meet
    job = await rig.job(first)
    assert job is not None and job.payload == 1  # the second enqueue changed nothing
    (claimed,) = await rig.take()
    assert await rig.backend.ack([(claimed.id, claimed.lease)]) == [True]
    assert await rig.put("q", 4, key="order-7") != first  # gone: the key is free again


async def test_a_key_holds_in_every_state_dead_included_enq_10(rig: Rig) -> None:
    job_id = await rig.put(key="k", max_attempts=1)
    (claimed,) = await rig.take()
    await rig.backend.report([Report(claimed.id, claimed.lease, retry=False)])
    job = await rig.job(job_id)
    assert job is not None and job.state is JobState.DEAD
    assert await rig.put(key="k") == job_id
    assert await rig.backend.purge_dead("q") == 1
    assert await rig.put(key="k") != job_id


async def test_enqueue_all_is_all_or_nothing_enq_11(rig: Rig) -> None:
    try:
        await rig.backend.enqueue_all("q", [NewJob(1), NewJob(2, delay_s=float("nan"))])
    except InvalidArgument as exc:
        assert exc.field == "jobs[1].delay_s"
    else:
        raise AssertionError("a NaN delay was accepted")
    stats = await rig.backend.stats(["q"])
    assert "q" not in stats or stats["q"].pending == 0
    ids = await rig.backend.enqueue_all("q", [NewJob(1, key="a"), NewJob(2, key="a"), NewJob(3)])
    assert ids[0] == ids[1] != ids[2]  # a key an earlier job of the batch took
    assert (await rig.backend.stats(["q"]))["q"].ready == 2


async def test_enqueue_tells_the_listener_of_work(rig: Rig) -> None:
    rig.heard.forget()
    await rig.put("mail")
    assert rig.heard.told_work("mail")


async def test_a_jobs_time_limit_is_kept_and_handed_out_with_each_claim(durable: Rig) -> None:
    """``timeout_s`` (JOB-3): stored as given, ``None`` when not, carried by the claim for
    the worker to enforce, and kept across a restart."""
    limited = await durable.put("q", 1, timeout_s=2.5)
    plain = await durable.put("q", 2)
    (batch,) = await durable.backend.enqueue_all("q", [NewJob(3, timeout_s=7.0)])
    job = await durable.job(limited)
    assert job is not None and job.timeout_s == 2.5
    none = await durable.job(plain)
    assert none is not None and none.timeout_s is None
    got = {claim.id: claim.timeout_s for claim in await durable.take(n=3)}
    assert got == {limited: 2.5, plain: None, batch: 7.0}
    await durable.through_gate(Out.PUSH)
    assert [j.timeout_s if j else "gone" for j in await durable.on_disk([limited, plain])] == [
        2.5,
        None,
    ]


async def test_a_bad_time_limit_is_refused_naming_it_enq_9(rig: Rig) -> None:
    results = await rig.backend.enqueue(
        [
            Enqueue("q", 1, timeout_s=0.0),
            Enqueue("q", 2, timeout_s=float("inf")),
            Enqueue("q", 3, timeout_s=True),
        ]
    )
    assert all(isinstance(r, InvalidArgument) and r.field == "timeout_s" for r in results)
    try:
        await rig.backend.enqueue_all("q", [NewJob(1), NewJob(2, timeout_s=-1.0)])
    except InvalidArgument as exc:
        assert exc.field == "jobs[1].timeout_s"
    else:
        raise AssertionError("timeout_s -1 was accepted")
