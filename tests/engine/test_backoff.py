"""``docs/contract.md``, "The retry curve" (RTY-1 to RTY-4), against a seeded random.Random."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

import pytest

from conveyor.broker.engine import JobTable, QueueOpts

if TYPE_CHECKING:
    from conftest import ManualClock


def retry_once(table: JobTable, clock: ManualClock, queue: str) -> tuple[int, float]:
    """Claim the queue's one job at its ready time, retry it on the curve; (attempts, delay)."""
    q = table.queue(queue)
    h = q.claim_one("w")
    assert h is not None
    now = clock()
    assert h.retry() is True
    job = q.get_job(h.id)
    assert job is not None
    clock.set(job.ready_at)
    return job.attempts, job.ready_at - now


def test_equal_jitter_numbers_with_cap(table: JobTable, clock: ManualClock) -> None:
    # Contract: RTY-2, RTY-3.
    table.queue("q", QueueOpts(backoff_base_s=2, backoff_max_s=20, max_attempts=10)).enqueue(1)
    ref = random.Random(1234)
    for attempts, exp in zip(range(1, 7), [2, 4, 8, 16, 20, 20], strict=True):
        before = clock()
        got_attempts, delay = retry_once(table, clock, "q")
        expected = exp / 2 + ref.random() * (exp / 2)
        assert got_attempts == attempts
        assert exp / 2 <= delay <= exp
        assert clock() == pytest.approx(before + expected, rel=1e-15, abs=1e-12)


def test_first_retry_on_plain_defaults_draws_from_base_half_to_base(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: RTY-3, ENQ-1.
    table.queue("q").enqueue(1)
    ref = random.Random(1234)
    before = clock()
    _, delay = retry_once(table, clock, "q")
    assert 2.5 <= delay <= 5
    assert clock() == pytest.approx(before + 2.5 + ref.random() * 2.5, rel=1e-15)


def test_curve_uses_the_jobs_stamped_backoff(table: JobTable, clock: ManualClock) -> None:
    # Contract: RTY-2, ENQ-2.
    q = table.queue("q", QueueOpts(backoff_base_s=2, backoff_max_s=20))
    q.enqueue(1, backoff_base_s=8)
    table.queue("q", QueueOpts(backoff_base_s=1, backoff_max_s=1))  # later re-opts: no effect
    ref = random.Random(1234)
    before = clock()
    retry_once(table, clock, "q")
    assert clock() == pytest.approx(before + 4 + ref.random() * 4, rel=1e-15)


def test_no_overflow_for_many_attempts(table: JobTable, clock: ManualClock) -> None:
    # Contract: RTY-4.
    q = table.queue("q", QueueOpts(backoff_base_s=0.001, backoff_max_s=0.004, max_attempts=5000))
    q.enqueue(1)
    ref = random.Random(1234)
    for attempts in range(1, 1201):  # 2 ** 1100 is beyond any float
        exp = 0.004 if attempts > 60 else min(0.004, 0.001 * 2 ** (attempts - 1))
        expected = exp / 2 + ref.random() * (exp / 2)
        got_attempts, delay = retry_once(table, clock, "q")
        assert got_attempts == attempts
        assert math.isfinite(delay)
        assert delay == pytest.approx(expected, rel=1e-6, abs=1e-9)
    job = q.get_job(q.claim_one("w").id)  # type: ignore[union-attr]
    assert job is not None
    assert job.attempts == 1201


def test_zero_base_stays_zero_for_many_attempts(table: JobTable, clock: ManualClock) -> None:
    # Contract: RTY-4.
    q = table.queue("q", QueueOpts(backoff_base_s=0, backoff_max_s=1, max_attempts=5000))
    job_id = q.enqueue(1)
    for _ in range(1100):
        now = clock()
        h = q.claim_one("w")
        assert h is not None
        assert h.retry() is True
        assert q.get_job(job_id).ready_at == now  # type: ignore[union-attr]
    assert q.get_job(job_id).attempts == 1100  # type: ignore[union-attr]


def test_exactly_one_draw_per_curve_retry(
    table: JobTable, clock: ManualClock, rng: random.Random
) -> None:
    # Contract: RTY-1.
    ref = random.Random(1234)
    q = table.queue("q", QueueOpts(max_attempts=3, visibility_timeout_s=10))
    ids = [q.enqueue(i) for i in range(4)]
    assert rng.getstate() == ref.getstate()  # enqueue draws nothing
    hs = q.claim_batch("w", 4)
    assert rng.getstate() == ref.getstate()  # claim draws nothing
    assert hs[0].heartbeat() is True
    assert hs[0].retry("e") is True  # curve: one draw
    ref.random()
    assert rng.getstate() == ref.getstate()
    assert hs[1].retry("e", delay_s=3) is True  # delay given: no draw
    assert hs[2].retry(delay_s=0) is True
    assert hs[3].ack() is True
    assert rng.getstate() == ref.getstate()
    clock.advance(10_000)
    hs = q.claim_batch("w", 3)
    assert sorted(h.id for h in hs) == sorted(ids[:3])
    assert hs[0].retry() is True
    assert hs[1].retry() is True
    ref.random()
    ref.random()
    assert rng.getstate() == ref.getstate()
    assert hs[2].fail() is True
    q.sweep_expired()
    assert rng.getstate() == ref.getstate()


def test_retry_that_dies_draws_nothing(table: JobTable, rng: random.Random) -> None:
    # Contract: RTY-1.
    ref = random.Random(1234)
    q = table.queue("q", QueueOpts(max_attempts=1))
    q.enqueue(1)
    h = q.claim_one("w")
    assert h is not None
    assert h.retry() is True
    assert q.get_job(h.id).last_error == "max attempts exceeded"  # type: ignore[union-attr]
    assert rng.getstate() == ref.getstate()


def test_seeded_curve_reproduces(clock: ManualClock) -> None:
    # Contract: RTY-1.
    def run() -> list[float]:
        c = type(clock)()
        t = JobTable(clock=c, rng=random.Random(99), id_prefix="t")
        t.queue("q", QueueOpts(max_attempts=10)).enqueue(1)
        return [retry_once(t, c, "q")[1] for _ in range(5)]

    first = run()
    assert first == run()
    assert len(set(first)) == 5
