"""The dashboard feed on a manual clock: rates, the hour of throughput, a worker's jobs.

A real backend (the local one, on the memory store), dispatcher and feed share one
``ManualScheduler`` (the feed's pacing clock too); a viewer is a plain object that
collects snapshots. Time moves only when a test advances it, and each ``tick()`` is
the ticker's one step, so samples fall exactly where a test puts them. The same feed
through a real server is in tests/server/test_feed.py.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from conveyor.broker.backend import Report, ready
from conveyor.broker.feed import (
    MAX_HELD_LISTED,
    MINUTE_S,
    RING_MINUTES,
    Feed,
    MinuteRing,
    QueueRates,
)

from .test_dispatch_clock import START, Rig, Worker

URL = "ws://127.0.0.1:1/ws"


class Viewer:
    """A watching connection that always keeps up."""

    caught_up = True

    def __init__(self) -> None:
        self.snapshots: list[dict[str, Any]] = []

    def push_now(self, frame: dict[str, Any]) -> None:
        self.snapshots.append(frame)


class FeedRig(Rig):
    def __init__(self, grace_s: float = 0.0) -> None:
        super().__init__(grace_s)
        clock = self.clock
        self.feed = Feed(
            self.backend,
            self.dispatcher,
            clock=clock.now,
            server_info=lambda: {"url": URL},
            monotonic=clock.now,
        )
        self.viewer = Viewer()

    def watch(self, **fields: Any) -> None:
        self.feed.watch(
            self.viewer,
            {"job": None, "worker": None, "dead_queue": None, "dead_offset": 0, "dead_limit": 20}
            | fields,
        )

    async def snapshot(self) -> dict[str, Any]:
        """The snapshot one tick sends now."""
        before = len(self.viewer.snapshots)
        await self.feed.tick()
        assert len(self.viewer.snapshots) == before + 1, "the tick sent no snapshot"
        return self.viewer.snapshots[-1]

    def complete(self, worker: Worker, n: int = 1) -> None:
        """Enqueue ``n`` jobs on ``q`` and have ``worker`` ack each."""
        for _ in range(n):
            self.enqueue()
            (job,) = worker.take()
            assert worker.ack(job)
        self.clock.run_soon()


def decode(value: Any) -> Any:
    """A snapshot member as the client reads it (shared parts are pre-encoded JSON)."""
    return orjson.loads(orjson.dumps(value))


# -- rates -----------------------------------------------------------------------------------


async def test_a_trickle_reads_as_a_steady_rate_over_the_last_minute_not_0_then_1() -> None:
    rig = FeedRig()
    worker = rig.worker("w")
    rig.watch()
    await rig.snapshot()  # the queue's first sample: the window starts here
    seen: list[float] = []
    per_second: list[float] = []
    for second in range(1, 181):
        if second % 10 == 0:
            rig.complete(worker)  # one job every 10 s
        rig.clock.advance(1.0)
        snap = await rig.snapshot()
        if second > 60:  # once the window holds a full minute
            seen.append(decode(snap["queues"])["q"]["rates"]["completed"])
            per_second += [s[2] for s in decode(snap["history"])["q"]]
    # Six jobs (or five, just after one left the window) in every minute.
    assert min(seen) >= 5 / 60
    assert max(seen) <= 6 / 59
    # The per-second history (the sparkline) is the jumpy one.
    assert set(per_second) == {0.0, 1.0}


async def test_a_rate_over_less_than_a_minute_is_over_the_time_since_the_first_sample() -> None:
    rates = QueueRates(START, (0, 0, 0, 0))
    for second in range(1, 11):
        rates.sample(START + second, (10 * second, 5 * second, 0, 0))
    assert rates.rates == pytest.approx((10.0, 5.0, 0.0, 0.0))
    assert not rates.sample(START + 10.5, (999, 999, 0, 0))  # under a second since the last
    assert rates.rates == pytest.approx((10.0, 5.0, 0.0, 0.0))


# -- the hour of throughput ------------------------------------------------------------------


def test_the_ring_counts_per_minute_and_forgets_minutes_older_than_an_hour() -> None:
    ring = MinuteRing()
    t0 = 1000 * MINUTE_S  # the start of a minute
    ring.add(t0 + 5, 3, 1)
    ring.add(t0 + 59, 2, 0)
    ring.add(t0 + 5 * MINUTE_S, 7, 2)
    assert ring.buckets() == [(t0, 5, 1), (t0 + 5 * MINUTE_S, 7, 2)]
    assert (ring.completed_1h, ring.failed_1h) == (12, 3)
    assert ring.buckets(since=1005) == [(t0 + 5 * MINUTE_S, 7, 2)]

    # Minute 0 is still in the last hour in minute 59, gone in minute 60.
    ring.add(t0 + (RING_MINUTES - 1) * MINUTE_S, 0, 0)
    assert (ring.completed_1h, ring.failed_1h) == (12, 3)
    ring.add(t0 + RING_MINUTES * MINUTE_S, 1, 0)
    assert ring.buckets() == [(t0 + 5 * MINUTE_S, 7, 2), (t0 + RING_MINUTES * MINUTE_S, 1, 0)]
    assert (ring.completed_1h, ring.failed_1h) == (8, 2)

    # After more than an hour of silence nothing is left but the new minute.
    later = t0 + 10 * RING_MINUTES * MINUTE_S
    ring.add(later, 4, 4)
    assert ring.buckets() == [(later, 4, 4)]
    assert (ring.completed_1h, ring.failed_1h) == (4, 4)
    assert sum(ring.completed) == 4 and sum(ring.failed) == 4


async def test_snapshots_carry_the_hour_of_throughput_once_then_only_the_minute_filling() -> None:
    rig = FeedRig()
    worker = rig.worker("w")
    rig.watch()
    await rig.snapshot()
    minute0 = int(rig.clock.now() // MINUTE_S) * MINUTE_S
    rig.complete(worker, 3)
    rig.clock.advance(1.0)
    snap = await rig.snapshot()
    assert decode(snap["throughput"]) == {"q": [[minute0, 3, 0]]}
    assert decode(snap["queues"])["q"]["last_hour"] == {"completed": 3, "failed": 0}

    rig.clock.advance_to(minute0 + MINUTE_S + 1)  # the next minute
    rig.complete(worker, 2)
    rig.clock.advance(1.0)
    snap = await rig.snapshot()
    # The minute the viewer saw last (it may have grown since) and the new one.
    assert decode(snap["throughput"]) == {"q": [[minute0, 3, 0], [minute0 + MINUTE_S, 2, 0]]}
    assert decode(snap["queues"])["q"]["last_hour"] == {"completed": 5, "failed": 0}
    rig.clock.advance(1.0)
    snap = await rig.snapshot()
    assert decode(snap["throughput"]) == {"q": [[minute0 + MINUTE_S, 2, 0]]}

    # A new watcher (a reloaded page) gets the whole hour.
    other = Viewer()
    rig.feed.watch(
        other, {"job": None, "worker": None, "dead_queue": None, "dead_offset": 0, "dead_limit": 1}
    )
    await rig.feed.tick()
    assert decode(other.snapshots[-1]["throughput"]) == {
        "q": [[minute0, 3, 0], [minute0 + MINUTE_S, 2, 0]]
    }


async def test_failed_in_the_ring_are_jobs_that_died_not_retries() -> None:
    rig = FeedRig()
    worker = rig.worker("w")
    rig.watch()
    await rig.snapshot()
    rig.enqueue(max_attempts=2)
    (job,) = worker.take()
    assert ready(rig.backend.report([Report(job["id"], job["lease"], retry=True, delay_s=0.0)]))
    rig.dispatcher.finished(worker.sub, job["id"], job["lease"])
    rig.clock.run_soon()
    (again,) = worker.take()
    assert ready(rig.backend.report([Report(again["id"], again["lease"], retry=False)]))
    rig.dispatcher.finished(worker.sub, again["id"], again["lease"])
    rig.clock.advance(1.0)
    snap = await rig.snapshot()
    assert decode(snap["queues"])["q"]["last_hour"] == {"completed": 0, "failed": 1}


# -- a worker's jobs -------------------------------------------------------------------------


async def test_a_followed_worker_shows_each_job_it_holds_with_when_it_started() -> None:
    rig = FeedRig()
    worker = rig.worker("w1", prefetch=3)
    first = rig.enqueue()
    rig.clock.advance(5.0)
    second = rig.enqueue()
    rig.clock.advance(5.0)
    rig.watch(worker="w1")
    snap = await rig.snapshot()
    detail = snap["worker"]
    assert detail == {
        "worker_id": "w1",
        "here": True,
        "broker": URL,
        "connections": 1,
        "held": 2,
        "jobs": [
            {"id": first, "queue": "q", "attempt": 1, "since": START, "reattached": False},
            {"id": second, "queue": "q", "attempt": 1, "since": START + 5, "reattached": False},
        ],
    }
    (listed,) = decode(snap["workers"])["list"]
    assert (listed["in_hand"], listed["oldest_since"]) == (2, START)

    jobs = {job["id"]: job for job in worker.take()}
    assert worker.ack(jobs[first])
    rig.clock.advance(1.0)
    snap = await rig.snapshot()
    assert [job["id"] for job in snap["worker"]["jobs"]] == [second]
    (listed,) = decode(snap["workers"])["list"]
    assert (listed["in_hand"], listed["oldest_since"]) == (1, START + 5)

    rig.dispatcher.unsubscribe(worker.sub)
    rig.clock.advance(1.0)
    snap = await rig.snapshot()
    assert snap["worker"] == {"worker_id": "w1", "gone": True}
    assert snap["workers"] is not None and decode(snap["workers"])["list"] == []


async def test_a_reattached_job_shows_its_queue_and_attempt_from_the_table() -> None:
    rig = FeedRig(grace_s=30.0)
    worker = rig.worker("w1")
    job_id = rig.enqueue()
    (job,) = worker.take()
    rig.dispatcher.unsubscribe(worker.sub)  # the connection dropped; the grace runs
    rig.clock.advance(10.0)
    worker.connect([(job_id, job["lease"])])
    assert worker.reattached == [job_id]
    rig.watch(worker="w1")
    snap = await rig.snapshot()
    assert snap["worker"]["jobs"] == [
        {"id": job_id, "queue": "q", "attempt": 1, "since": START + 10, "reattached": True}
    ]


async def test_a_worker_detail_lists_at_most_the_oldest_hundred_jobs() -> None:
    rig = FeedRig()
    rig.worker("big", prefetch=MAX_HELD_LISTED + 20)
    ids = []
    for _ in range(MAX_HELD_LISTED + 20):
        ids.append(rig.enqueue())
        rig.clock.advance(0.5)
    rig.watch(worker="big")
    snap = await rig.snapshot()
    detail = snap["worker"]
    assert detail["held"] == MAX_HELD_LISTED + 20
    assert [job["id"] for job in detail["jobs"]] == ids[:MAX_HELD_LISTED]


async def test_a_worker_on_another_broker_shows_what_that_broker_said() -> None:
    rig = FeedRig()
    rig.feed._others = [
        {
            "workers": {
                "total": 1,
                "list": [
                    {
                        "worker_id": "far",
                        "in_hand": 4,
                        "oldest_since": START - 9,
                        "broker": "ws://other/ws",
                    }
                ],
            }
        }
    ]
    rig.watch(worker="far")
    snap = await rig.snapshot()
    assert snap["worker"] == {
        "worker_id": "far",
        "here": False,
        "broker": "ws://other/ws",
        "held": 4,
        "oldest_since": START - 9,
        "jobs": [],
    }
