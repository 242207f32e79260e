"""``next_event_at()`` keeps a heap of each queue's next event and looks again only at the
queues that changed. Here it is compared with a look at every queue, after every step of
random work over many queues (``docs/contract.md``, TIM-4)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.broker.engine import JobHandle, JobTable, QueueOpts

NAMES = [f"q{i}" for i in range(6)]

STEP = st.one_of(
    st.tuples(
        st.just("enqueue"),
        st.sampled_from(NAMES),
        st.sampled_from([None, 0.0, 0.5, 3.0]),  # delay_s
        st.sampled_from([None, 1.0, 4.0]),  # expires_s
        st.sampled_from([None, 0.5, 2.0]),  # visibility_timeout_s
        st.sampled_from([1, 2]),  # max_attempts
    ),
    st.tuples(st.just("claim"), st.sampled_from(NAMES), st.integers(1, 3)),
    st.tuples(st.just("ack"), st.integers(0, 50)),
    st.tuples(st.just("retry"), st.integers(0, 50), st.sampled_from([None, 0.0, 1.5])),
    st.tuples(st.just("fail"), st.integers(0, 50)),
    st.tuples(st.just("heartbeat"), st.integers(0, 50)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("time"), st.sampled_from([0.1, 0.5, 1.0, 2.5])),
    st.tuples(st.just("sweep")),
    st.tuples(st.just("retention"), st.sampled_from(NAMES), st.sampled_from([None, 1.0, 5.0])),
    st.tuples(st.just("ask")),
)


def every_queue(table: JobTable) -> float | None:
    """The earliest next event, looking at every queue (what the heap spares)."""
    now = table._now()
    times = [t for name in table.queues() if (t := table.queue(name)._next_event_at(now))]
    return min(times) if times else None


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, max_size=60), st.integers(0, 2**32 - 1))
def test_next_event_at_agrees_with_a_look_at_every_queue(steps: list[tuple], seed: int) -> None:
    # Contract: TIM-4.
    now = [1000.0]
    table = JobTable(clock=lambda: now[0], rng=random.Random(seed), id_prefix="t")
    handles: list[JobHandle] = []
    for step in steps:
        kind = step[0]
        if kind == "enqueue":
            _, name, delay, expires, vis, attempts = step
            table.queue(name).enqueue(
                "x", delay_s=delay, expires_s=expires, visibility_timeout_s=vis,
                max_attempts=attempts,
            )  # fmt: skip
        elif kind == "claim":
            handles += table.queue(step[1]).claim_batch("w", step[2])
        elif kind == "time":
            now[0] += step[1]
        elif kind == "sweep":
            table.sweep_expired()
        elif kind == "retention":
            table.queue(step[1], QueueOpts(dead_letter_retention_s=step[2]))
        elif kind == "ask":
            table.next_event_at()  # asking between changes must not change the answers
        elif handles:
            h = handles[step[1] % len(handles)]
            if kind == "ack":
                h.ack()
            elif kind == "retry":
                h.retry("again", delay_s=step[2])
            elif kind == "fail":
                h.fail("no")
            elif kind == "heartbeat":
                h.heartbeat()
            else:
                table.cancel(h.id)
        got = table.next_event_at()
        want = every_queue(table)
        if want is not None and want <= now[0]:
            assert got is not None and got <= now[0], (got, want, now[0])  # a sweep is due
        else:
            assert got == want, (got, want, now[0])


def test_a_retention_set_later_is_an_event_at_once() -> None:
    # Contract: TIM-4.
    now = [1000.0]
    table = JobTable(clock=lambda: now[0], rng=random.Random(1), id_prefix="t")
    q = table.queue("q")
    q.enqueue("x", max_attempts=1)
    h = q.claim_one("w")
    assert h is not None and h.fail("no")
    assert table.next_event_at() is None  # dead, kept for ever
    table.queue("q", QueueOpts(dead_letter_retention_s=5.0))
    assert table.next_event_at() == 1005.0


def test_a_matured_job_is_no_event_even_unasked() -> None:
    # Contract: TIM-4.
    now = [1000.0]
    table = JobTable(clock=lambda: now[0], rng=random.Random(1), id_prefix="t")
    table.queue("a").enqueue("soon", delay_s=0.5)
    table.queue("b").enqueue("later", delay_s=9.0)
    assert table.next_event_at() == 1000.5
    now[0] = 1001.0  # nothing touched the queues since: "a"'s event came due by itself
    assert table.next_event_at() == 1009.0
