"""Job dependencies through the backend interface (docs/contract.md, DEP-1 to DEP-13),
on every backend kind."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.broker.backend import Claim, Enqueue, Report
from conveyor.broker.engine import (
    DependencyCycle,
    InvalidArgument,
    JobState,
    Limits,
    NewJob,
    QueueOpts,
)

from .conftest import DURABLE_KINDS, RIG_KINDS, Rig, _rig


@pytest.fixture(params=RIG_KINDS)
async def drig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    """``rig``."""
    async with _rig(request.param, tmp_path) as made:
        yield made


@pytest.fixture(params=DURABLE_KINDS)
async def ddurable(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    """``durable``."""
    async with _rig(request.param, tmp_path) as made:
        yield made


async def _state(rig: Rig, job_id: str) -> JobState | None:
    job = await rig.job(job_id)
    return None if job is None else job.state


async def _ack_all(rig: Rig, queues: tuple[str, ...] = ("q",)) -> list[str]:
    got = await rig.take(queues, n=100)
    acks = await rig.backend.ack(
        [(c.id, c.lease) for c in got], [f'"{c.id}"'.encode() for c in got]
    )
    assert all(acks)
    return [c.id for c in got]


async def test_a_dependent_is_handed_out_only_once_every_dependency_is_acked_dep_1(
    drig: Rig,
) -> None:
    rig = drig
    a = await rig.put(payload="a")
    b = await rig.put("other", payload="b")
    c = await rig.put(payload="c", after=(a, b))
    job = await rig.job(c)
    assert job is not None and job.state is JobState.WAITING and job.after == (a, b)
    stats = (await rig.backend.stats(["q"]))["q"]
    assert (stats.waiting, stats.ready) == (1, 1)
    page = await rig.backend.list_jobs("q", "waiting")
    assert page is not None and [j.id for j in page.jobs] == [c] and page.total == 1
    assert await _ack_all(rig) == [a]
    assert await rig.take() == []
    assert await _state(rig, c) is JobState.WAITING
    rig.heard.forget()
    assert await _ack_all(rig, ("other",)) == [b]
    assert rig.heard.told_work("q")  # the release told the broker
    (claimed,) = await rig.take()
    assert claimed.id == c and claimed.dependencies == 2


async def test_the_dependent_reads_its_dependencies_results_dep_2(drig: Rig) -> None:
    rig = drig
    ids = [await rig.put(payload=i) for i in range(3)]
    final = await rig.put("fin", after=tuple(ids))
    await _ack_all(rig)
    results = await rig.backend.dependency_results(final)
    assert results == [(i, f'"{i}"'.encode()) for i in ids]
    assert await rig.backend.dependency_results("nope") is None


async def test_a_dependency_that_fails_kills_its_dependents_dep_3(drig: Rig) -> None:
    rig = drig
    a = await rig.put(payload="a")
    b = await rig.put(payload="b", after=(a,))
    c = await rig.put("other", payload="c", after=(b,))
    (claimed,) = await rig.take()
    assert await rig.backend.report([Report(claimed.id, claimed.lease, False, "boom")]) == [True]
    jb, jc = await rig.backend.get_jobs([b, c])
    assert jb is not None and jb.state is JobState.DEAD
    assert jb.last_error == f"dependency {a} died: boom"
    assert jc is not None and jc.state is JobState.DEAD
    assert jc.last_error == f"dependency {b} died: dependency {a} died: boom"


async def test_a_cancelled_dependency_kills_its_dependents_dep_3(drig: Rig) -> None:
    rig = drig
    a = await rig.put(payload="a", delay_s=60.0)
    b = await rig.put(payload="b", after=(a,))
    assert await rig.backend.cancel([a]) == [True]
    job = await rig.job(b)
    assert job is not None and job.state is JobState.DEAD
    assert job.last_error == f"dependency {a} was cancelled"


def _member(queue: str, payload: Any, after: tuple[str | int, ...] = (), **opts: Any) -> Enqueue:
    return Enqueue(queue, payload, after=after, **opts)


async def test_a_cycle_in_a_group_is_refused_dep_4(drig: Rig) -> None:
    rig = drig
    group = [_member("q", 0, (1,)), _member("q", 1, (0,))]
    with pytest.raises(DependencyCycle) as caught:
        await rig.backend.enqueue_group(group)
    assert caught.value.code == "dependency_cycle" and caught.value.field.endswith(".after")
    assert (await rig.backend.stats()).get("q") is None or (
        (await rig.backend.stats(["q"]))["q"].totals.enqueued == 0
    )


async def test_redrive_of_a_dependent_waits_again_dep_5(drig: Rig) -> None:
    rig = drig
    a = await rig.put(payload="a")
    b = await rig.put(payload="b", after=(a,))
    (claimed,) = await rig.take()
    await rig.backend.report([Report(claimed.id, claimed.lease, False, "x")])
    assert await rig.backend.redrive([a, b]) == [True, True]
    assert await _state(rig, b) is JobState.WAITING
    assert await _ack_all(rig) == [a]
    (claimed,) = await rig.take()
    assert claimed.id == b


async def test_a_group_makes_a_tree_at_once_or_nothing_dep_6(drig: Rig) -> None:
    rig = drig
    before = await rig.put(payload="before")
    bad = [_member("q", "root"), _member("q", "leaf", (0, "no-such-job"))]
    with pytest.raises(InvalidArgument) as caught:
        await rig.backend.enqueue_group(bad)
    assert caught.value.field == "jobs[1].after[1]"
    assert (await rig.backend.stats(["q"]))["q"].totals.enqueued == 1
    ids = await rig.backend.enqueue_group(
        [
            _member("q", "fin", (1, 2)),
            _member("q", "root", (before,)),
            _member("side", "side", (1,)),
        ]
    )
    fin, root, side = ids
    jobs = await rig.backend.get_jobs(ids)
    assert [j.state for j in jobs if j is not None] == [JobState.WAITING] * 3
    assert jobs[0] is not None and jobs[0].after == (root, side)
    assert await _ack_all(rig) == [before]
    assert await _ack_all(rig) == [root]
    assert await _ack_all(rig, ("side",)) == [side]
    (claimed,) = await rig.take()
    assert claimed.id == fin
    results = await rig.backend.dependency_results(fin)
    assert results == [(root, f'"{root}"'.encode()), (side, f'"{side}"'.encode())]


async def test_an_unknown_dependency_is_refused_and_a_dead_one_kills_dep_7(drig: Rig) -> None:
    rig = drig
    (refused,) = await rig.backend.enqueue([Enqueue("q", 1, after=("no-such-job",))])
    assert isinstance(refused, InvalidArgument) and refused.field == "after[0]"
    await rig.backend.set_queue("q", QueueOpts(dead_letter_retention_s=100.0))
    a = await rig.put(payload="a")
    (claimed,) = await rig.take()
    await rig.backend.report([Report(claimed.id, claimed.lease, False, "nope")])
    b = await rig.put(payload="b", after=(a,))
    job = await rig.job(b)
    assert job is not None and job.state is JobState.DEAD
    assert job.last_error == f"dependency {a} died: nope"


async def test_a_keyed_duplicate_adds_no_edge_dep_8(drig: Rig) -> None:
    rig = drig
    a, b = await rig.put(payload="a"), await rig.put(payload="b")
    first = await rig.put(payload="k", key="k", after=(a,))
    assert await rig.put(payload="k", key="k", after=(a, b)) == first
    job = await rig.job(first)
    assert job is not None and job.after == (a,)


async def test_a_released_job_is_ready_at_the_later_of_its_time_and_now_dep_10(
    drig: Rig,
) -> None:
    rig = drig
    a = await rig.put(payload="a")
    b = await rig.put(payload="b", after=(a,), delay_s=30.0)
    await rig.advance(40)  # its own delay is over: it still waits for a
    assert await _state(rig, b) is JobState.WAITING
    await _ack_all(rig)
    job = await rig.job(b)
    assert job is not None and job.state is JobState.PENDING and job.ready_at == rig.now
    (claimed,) = await rig.take()
    assert claimed.id == b
    c = await rig.put(payload="c")
    d = await rig.put(payload="d", after=(c,), delay_s=30.0)
    await _ack_all(rig)
    job = await rig.job(d)
    assert job is not None and job.state is JobState.PENDING and job.ready_at == rig.now + 30.0
    await rig.advance(30)
    (claimed,) = await rig.take()
    assert claimed.id == d


async def test_a_waiting_job_can_expire_and_cancel_removes_it_dep_13(drig: Rig) -> None:
    rig = drig
    a = await rig.put(payload="a", delay_s=100.0)
    b = await rig.put(payload="b", after=(a,), expires_s=10.0)
    c = await rig.put(payload="c", after=(a,))
    assert [await _state(rig, i) for i in (b, c)] == [JobState.WAITING] * 2
    await rig.advance(10)
    await rig.backend.sweep()
    job = await rig.job(b)
    assert job is not None and job.state is JobState.DEAD and job.last_error == "expired"
    assert await rig.backend.cancel([c]) == [True]
    assert await rig.job(c) is None
    stats = (await rig.backend.stats(["q"]))["q"]
    assert (stats.waiting, stats.dead, stats.scheduled) == (0, 1, 1)


async def test_a_restart_keeps_waiting_jobs_edges_and_results_dep_1_dep_2(
    ddurable: Rig,
) -> None:
    rig = ddurable
    a, b = await rig.put(payload="a"), await rig.put(payload="b")
    c = await rig.put(payload="c", after=(a, b))
    (claimed,) = await rig.take()
    assert claimed.id == a
    await rig.backend.ack([(a, claimed.lease)], [b'"A"'])
    await rig.backend.settle()
    await rig.backend.close()
    kept = await rig.reopen(rig.clock)
    try:
        (job,) = await kept.get_jobs([c])
        assert job is not None and job.state is JobState.WAITING and job.waiting_for == 1
        assert (await kept.stats(["q"]))["q"].waiting == 1
        ((claimed,),) = await kept.claim([Claim("w", ("q",), 5)])
        assert claimed.id == b
        await kept.ack([(b, claimed.lease)], [b'"B"'])
        ((claimed,),) = await kept.claim([Claim("w", ("q",), 5)])
        assert claimed.id == c
        assert await kept.dependency_results(c) == [(a, b'"A"'), (b, b'"B"')]
    finally:
        await kept.close()


async def test_a_redriven_dependency_acked_before_a_restart_leaves_its_result_dep_5(
    ddurable: Rig,
) -> None:
    rig = ddurable
    a = await rig.put(payload="a")
    b = await rig.put(payload="b", after=(a,))
    (claimed,) = await rig.take()
    await rig.backend.report([Report(claimed.id, claimed.lease, False, "x")])
    await rig.backend.settle()
    await rig.backend.close()
    kept = await rig.reopen(rig.clock)
    try:
        assert await kept.redrive([a]) == [True]
        ((claimed,),) = await kept.claim([Claim("w", ("q",), 5)])
        assert claimed.id == a
        assert await kept.ack([(a, claimed.lease)], [b'"A"']) == [True]
        assert await kept.redrive([b]) == [True]
        ((claimed,),) = await kept.claim([Claim("w", ("q",), 5)])
        assert claimed.id == b
        assert await kept.dependency_results(b) == [(a, b'"A"')]
    finally:
        await kept.close()


async def test_after_is_bounded_and_a_batch_takes_it_dep_9(drig: Rig) -> None:
    rig = drig
    a = await rig.put(payload="a")
    (refused,) = await rig.backend.enqueue([Enqueue("q", 1, after=(a,) * 2 + ("x",) * 1000)])
    assert isinstance(refused, InvalidArgument) and refused.field == "after"
    ids = await rig.backend.enqueue_all(
        "q", [NewJob(1, after=(a,)), NewJob(2), NewJob(3, after=(a, a))]
    )
    jobs = await rig.backend.get_jobs(ids)
    assert [j.state for j in jobs if j is not None] == [
        JobState.WAITING,
        JobState.PENDING,
        JobState.WAITING,
    ]
    assert jobs[2] is not None and jobs[2].after == (a,)
    with pytest.raises(InvalidArgument) as caught:
        await rig.backend.enqueue_all("q", [NewJob(4), NewJob(5, after=("nope",))])
    assert caught.value.field == "jobs[1].after[0]"


async def test_released_jobs_go_by_priority_and_join_their_partition_dep_11_dep_12(
    drig: Rig,
) -> None:
    rig = drig
    await rig.backend.set_limits("q", Limits(partition_concurrency=1))
    a = await rig.put(payload="a", priority=10)
    busy = await rig.put(payload="busy", partition="p")
    low = await rig.put(payload="low", after=(a,), priority=1)
    high = await rig.put(payload="high", after=(a,), priority=9, partition="r")
    held = await rig.put(payload="held", after=(a,), priority=5, partition="p")
    first = await rig.take(n=2)
    assert [c.id for c in first] == [a, busy]
    await rig.backend.ack([(first[0].id, first[0].lease)])
    # Released in priority order; p's slot is still held by busy.
    assert [c.id for c in await rig.take(n=5)] == [high, low]
    await rig.backend.ack([(first[1].id, first[1].lease)])
    assert [c.id for c in await rig.take(n=5)] == [held]
