"""A table rebuilt from its stored rows (``JobTable.restore``) hands out and lists its
ready jobs as the table it came from did (CLM-6, LST-1), and holds a row that has been
ready since its enqueue in its priority's line of fresh rows, as the live table did,
not in the heap: a durable broker restarted with a million waiting jobs holds them in
about the memory it held before the restart."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.broker.engine import JobTable
from tests.stored_rows import Stored


class Clock:
    """A clock a test moves by hand (one per hypothesis example)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _claim_order(table: JobTable) -> list[str]:
    out = []
    while (handle := table.queue("q").claim_one("w")) is not None:
        out.append(handle.id)
    return out


def _ready_listing(table: JobTable) -> list[str]:
    jobs, _ = table.queue("q").list_jobs("ready", limit=500)
    return [job.id for job in jobs]


def _restored(table: JobTable, clock: Clock, order: str) -> JobTable:
    stored = Stored()
    stored.write(table.take_changes())
    rows = list(stored.rows.values())
    if order == "reversed":
        rows.reverse()
    elif order == "shuffled":
        random.Random(5).shuffle(rows)
    else:
        rows.sort(key=lambda values: values[0])  # by seq, as the SQLite store reads them
    return JobTable.restore(
        stored.meta, stored.queues.values(), rows, clock=clock, rng=random.Random(2)
    )


# Each step: ("enqueue", priority, delay or None), ("claim",), ("retry", i, delay),
# ("ack", i), ("advance", seconds).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.integers(-1, 1), st.none() | st.sampled_from([0.5, 2.0])),
        st.tuples(st.just("claim")),
        st.tuples(st.just("retry"), st.integers(0, 50), st.sampled_from([0.0, 1.0])),
        st.tuples(st.just("ack"), st.integers(0, 50)),
        st.tuples(st.just("advance"), st.sampled_from([0.25, 1.0, 3.0])),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(steps=steps, order=st.sampled_from(["seq", "reversed", "shuffled"]))
def test_a_restored_table_lists_and_hands_out_its_ready_jobs_as_the_live_one(
    steps: list[tuple[Any, ...]], order: str
) -> None:
    clock = Clock()
    live = JobTable(clock=clock, rng=random.Random(1), id_prefix="t")
    live.start_journal()
    q = live.queue("q")
    held: list[Any] = []
    for step in steps:
        if step[0] == "enqueue":
            q.enqueue({"n": len(held)}, priority=step[1], delay_s=step[2])
        elif step[0] == "claim":
            handle = q.claim_one("w")
            if handle is not None:
                held.append(handle)
        elif step[0] in ("retry", "ack") and held:
            handle = held.pop(step[1] % len(held))
            if step[0] == "ack":
                handle.ack()
            else:
                handle.retry(delay_s=step[2])
        elif step[0] == "advance":
            clock.advance(step[1])
    restored = _restored(live, clock, order)
    assert restored.queue("q").stats() == q.stats()
    assert _ready_listing(restored) == _ready_listing(live)
    assert _claim_order(restored) == _claim_order(live)


def test_rows_ready_since_their_enqueue_go_back_to_the_fresh_lines() -> None:
    clock = Clock()
    live = JobTable(clock=clock, rng=random.Random(1), id_prefix="t")
    live.start_journal()
    q = live.queue("q")
    for n in range(300):
        q.enqueue(n, priority=n % 3)
    retried = q.claim_one("w")
    clock.advance(1.0)
    assert retried is not None and retried.retry(delay_s=0)  # ready again, a second later
    restored = _restored(live, clock, "seq")
    rq = restored.queue("q")
    # Only the retried row is in the heap (with its listing entry); the other 299 wait in
    # the lines, 8 bytes each, as they did in the live table.
    assert len(rq._ready) == 1
    assert rq._fresh.size == 299
    assert _ready_listing(restored)[:50] == _ready_listing(live)[:50]
    assert _claim_order(restored) == _claim_order(live)
