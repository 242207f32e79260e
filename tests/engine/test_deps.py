"""``docs/contract.md``, "Dependencies" (DEP-1 to DEP-14) in the engine, on the manual
clock. The ``table`` fixture's SQLite kind rebuilds the table from its file at every
clock step and compares every job, count and dependency result, so each test here also
checks that edges, waiting jobs and kept results survive a restart."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from conveyor.broker.engine import (
    MAX_AFTER,
    DependencyCycle,
    InvalidArgument,
    JobState,
    JobTable,
    Limits,
    NewJob,
    QueueOpts,
)
from conveyor.broker.engine._heap import Heap, Ranked
from conveyor.broker.engine._table import Queue

if TYPE_CHECKING:
    from conftest import ManualClock


def _claim_all(table: JobTable, queue: str = "q", n: int = 100) -> list[Any]:
    return table.queue(queue).claim_batch("w", n)


def _state(table: JobTable, job_id: str) -> JobState | None:
    job = table.get_job(job_id)
    return None if job is None else job.state


def _member(queue: str, payload: Any = None, after: tuple[Any, ...] = (), **opts: Any) -> tuple:
    """One member of a group: an ``enqueue_each`` tuple with its ``after``."""
    spec = NewJob(payload, **opts)
    return (
        queue,
        spec.payload,
        spec.priority,
        spec.delay_s,
        spec.run_at,
        spec.expires_s,
        spec.visibility_timeout_s,
        spec.max_attempts,
        spec.backoff_base_s,
        spec.key,
        spec.timeout_s,
        spec.partition,
        after,
    )


def test_a_dependent_waits_until_every_dependency_is_acked_dep_1(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    a, b = q.enqueue("a"), q.enqueue("b")
    c = q.enqueue("c", after=[a, b])
    job = table.get_job(c)
    assert job is not None and job.state is JobState.WAITING
    assert job.after == (a, b) and job.waiting_for == 2
    stats = q.stats()
    assert (stats.waiting, stats.ready, stats.scheduled) == (1, 2, 0)
    ha, hb = _claim_all(table)
    assert {ha.id, hb.id} == {a, b}  # the waiting job is not handed out
    clock.advance(1)
    assert ha.ack(b"1")
    assert _state(table, c) is JobState.WAITING and q.claim_one("w") is None
    assert table.get_job(c).waiting_for == 1  # type: ignore[union-attr]
    clock.advance(1)
    assert hb.ack(b"2")
    job = table.get_job(c)
    assert job is not None and job.state is JobState.PENDING and job.ready_at == clock.now
    assert q.stats().waiting == 0
    hc = q.claim_one("w")
    assert hc is not None and hc.id == c and hc.dependencies == 2


def test_a_lapsed_or_foreign_ack_releases_nothing_dep_1(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    a = q.enqueue("a", visibility_timeout_s=5.0)
    c = q.enqueue("c", after=[a])
    h = q.claim_one("w")
    assert h is not None
    clock.advance(6)  # the lease lapsed
    assert not h.ack(b"1")
    assert _state(table, c) is JobState.WAITING
    h2 = q.claim_one("w")
    assert h2 is not None and h2.id == a
    assert h2.ack(b"2")
    assert _state(table, c) is JobState.PENDING
    assert table.dependency_results(c) == [(a, b"2")]


def test_the_dependent_reads_its_dependencies_results_in_order_dep_2(
    table: JobTable, clock: ManualClock
) -> None:
    q, other = table.queue("q"), table.queue("other")
    ids = [q.enqueue(i) for i in range(3)] + [other.enqueue("x")]
    final = other.enqueue("final", after=list(reversed(ids)))
    handles = _claim_all(table) + _claim_all(table, "other")
    for h in reversed(handles):  # acked in another order than named
        assert h.ack(None if h.id == ids[1] else f'"{h.id}"'.encode())
    assert table.dependency_results(final) == [
        (ids[3], f'"{ids[3]}"'.encode()),
        (ids[2], f'"{ids[2]}"'.encode()),
        (ids[1], None),
        (ids[0], f'"{ids[0]}"'.encode()),
    ]
    assert table.dependency_results("nope") is None
    assert table.dependency_results(ids[0]) is None  # acked and gone
    clock.advance(1)
    h = other.claim_one("w")
    assert h is not None and h.id == final
    assert h.ack()
    assert table.dependency_results(final) is None  # it left: its edges went with it


def test_a_dependency_kept_completed_counts_as_acked_with_its_result_dep_2(
    table: JobTable, clock: ManualClock
) -> None:
    table.queue("q", QueueOpts(completed_retention_s=60.0))
    q = table.queue("q")
    a = q.enqueue("a")
    h = q.claim_one("w")
    assert h is not None and h.ack(b'{"v":1}')
    clock.advance(1)
    c = q.enqueue("c", after=[a])
    assert _state(table, c) is JobState.PENDING
    assert table.dependency_results(c) == [(a, b'{"v":1}')]


@pytest.mark.parametrize("how", ["fail", "used_up", "expired", "expired_waiting"])
def test_a_dependency_that_dies_kills_its_dependents_transitively_dep_3(
    table: JobTable, clock: ManualClock, how: str
) -> None:
    q = table.queue("q")
    if how == "expired_waiting":  # a waiting job expires: its own dependents die
        root = q.enqueue("root", delay_s=100.0)
        a = q.enqueue("a", after=[root], expires_s=5.0)
    else:
        a = q.enqueue("a", max_attempts=1, visibility_timeout_s=5.0, expires_s=50.0)
    b = q.enqueue("b", after=[a])
    c = q.enqueue("c", after=[b])
    other = q.enqueue("other")
    d = q.enqueue("d", after=[other, c])
    if how == "fail":
        h = q.claim_one("w")
        assert h is not None and h.id == a
        assert h.fail("boom")
        error = "boom"
    elif how == "used_up":
        assert q.claim_one("w") is not None
        clock.advance(6)
        q.sweep_expired()
        error = "max attempts exceeded"
    else:
        clock.advance(51)
        q.sweep_expired()
        error = "expired"
    assert table.get_job(a).last_error == error  # type: ignore[union-attr]
    jb, jc, jd = (table.get_job(i) for i in (b, c, d))
    assert jb is not None and jb.state is JobState.DEAD
    assert jb.last_error == f"dependency {a} died: {error}" and jb.died_at == clock.now
    assert jc is not None and jc.state is JobState.DEAD
    assert jc.last_error == f"dependency {b} died: dependency {a} died: {error}"
    assert jd is not None and jd.state is JobState.DEAD
    assert jd.last_error is not None and jd.last_error.startswith(f"dependency {c} died:")
    assert q.stats().waiting == 0
    # The other dependency of d lives on, and its ack now releases nothing.
    h = q.claim_one("w")
    assert h is not None and h.id == other and h.ack()
    assert _state(table, d) is JobState.DEAD


def test_a_cancelled_dependency_kills_its_dependents_dep_3(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    a = q.enqueue("a", delay_s=10.0)
    b = q.enqueue("b", after=[a])
    c = q.enqueue("c", after=[b])
    assert table.cancel(a)
    jb, jc = table.get_job(b), table.get_job(c)
    assert jb is not None and jb.state is JobState.DEAD
    assert jb.last_error == f"dependency {a} was cancelled"
    assert jc is not None and jc.last_error == f"dependency {b} died: dependency {a} was cancelled"


def test_a_long_chain_dies_without_recursion_dep_3(table: JobTable) -> None:
    q = table.queue("q")
    first = prev = q.enqueue(0, delay_s=10.0)
    for i in range(3000):
        prev = q.enqueue(i, after=[prev])
    assert table.cancel(first)
    last = table.get_job(prev)
    assert last is not None and last.state is JobState.DEAD
    assert last.last_error is not None and len(last.last_error) <= 4096
    assert q.stats().waiting == 0 and q.stats().dead == 3000


def test_a_cycle_in_a_group_is_refused_and_nothing_is_stored_dep_4(table: JobTable) -> None:
    table.queue("q")
    group = [_member("q", 0, (2,)), _member("q", 1, (0,)), _member("q", 2, (1,)), _member("q", 3)]
    with pytest.raises(DependencyCycle) as caught:
        table.enqueue_group(group)
    assert caught.value.code == "dependency_cycle"
    assert caught.value.field in {"jobs[0].after", "jobs[1].after", "jobs[2].after"}
    with pytest.raises(DependencyCycle) as caught:
        table.enqueue_group([_member("q", 0, (0,))])
    assert caught.value.field == "jobs[0].after"
    assert table.queue("q").stats().totals.enqueued == 0
    assert table.queues() == ["q"]


def test_a_group_makes_a_whole_tree_at_once_dep_6(table: JobTable, clock: ManualClock) -> None:
    q = table.queue("q")
    before = q.enqueue("before")
    # A fan-out and fan-in: members named before and after the one naming them.
    ids = table.enqueue_group(
        [
            _member("q", "final", (1, 2, 3)),
            _member("q", "root", (before,)),
            _member("other", "left", (1,)),
            _member("q", "right", (1, before)),
        ]
    )
    final, root, left, right = ids
    assert [_state(table, i) for i in ids] == [JobState.WAITING] * 4
    assert table.get_job(final).after == (root, left, right)  # type: ignore[union-attr]
    assert table.get_job(right).after == (root, before)  # type: ignore[union-attr]
    done: list[str] = []
    while len(done) < 5:
        handles = _claim_all(table) + _claim_all(table, "other")
        assert handles, done
        for h in handles:
            done.append(h.id)
            assert h.ack(f'"{h.id}"'.encode())
        clock.advance(1)
    assert done.index(final) == 4 and done.index(root) == 1
    assert table.queue("other").stats().totals.enqueued == 1


def test_a_bad_member_refuses_the_whole_group_naming_it_dep_6_dep_7(table: JobTable) -> None:
    q = table.queue("q")
    a = q.enqueue("a")
    cases = [
        ([_member("q", 0), _member("q", 1, (a, "t999"))], "jobs[1].after[1]"),
        ([_member("q", 0), _member("q", 1, (5,))], "jobs[1].after[0]"),
        ([_member("q", 0), _member("q", 1, (0,), priority="x")], "jobs[1].priority"),
        ([_member("q", 0), _member("bad name!", 1, (0,))], "jobs[1].queue"),
        ([_member("q", 0, [True])], "jobs[0].after[0]"),
    ]
    for group, field in cases:
        with pytest.raises(InvalidArgument) as caught:
            table.enqueue_group(group)
        assert caught.value.field == field
    assert q.stats().totals.enqueued == 1 and table.queues() == ["q"]


def test_an_unknown_dependency_is_refused_naming_after_dep_7(table: JobTable) -> None:
    q = table.queue("q")
    a = q.enqueue("a")
    with pytest.raises(InvalidArgument) as caught:
        q.enqueue("x", after=[a, "t77"])
    assert caught.value.field == "after[1]" and caught.value.code == "invalid_argument"
    assert "completed_retention_s" in str(caught.value)
    with pytest.raises(InvalidArgument) as caught:
        q.enqueue("x", after=[3])
    assert caught.value.field == "after[0]"
    with pytest.raises(InvalidArgument) as caught:
        q.enqueue_batch([NewJob(1), NewJob(2, after=("nope",))])
    assert caught.value.field == "jobs[1].after[0]"
    with pytest.raises(InvalidArgument) as caught:
        q.enqueue("x", after="t1")  # type: ignore[arg-type]
    assert caught.value.field == "after"
    assert q.stats().totals.enqueued == 1


def test_a_dependency_dead_at_enqueue_makes_the_job_die_at_once_dep_7(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    a = q.enqueue("a")
    h = q.claim_one("w")
    assert h is not None and h.fail("nope")
    clock.advance(1)
    b = q.enqueue("b", after=[a])
    job = table.get_job(b)
    assert job is not None and job.state is JobState.DEAD
    assert job.last_error == f"dependency {a} died: nope" and job.after == (a,)
    assert q.stats().dead == 2


def test_a_deduplicated_keyed_enqueue_adds_no_edge_dep_8(table: JobTable) -> None:
    q = table.queue("q")
    a, b = q.enqueue("a"), q.enqueue("b")
    first = q.enqueue("k", key="k", after=[a])
    assert q.enqueue("k", key="k", after=[a, b]) == first
    job = table.get_job(first)
    assert job is not None and job.after == (a,) and job.waiting_for == 1
    # In a group too: members naming the deduplicated one depend on the kept job.
    ids = table.enqueue_group([_member("q", "k", (b,), key="k"), _member("q", "z", (0,))])
    assert ids[0] == first
    assert table.get_job(ids[1]).after == (first,)  # type: ignore[union-attr]
    h = q.claim_one("w")
    assert h is not None and h.id == a and h.ack()
    assert _state(table, first) is JobState.PENDING


def test_after_is_bounded_dep_9(table: JobTable) -> None:
    q = table.queue("q")
    ids = [q.enqueue(i) for i in range(MAX_AFTER + 1)]
    assert _state(table, q.enqueue("ok", after=ids[:MAX_AFTER])) is JobState.WAITING
    with pytest.raises(InvalidArgument) as caught:
        q.enqueue("x", after=ids)
    assert caught.value.field == "after"
    # A repeated id counts once.
    job = table.get_job(q.enqueue("twice", after=[ids[0], ids[0]]))
    assert job is not None and job.after == (ids[0],)


def test_a_released_job_is_ready_at_the_later_of_its_time_and_now_dep_10(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    a = q.enqueue("a")
    late = q.enqueue("late", after=[a], delay_s=100.0)
    at = q.enqueue("at", after=[a], run_at=clock.now + 5.0)
    soon = q.enqueue("soon", after=[a], delay_s=1.0)
    clock.advance(10)
    h = q.claim_one("w")
    assert h is not None and h.ack()
    assert table.get_job(late).ready_at == 1100.0  # type: ignore[union-attr]
    assert table.get_job(at).ready_at == clock.now  # type: ignore[union-attr]
    assert table.get_job(soon).ready_at == clock.now  # type: ignore[union-attr]
    stats = q.stats()
    assert (stats.ready, stats.scheduled) == (2, 1)
    assert table.next_event_at() == 1100.0


def test_released_jobs_are_claimed_by_priority_dep_11(table: JobTable, clock: ManualClock) -> None:
    q = table.queue("q")
    a = q.enqueue("a", priority=10)
    low = q.enqueue("low", after=[a], priority=1)
    high = q.enqueue("high", after=[a], priority=9)
    plain = q.enqueue("plain", priority=5)
    h = q.claim_one("w")
    assert h is not None and h.ack()
    clock.advance(1)
    assert [h.id for h in q.claim_batch("w", 3)] == [high, plain, low]


def test_a_released_job_joins_its_partition_like_a_new_one_dep_12(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    q.set_limits(Limits(partition_concurrency=1))
    a = q.enqueue("a")
    busy = q.enqueue("busy", partition="p")
    held = q.enqueue("held", partition="p", after=[a])
    free = q.enqueue("free", partition="r", after=[a])
    first = q.claim_batch("w", 5)
    assert {h.id for h in first} == {a, busy}
    assert q.stats().partitions == 0
    ha = next(h for h in first if h.id == a)
    assert ha.ack()
    assert q.stats().partitions == 2  # both released jobs wait in their keys' lines
    assert [h.id for h in q.claim_batch("w", 5)] == [free]  # p is at its limit
    hb = next(h for h in first if h.id == busy)
    assert hb.ack()
    assert [h.id for h in q.claim_batch("w", 5)] == [held]
    assert table.take_freed()  # the release told the broker of work


def test_cancelling_a_waiting_job_removes_its_edges_dep_13(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    a = q.enqueue("a")
    b = q.enqueue("b", after=[a])
    c = q.enqueue("c", after=[b])
    assert table.cancel(b)
    assert table.get_job(b) is None
    jc = table.get_job(c)
    assert jc is not None and jc.last_error == f"dependency {b} was cancelled"
    assert not table._dependents  # nothing waits on a any more
    h = q.claim_one("w")
    assert h is not None and h.ack()
    assert q.stats().waiting == 0 and q.stats().ready == 0


def test_a_waiting_job_can_expire_dep_13(table: JobTable, clock: ManualClock) -> None:
    q = table.queue("q")
    a = q.enqueue("a", delay_s=100.0)
    b = q.enqueue("b", after=[a], expires_s=10.0)
    assert table.next_event_at() == clock.now + 10.0
    clock.advance(10)
    assert q.sweep_expired().expired == 1
    job = table.get_job(b)
    assert job is not None and job.state is JobState.DEAD and job.last_error == "expired"
    # Its dependency's ack wakes nothing, but its result is kept for a redrive (DEP-5).
    clock.advance(90)
    h = q.claim_one("w")
    assert h is not None and h.id == a and h.ack(b"7")
    assert _state(table, b) is JobState.DEAD and table.dependency_results(b) == [(a, b"7")]
    assert not table._dependents


def test_redrive_of_a_dependent_waits_again_for_its_unacked_dependencies_dep_5(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    a = q.enqueue("a", max_attempts=1)
    ok = q.enqueue("ok")
    b = q.enqueue("b", after=[ok, a])
    c = q.enqueue("c", after=[b])
    for h in q.claim_batch("w", 2):
        assert h.fail("boom") if h.id == a else h.ack(b'"ok"')
    assert _state(table, b) is JobState.DEAD and _state(table, c) is JobState.DEAD
    clock.advance(1)
    # Redriven while a is still dead: b dies again at once, naming a.
    assert table.redrive(b)
    jb = table.get_job(b)
    assert jb is not None and jb.state is JobState.DEAD and jb.died_at == clock.now
    # Redrive the dependency first, then its dependents: they wait for it again.
    assert table.redrive(a) and table.redrive(b) and table.redrive(c)
    assert [_state(table, i) for i in (a, b, c)] == [
        JobState.PENDING,
        JobState.WAITING,
        JobState.WAITING,
    ]
    assert table.get_job(b).waiting_for == 1  # type: ignore[union-attr]
    clock.advance(1)
    h = q.claim_one("w")
    assert h is not None and h.id == a and h.ack(b'"a"')
    h = q.claim_one("w")
    assert h is not None and h.id == b
    assert table.dependency_results(b) == [(ok, b'"ok"'), (a, b'"a"')]
    assert h.ack(b'"b"')
    h = q.claim_one("w")
    assert h is not None and h.id == c


def test_redrive_of_a_dependent_whose_dependency_is_gone_kills_it_again_dep_5(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    a = q.enqueue("a", delay_s=10.0)
    b = q.enqueue("b", after=[a])
    assert table.cancel(a)
    clock.advance(1)
    assert table.redrive(b)
    job = table.get_job(b)
    assert job is not None and job.state is JobState.DEAD
    assert job.last_error == f"dependency {a} is gone"


def test_redrive_all_brings_back_a_failed_tree_in_death_order_dep_5(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    a = q.enqueue("a", max_attempts=1)
    b = q.enqueue("b", after=[a])
    c = q.enqueue("c", after=[b])
    h = q.claim_one("w")
    assert h is not None and h.fail("x")
    clock.advance(1)
    assert q.redrive_all() == 3
    assert [_state(table, i) for i in (a, b, c)] == [
        JobState.PENDING,
        JobState.WAITING,
        JobState.WAITING,
    ]


def test_waiting_jobs_are_listed_oldest_first_dep_1(table: JobTable, clock: ManualClock) -> None:
    q = table.queue("q")
    a = q.enqueue("a")
    waiting = []
    for i in range(5):
        waiting.append(q.enqueue(i, after=[a]))
        clock.advance(1)
    jobs, after = q.list_jobs("waiting", limit=3)
    assert [j.id for j in jobs] == waiting[:3] and after is not None
    rest, end = q.list_jobs("waiting", after=after, limit=3)
    assert [j.id for j in rest] == waiting[3:] and end is None


def _no_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every walk over a whole index fail: what a release must not do."""

    def scan(*args: object) -> Any:
        raise AssertionError("a walk over a whole index")

    monkeypatch.setattr(Heap, "entries", scan)
    monkeypatch.setattr(Ranked, "from_key", scan)
    monkeypatch.setattr(Ranked, "to_key", scan)


def test_releasing_and_dooming_dependents_costs_per_edge_not_per_job_dep_14(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = JobTable(clock=clock, id_prefix="t")
    q = table.queue("q")
    # Many jobs waiting on something else, which a release must never look at.
    blocker = q.enqueue("blocker", delay_s=1000.0)
    for i in range(5000):
        q.enqueue(i, after=[blocker])
    a = q.enqueue("a")
    b = q.enqueue("b")
    fan = [q.enqueue(i, after=[a]) for i in range(10)]
    doomed = [q.enqueue(i, after=[b]) for i in range(7)]
    woken: list[str] = []
    wake = Queue._wake

    def counted(self: Queue, row: Any, now: float) -> None:
        woken.append(table._format_id(row.seq))
        wake(self, row, now)

    monkeypatch.setattr(Queue, "_wake", counted)
    ha, hb = q.claim_batch("w", 2)
    # (The table's rows by seq cannot be walked at all: ``Rows`` has no iteration.)
    _no_scans(monkeypatch)
    assert ha.ack(b"1")
    assert sorted(woken) == sorted(fan)  # one wake per edge of a, nothing else
    assert hb.fail("no")
    assert all(_state(table, i) is JobState.DEAD for i in doomed)
    assert q.stats().waiting == 5000


def test_a_dependency_redriven_and_acked_before_its_dependents_leaves_them_its_result_dep_5(
    table: JobTable, clock: ManualClock
) -> None:
    q = table.queue("q")
    a = q.enqueue("a")
    b = q.enqueue("b", after=[a])
    h = q.claim_one("w")
    assert h is not None and h.fail("x")
    clock.advance(1)
    late = q.enqueue("late", after=[a])  # dead at once, listening to a all the same
    assert table.redrive(a)
    clock.advance(1)
    h = q.claim_one("w")
    assert h is not None and h.id == a and h.ack(b'"A"')
    assert table.get_job(a) is None  # acked and gone: its result lives on the edges
    clock.advance(1)
    assert table.redrive(b) and table.redrive(late)
    assert _state(table, b) is JobState.PENDING and _state(table, late) is JobState.PENDING
    assert table.dependency_results(b) == [(a, b'"A"')]
    assert table.dependency_results(late) == [(a, b'"A"')]
    assert not table._dependents
