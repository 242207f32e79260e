"""The dashboard's feed: coalesced snapshots for every connection that sent ``watch``.

One ticker samples each queue's totals once a second (rates over the last minute, a
five-minute history of per-second rates, an hour of per-minute throughput) and, four
times a second while anyone watches, builds the shared part of a snapshot once
(O(queues + 200 workers): counters only, never jobs) and hands it to each viewer
whose previous snapshot has been written out, at most one per viewer per tick however
often ``watch`` wakes the ticker. A viewer that is behind is skipped, not
queued for: the next snapshot carries the latest state, so a frozen browser tab costs
one unwritten frame, never a growing buffer and never a wait (docs/protocol.md, watch).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..sdk._wire import ErrorCode, Push, WireError, encode, job_info, raw_json
from .backend import Backend
from .dispatch import Held
from .engine import QueueStats
from .store import StoreError

if TYPE_CHECKING:
    from .dispatch import Dispatcher, Subscription

__all__ = ["Feed", "MinuteRing", "QueueRates", "Viewer", "queue_info"]


class Viewer(Protocol):
    """A dashboard's connection, as the feed sees it."""

    @property
    def caught_up(self) -> bool:
        """Whether every frame queued so far has gone to the socket."""
        ...

    def push_now(self, frame: dict[str, Any]) -> None:
        """Queue a frame that confirms nothing: no commit wait."""
        ...


log = logging.getLogger("conveyor.feed")

TICK_S = 0.25  # at most four snapshots a second
SAMPLE_S = 1.0  # one history sample a second
HISTORY = 300  # five minutes of samples
# ``rates`` are per second over the last minute of samples: a trickle of one job every
# few seconds reads as a steady rate, not a flicker between 0 and 1 (docs/dashboard.md).
RATE_WINDOW_S = 60.0
MINUTE_S = 60
RING_MINUTES = 60  # the throughput ring: an hour of per-minute counts per queue
MAX_WORKERS_LISTED = 200
# A worker's detail (``watch`` with ``worker``) lists at most this many of its jobs,
# the longest-running first.
MAX_HELD_LISTED = 100
# A broker on a shared table says it is alive every SAMPLE_S; one not heard from for this
# long is gone from the others' dashboards.
BROKER_TTL_S = 5.0
MAX_DEAD_LIMIT = 100
PREVIEW_CHARS = 200
# A viewer's snapshots are at least this far apart (a hair under TICK_S, so that timer
# jitter never makes a viewer skip a regular tick).
_PACE_S = TICK_S - 0.005


def queue_info(stats: QueueStats) -> dict[str, Any]:
    """A queue's object in a ``stats`` reply and in the dashboard's snapshots."""
    t = stats.totals
    return {
        "ready": stats.ready,
        "scheduled": stats.scheduled,
        "processing": stats.processing,
        "dead": stats.dead,
        "completed": stats.completed,
        "waiting": stats.waiting,
        "paused": stats.paused,
        "oldest_ready_at": stats.oldest_ready_at,
        "limited": stats.limited,
        "partitions": stats.partitions,
        "backoff_until": stats.backoff_until,
        "limits": stats.limits.as_dict(),
        "totals": {
            "enqueued": t.enqueued,
            "completed": t.completed,
            "retried": t.retried,
            "dead": t.dead,
            "expired": t.expired,
            "cancelled": t.cancelled,
        },
    }


@dataclass
class _Viewer:
    job: str | None = None
    worker: str | None = None
    dead_queue: str | None = None
    dead_offset: int = 0
    dead_limit: int = 20
    history_since: float | None = None  # None: send the whole history next time
    minutes_since: int | None = None  # None: send the whole throughput ring next time
    sent_at: float | None = None  # time.monotonic() of its last snapshot; None: never


class MinuteRing:
    """Completed and failed jobs per minute over the last hour: ``RING_MINUTES`` buckets,
    bucket ``m % RING_MINUTES`` for minute ``m`` (``t // 60`` by the broker's clock), and
    their sums. Each ``add`` costs O(1): a bucket is zeroed when its minute comes round
    again (at most ``RING_MINUTES`` of them after a long gap), and the sums follow."""

    __slots__ = ("completed", "completed_1h", "failed", "failed_1h", "minute")

    def __init__(self) -> None:
        self.minute: int | None = None  # the newest bucket's minute
        self.completed = [0] * RING_MINUTES
        self.failed = [0] * RING_MINUTES
        self.completed_1h = 0  # the sums over the ring
        self.failed_1h = 0

    def add(self, now: float, completed: int, failed: int) -> None:
        """Count ``completed`` and ``failed`` jobs at time ``now`` (``0, 0`` only moves the
        ring on, so that minutes older than an hour leave the sums)."""
        minute = int(now // MINUTE_S)
        if self.minute is None:
            self.minute = minute
        elif minute > self.minute:
            for m in range(self.minute + 1, min(minute, self.minute + RING_MINUTES) + 1):
                i = m % RING_MINUTES
                self.completed_1h -= self.completed[i]
                self.failed_1h -= self.failed[i]
                self.completed[i] = self.failed[i] = 0
            self.minute = minute
        # (a clock that stepped back counts into the newest minute: no bucket is reused)
        i = self.minute % RING_MINUTES
        self.completed[i] += completed
        self.failed[i] += failed
        self.completed_1h += completed
        self.failed_1h += failed

    def buckets(self, since: int | None = None) -> list[tuple[int, int, int]]:
        """``(minute start, completed, failed)`` of each minute from ``since`` (a minute
        number; ``None``: the whole hour) to the newest, oldest first; empty minutes left
        out."""
        newest = self.minute
        if newest is None:
            return []
        first = newest - RING_MINUTES + 1
        if since is not None:
            first = max(first, since)
        out = []
        for m in range(first, newest + 1):
            i = m % RING_MINUTES
            if self.completed[i] or self.failed[i]:
                out.append((m * MINUTE_S, self.completed[i], self.failed[i]))
        return out


Totals = tuple[int, int, int, int]  # enqueued, completed, retried, dead


@dataclass
class QueueRates:
    """One queue's samples: the rates over the last ``RATE_WINDOW_S``, the history of
    per-second rates, the hour of per-minute throughput. ``sample`` once a second."""

    at: float
    totals: Totals
    rates: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    history: deque[tuple[float, float, float, float, float]] = field(
        default_factory=lambda: deque(maxlen=HISTORY)
    )
    # (time, totals) of the samples in the rate window, oldest first; the first is the
    # window's start (the queue's first sample until a minute has passed).
    window: deque[tuple[float, Totals]] = field(default_factory=deque)
    ring: MinuteRing = field(default_factory=MinuteRing)

    def __post_init__(self) -> None:
        self.window.append((self.at, self.totals))

    def sample(self, now: float, totals: Totals) -> bool:
        """Take a sample of ``totals`` at ``now`` if ``SAMPLE_S`` has passed since the last
        one (whether one was taken). O(1): one history entry, one ring bucket, the window
        moved on by a sample or two."""
        dt = now - self.at
        if dt < SAMPLE_S:
            return False
        last = self.totals
        self.history.append(
            (
                now,
                (totals[0] - last[0]) / dt,
                (totals[1] - last[1]) / dt,
                (totals[2] - last[2]) / dt,
                (totals[3] - last[3]) / dt,
            )
        )
        # Failed: jobs that died (dead-lettered), not attempts that will be retried.
        self.ring.add(now, max(0, totals[1] - last[1]), max(0, totals[3] - last[3]))
        window = self.window
        window.append((now, totals))
        while now - window[0][0] > RATE_WINDOW_S:
            window.popleft()
        start, base = window[0]
        span = now - start
        if span > 0:
            self.rates = (
                (totals[0] - base[0]) / span,
                (totals[1] - base[1]) / span,
                (totals[2] - base[2]) / span,
                (totals[3] - base[3]) / span,
            )
        self.at, self.totals = now, totals
        return True


class Feed:
    """Snapshots for watching connections. ``run()`` is the ticker; start it once."""

    def __init__(
        self,
        backend: Backend,
        dispatcher: Dispatcher,
        *,
        clock: Callable[[], float],
        server_info: Callable[[], dict[str, Any]],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock`` is the backend's (snapshot times, samples); ``monotonic`` paces each
        viewer's snapshots (tests pass a manual one for both)."""
        self.backend = backend
        self.dispatcher = dispatcher
        self.clock = clock
        self.monotonic = monotonic
        self.server_info = server_info
        self._viewers: dict[Viewer, _Viewer] = {}
        self._rates: dict[str, QueueRates] = {}
        self._wake = asyncio.Event()
        # This broker's id on a shared table, and what the other brokers said of
        # themselves at the last sample (their workers, for the dashboard).
        self.broker_id = secrets.token_hex(8)
        self._others: list[dict[str, Any]] = []
        self._announced_at: float | None = None
        # Every queue's stats at the last sample (``/metrics`` of a backend that answers
        # later reads these rather than wait for the database).
        self.latest: Mapping[str, QueueStats] = {}

    # -- viewers --------------------------------------------------------------------------

    def watch(self, conn: Viewer, fields: dict[str, Any]) -> None:
        """Start (or change) what ``conn`` follows. Raises ``WireError`` for a bad page."""
        offset, limit = fields["dead_offset"], fields["dead_limit"]
        if offset < 0:
            raise WireError(
                ErrorCode.INVALID_ARGUMENT,
                f"dead_offset: must be >= 0, got {offset}",
                "dead_offset",
            )
        if not 1 <= limit <= MAX_DEAD_LIMIT:
            raise WireError(
                ErrorCode.INVALID_ARGUMENT,
                f"dead_limit: must be 1 to {MAX_DEAD_LIMIT}, got {limit}",
                "dead_limit",
            )
        viewer = self._viewers.get(conn)
        if viewer is None:
            viewer = self._viewers[conn] = _Viewer()
        viewer.job = fields["job"]
        viewer.worker = fields["worker"]
        viewer.dead_queue = fields["dead_queue"]
        viewer.dead_offset = offset
        viewer.dead_limit = limit
        self._wake.set()

    def forget(self, conn: Viewer) -> None:
        """The connection closed."""
        self._viewers.pop(conn, None)

    # -- the ticker -----------------------------------------------------------------------

    async def run(self) -> None:
        """Sample and publish until cancelled: every 0.25 s while anyone watches (a new
        ``watch`` is answered at once), every second otherwise (history only)."""
        while True:
            try:
                await self.tick()
            except StoreError as exc:  # the table cannot answer now: the next tick may
                log.warning("feed tick failed: %s", exc)
            except Exception:  # a bug here must not end the feed
                log.exception("feed tick failed")
            self._wake.clear()
            pause = TICK_S if self._viewers else SAMPLE_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), pause)

    async def tick(self) -> None:
        """Take a sample when one is due, then send each viewer that keeps up a snapshot."""
        now = self.clock()
        queues = await self._sample(now)
        if self.backend.shared and (
            self._announced_at is None or not 0 <= now - self._announced_at < SAMPLE_S
        ):
            self._announced_at = now
            self._others = await self.backend.announce(
                self.broker_id, self._presence(), BROKER_TTL_S
            )
        if not self._viewers:
            return
        # Each viewer gets at most one snapshot per TICK_S, however often the ticker is
        # woken (a `watch` wakes it, and any viewer may send many): a re-watch is served
        # at once when its viewer is due, else at the next tick. A viewer that is behind
        # is skipped: the next snapshot carries the latest state.
        mono = self.monotonic()
        due = [
            (conn, viewer)
            for conn, viewer in self._viewers.items()
            if conn.caught_up
            and (viewer.sent_at is None or not 0 <= mono - viewer.sent_at < _PACE_S)
        ]
        if not due:
            return
        shared_queues = raw_json(encode(queues))
        shared_server = raw_json(encode({**self.server_info(), "brokers": 1 + len(self._others)}))
        shared_workers = raw_json(encode(self._cluster_workers()))
        for conn, viewer in due:
            frame = {
                "push": Push.SNAPSHOT.value,
                "at": now,
                "server": shared_server,
                "queues": shared_queues,
                "history": self._history(viewer),
                "throughput": self._throughput(viewer),
                "workers": shared_workers,
                "worker": await self._worker(viewer.worker),
                "job": await self._job(viewer.job),
                "dead": await self._dead(viewer),
            }
            viewer.history_since = now
            viewer.minutes_since = int(now // MINUTE_S)
            viewer.sent_at = mono
            conn.push_now(frame)

    # -- the parts of a snapshot ----------------------------------------------------------

    async def _sample(self, now: float) -> dict[str, Any]:
        """Every queue's counts, rates and last hour; samples once a second."""
        out: dict[str, Any] = {}
        self.latest = latest = await self.backend.stats()
        for name, stats in latest.items():
            t = stats.totals
            totals = (t.enqueued, t.completed, t.retried, t.dead)
            state = self._rates.get(name)
            if state is None:
                state = self._rates[name] = QueueRates(now, totals)
            else:
                state.sample(now, totals)
            rates = state.rates
            info = out[name] = queue_info(stats)
            info["rates"] = {
                "enqueued": rates[0],
                "completed": rates[1],
                "retried": rates[2],
                "dead": rates[3],
            }
            info["last_hour"] = {
                "completed": state.ring.completed_1h,
                "failed": state.ring.failed_1h,
            }
        for name in [name for name in self._rates if name not in latest]:
            del self._rates[name]  # (a queue that is gone)
        return out

    def _history(self, viewer: _Viewer) -> dict[str, list[tuple[float, ...]]]:
        since = viewer.history_since
        out: dict[str, list[tuple[float, ...]]] = {}
        for name, state in self._rates.items():
            samples: list[tuple[float, ...]] = [
                s for s in state.history if since is None or s[0] > since
            ]
            if samples:
                out[name] = samples
        return out

    def _throughput(self, viewer: _Viewer) -> dict[str, list[tuple[int, int, int]]]:
        """Per queue, the ring's minutes the viewer has not seen in full: the whole hour
        the first time, then the minute filling now (and one that just closed)."""
        since = viewer.minutes_since
        out: dict[str, list[tuple[int, int, int]]] = {}
        for name, state in self._rates.items():
            buckets = state.ring.buckets(since)
            if buckets:
                out[name] = buckets
        return out

    def _presence(self) -> dict[str, Any]:
        """What this broker tells the others of itself (``Backend.announce``)."""
        return {"server": self.server_info(), "workers": self._workers()}

    def _cluster_workers(self) -> dict[str, Any]:
        """This broker's workers and those the other brokers on its table said they
        have (as of their last second), each with the URL of the broker it is on."""
        mine = self._workers()
        if not self._others:
            return mine
        total = mine["total"]
        listed = list(mine["list"])
        for other in self._others:
            workers = other.get("workers")
            if not isinstance(workers, dict):
                continue
            count = workers.get("total")
            total += count if isinstance(count, int) else 0
            for entry in workers.get("list") or ():
                if isinstance(entry, dict) and len(listed) < MAX_WORKERS_LISTED:
                    listed.append(entry)
        return {"total": total, "list": listed}

    def _workers(self) -> dict[str, Any]:
        subs = self.dispatcher.subscriptions
        listed: list[dict[str, Any]] = []
        url = self.server_info().get("url")
        for sub in subs:
            if len(listed) >= MAX_WORKERS_LISTED:
                break
            owner = sub.owner
            # The first lease in the window is the oldest (they are kept in arrival order).
            oldest = next(iter(sub.in_flight.values()), None)
            listed.append(
                {
                    "worker_id": sub.worker_id,
                    "queues": list(sub.queues),
                    "prefetch": sub.prefetch,
                    "in_hand": len(sub.in_flight),
                    "oldest_since": None if oldest is None else oldest.since,
                    "connected_at": getattr(owner, "connected_at", None),
                    "last_seen_at": getattr(owner, "last_seen_at", None),
                    "broker": url,
                }
            )
        return {"total": len(subs), "list": listed}

    async def _worker(self, worker_id: str | None) -> dict[str, Any] | None:
        """The followed worker's jobs, as this broker knows them: every connection of it
        here, its ``MAX_HELD_LISTED`` longest-running jobs. A worker connected to another
        broker of the table: what that broker told of it (no jobs); one gone: ``gone``.
        Costs O(its connections x MAX_HELD_LISTED), never O(workers)."""
        if worker_id is None:
            return None
        subs = self.dispatcher.by_worker.get(worker_id)
        if not subs:
            for other in self._others:
                workers = other.get("workers")
                for entry in (workers.get("list") or ()) if isinstance(workers, dict) else ():
                    if isinstance(entry, dict) and entry.get("worker_id") == worker_id:
                        return {
                            "worker_id": worker_id,
                            "here": False,
                            "broker": entry.get("broker"),
                            "held": entry.get("in_hand"),
                            "oldest_since": entry.get("oldest_since"),
                            "jobs": [],
                        }
            return {"worker_id": worker_id, "gone": True}
        return {
            "worker_id": worker_id,
            "here": True,
            "broker": self.server_info().get("url"),
            "connections": len(subs),
            "held": sum(len(sub.in_flight) for sub in subs),
            "jobs": await self._held_jobs(subs),
        }

    async def _held_jobs(self, subs: Mapping[Subscription, None]) -> list[dict[str, Any]]:
        each = (itertools.islice(sub.in_flight.values(), MAX_HELD_LISTED) for sub in subs)
        held: list[Held] = heapq.nsmallest(
            MAX_HELD_LISTED, itertools.chain.from_iterable(each), key=lambda h: h.since
        )
        # A re-attached lease came without its queue and attempt: the table has them.
        unknown = [h.id for h in held if h.queue is None]
        found = {}
        if unknown:
            found = {job.id: job for job in await self.backend.get_jobs(unknown) if job is not None}
        out = []
        for h in held:
            queue, attempt = h.queue, h.attempt
            job = found.get(h.id)
            if job is not None:
                queue, attempt = job.queue, job.attempts
            out.append(
                {
                    "id": h.id,
                    "queue": queue,
                    "attempt": attempt,
                    "since": h.since,
                    "reattached": h.reattached,
                }
            )
        return out

    async def _job(self, job_id: str | None) -> dict[str, Any] | None:
        if job_id is None:
            return None
        (job,) = await self.backend.get_jobs([job_id])
        return {"id": job_id, "gone": True} if job is None else job_info(job, self.backend.now())

    async def _dead(self, viewer: _Viewer) -> dict[str, Any] | None:
        name = viewer.dead_queue
        if name is None:
            return None
        page: dict[str, Any] = {
            "queue": name,
            "offset": viewer.dead_offset,
            "limit": viewer.dead_limit,
            "total": 0,
            "jobs": [],
        }
        stats = self.latest.get(name)  # (this tick's, as the snapshot's queues)
        if stats is None:
            return page
        page["total"] = stats.dead
        dead = await self.backend.dead_jobs(name, viewer.dead_offset, viewer.dead_limit)
        page["jobs"] = [
            {
                "id": job.id,
                "last_error": job.last_error,
                "attempts": job.attempts,
                "died_at": job.died_at,
                "payload_preview": job.payload_json[: PREVIEW_CHARS * 4].decode("utf-8", "replace")[
                    :PREVIEW_CHARS
                ],
            }
            for job in dead
        ]
        return page
