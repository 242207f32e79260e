"""The waiting line of a queue: who gets its jobs, and how much of the line a pass asks.

A real backend (the local one, on the memory store) and dispatcher on one
``ManualScheduler``; each subscription collects its pushed jobs and acks none unless the
test says so. ``run_soon`` runs every pass that is due, so each check sees the dispatcher
at rest.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.broker.backend import Claim, Enqueue, LocalBackend, Pending, ready
from conveyor.broker.dispatch import Dispatcher, Subscription
from conveyor.broker.egress import Out
from conveyor.broker.scheduler import ManualScheduler
from conveyor.broker.store import MemoryStore


class CountingBackend(LocalBackend):
    """The local backend, counting the claims it is asked for (a claim is one
    subscription's request, so this is how much of a line a pass asked)."""

    claims_asked = 0

    def claim(
        self, claims: Sequence[Claim], *, round_robin: bool = False
    ) -> Pending[list[list[Any]]]:
        self.claims_asked += len(claims)
        return super().claim(claims, round_robin=round_robin)


class Rig:
    def __init__(self, kind: type[CountingBackend] = CountingBackend) -> None:
        self.clock = ManualScheduler(1_000_000.0)
        self.backend = kind(
            MemoryStore(), self.clock, max_payload_bytes=1 << 20, rng=random.Random(3),
            id_prefix="t-",
        )  # fmt: skip
        self.dispatcher = Dispatcher(self.backend, grace_s=0.0, scheduler=self.clock)
        self.got: dict[str, list[dict[str, Any]]] = {}  # worker id -> jobs pushed to it
        self.subs: dict[str, Subscription] = {}

    def subscribe(self, worker_id: str, queues: Sequence[str], prefetch: int = 1) -> None:
        jobs = self.got.setdefault(worker_id, [])

        def emit(out: Out, frame: dict[str, Any]) -> None:
            jobs.extend(frame.get("jobs", ()))

        sub = Subscription(worker_id, queues, prefetch, emit)
        self.subs[worker_id] = sub
        ready(self.dispatcher.subscribe(sub, []))
        self.clock.run_soon()

    def put(self, queue: str, n: int = 1) -> None:
        results = ready(self.backend.enqueue([Enqueue(queue, i) for i in range(n)]))
        assert all(isinstance(job_id, str) for job_id in results)

    def ack_one(self, worker_id: str) -> None:
        """Ack the oldest job ``worker_id`` holds, as its connection would."""
        sub = self.subs[worker_id]
        lease = next(iter(sub.in_flight))
        held = sub.in_flight[lease]
        assert ready(self.backend.ack([(held.id, lease)])) == [True]
        self.dispatcher.finished(sub, held.id, lease)


def test_a_few_jobs_go_one_each_to_the_first_in_a_long_line_and_no_more_is_asked() -> None:
    rig = Rig()
    for i in range(1000):
        rig.subscribe(f"w{i}", ["q"])
    rig.backend.claims_asked = 0
    rig.put("q", 3)
    rig.clock.run_soon()
    assert [len(rig.got[f"w{i}"]) for i in range(5)] == [1, 1, 1, 0, 0]
    assert sum(len(jobs) for jobs in rig.got.values()) == 3
    assert rig.backend.claims_asked == 3  # not one per worker waiting
    rig.put("q")
    rig.clock.run_soon()
    assert len(rig.got["w3"]) == 1  # the next in line
    assert rig.backend.claims_asked == 4


def test_a_worker_cut_off_the_line_still_gets_the_job_its_neighbour_took_elsewhere() -> None:
    # a takes from p before q, one job at a time. Both queues get a job in one pass. If
    # the pass looks at q's line first, it asks only a (q has one job), and a takes p's:
    # q's job must still go to b, the next in q's line. Which line a pass looks at first
    # follows the names' hashes, so 20 pairs of names make both orders all but certain.
    for i in range(20):
        p, q = f"p{i}", f"q{i}"
        rig = Rig()
        rig.subscribe("a", [p, q])
        rig.subscribe("b", [q])
        rig.put(q)
        rig.put(p)
        rig.clock.run_soon()
        assert [job["queue"] for job in rig.got["a"]] == [p]
        assert [job["queue"] for job in rig.got["b"]] == [q]


QUEUES = ["p", "q", "r"]

steps = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(QUEUES), st.integers(1, 4)),
        st.tuples(st.just("ack"), st.integers(0, 7), st.just(0)),
        st.tuples(
            st.just("subscribe"),
            st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3, unique=True),
            st.integers(1, 3),
        ),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(
    first=st.lists(
        st.tuples(
            st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3, unique=True),
            st.integers(1, 3),
        ),
        min_size=1,
        max_size=6,
    ),
    steps=steps,
)
def test_at_rest_no_worker_with_room_waits_on_a_queue_holding_a_job(
    first: list[tuple[list[str], int]], steps: list[tuple[str, Any, int]]
) -> None:
    rig = Rig()
    for i, (queues, prefetch) in enumerate(first):
        rig.subscribe(f"w{i}", queues, prefetch)
    for kind, what, n in steps:
        if kind == "put":
            rig.put(what, n)
        elif kind == "subscribe":
            rig.subscribe(f"w{len(rig.subs)}", what, n)
        else:
            holders = [w for w, sub in rig.subs.items() if sub.in_flight]
            if holders:
                rig.ack_one(holders[what % len(holders)])
        rig.clock.run_soon()
        stats = ready(rig.backend.stats())
        for worker_id, sub in rig.subs.items():
            if sub.free > 0:
                waiting = [q for q in sub.queues if q in stats and stats[q].ready > 0]
                assert not waiting, f"{worker_id} has room but {waiting} hold jobs"
    pushed = [job["id"] for jobs in rig.got.values() for job in jobs]
    assert len(pushed) == len(set(pushed))  # none pushed twice


class UnboundedBackend(CountingBackend):
    """A backend that cannot bound a queue's jobs cheaply, as a shared table's."""

    def claim_bound(self, queue: str) -> int | None:
        return None


def test_without_a_bound_a_pass_asks_part_of_the_line_and_the_next_passes_the_rest() -> None:
    rig = Rig(UnboundedBackend)
    for i in range(1000):
        rig.subscribe(f"w{i}", ["q"])
    rig.backend.claims_asked = 0
    rig.put("q", 3)
    rig.clock.run_soon()
    assert [len(rig.got[f"w{i}"]) for i in range(4)] == [1, 1, 1, 0]
    assert rig.backend.claims_asked < 1000  # one pass's share of the line, then no more
    rig.put("q", 600)
    rig.clock.run_soon()
    assert [len(rig.got[f"w{i}"]) for i in range(1000)] == [1] * 603 + [0] * 397
