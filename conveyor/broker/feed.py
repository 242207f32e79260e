"""The dashboard's feed: coalesced snapshots for every connection that sent ``watch``.

One ticker samples each queue's totals once a second (rates and a five-minute history)
and, four times a second while anyone watches, builds the shared part of a snapshot
once (O(queues + 200 workers): counters only, never jobs) and hands it to each viewer
whose previous snapshot has been written out, at most one per viewer per tick however
often ``watch`` wakes the ticker. A viewer that is behind is skipped, not
queued for: the next snapshot carries the latest state, so a frozen browser tab costs
one unwritten frame, never a growing buffer and never a wait (docs/protocol.md, watch).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..sdk._wire import ErrorCode, Push, WireError, encode, job_info, raw_json
from .backend import Backend
from .engine import QueueStats
from .store import StoreError

if TYPE_CHECKING:
    from .dispatch import Dispatcher

__all__ = ["Feed", "Viewer", "queue_info"]


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
MAX_WORKERS_LISTED = 200
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
        "paused": stats.paused,
        "oldest_ready_at": stats.oldest_ready_at,
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
    dead_queue: str | None = None
    dead_offset: int = 0
    dead_limit: int = 20
    history_since: float | None = None  # None: send the whole history next time
    sent_at: float | None = None  # time.monotonic() of its last snapshot; None: never


@dataclass
class _QueueRates:
    at: float
    totals: tuple[int, int, int, int]
    rates: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    history: deque[tuple[float, float, float, float, float]] = field(
        default_factory=lambda: deque(maxlen=HISTORY)
    )


class Feed:
    """Snapshots for watching connections. ``run()`` is the ticker; start it once."""

    def __init__(
        self,
        backend: Backend,
        dispatcher: Dispatcher,
        *,
        clock: Callable[[], float],
        server_info: Callable[[], dict[str, Any]],
    ) -> None:
        self.backend = backend
        self.dispatcher = dispatcher
        self.clock = clock
        self.server_info = server_info
        self._viewers: dict[Viewer, _Viewer] = {}
        self._rates: dict[str, _QueueRates] = {}
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
        mono = time.monotonic()
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
                "workers": shared_workers,
                "job": await self._job(viewer.job),
                "dead": await self._dead(viewer),
            }
            viewer.history_since = now
            viewer.sent_at = mono
            conn.push_now(frame)

    # -- the parts of a snapshot ----------------------------------------------------------

    async def _sample(self, now: float) -> dict[str, Any]:
        """Every queue's counts and rates; records a history sample once a second."""
        out: dict[str, Any] = {}
        self.latest = latest = await self.backend.stats()
        for name, stats in latest.items():
            t = stats.totals
            totals = (t.enqueued, t.completed, t.retried, t.dead)
            state = self._rates.get(name)
            if state is None:
                state = self._rates[name] = _QueueRates(now, totals)
            elif now - state.at >= SAMPLE_S:
                dt = now - state.at
                state.rates = (
                    (totals[0] - state.totals[0]) / dt,
                    (totals[1] - state.totals[1]) / dt,
                    (totals[2] - state.totals[2]) / dt,
                    (totals[3] - state.totals[3]) / dt,
                )
                state.history.append((now, *state.rates))
                state.at, state.totals = now, totals
            rates = state.rates
            out[name] = queue_info(stats)
            out[name]["rates"] = {
                "enqueued": rates[0],
                "completed": rates[1],
                "retried": rates[2],
                "dead": rates[3],
            }
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
            listed.append(
                {
                    "worker_id": sub.worker_id,
                    "queues": list(sub.queues),
                    "prefetch": sub.prefetch,
                    "in_hand": len(sub.in_flight),
                    "connected_at": getattr(owner, "connected_at", None),
                    "last_seen_at": getattr(owner, "last_seen_at", None),
                    "broker": url,
                }
            )
        return {"total": len(subs), "list": listed}

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
        stats = (await self.backend.stats([name])).get(name)
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
