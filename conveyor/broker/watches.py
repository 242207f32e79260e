"""One connection's job watches: the ``watch_job`` op and its ``job_event`` pushes
(docs/protocol.md, "watch_job"; docs/contract.md, PRG-5 to PRG-8).

A watch answers its request with the job as it stands (or, for a job already finished
or unknown, with its end: nothing follows then), and from then on pushes what the job
does: ``progress`` (its latest reported value), ``retry`` (an attempt ended and the job
will run again) and, last, ``end`` (completed with its result, dead with its error,
cancelled), after which the watch is over. Nothing polls: the backend's ``watch`` calls
back with each event.

Progress is coalesced here (PRG-6): a job's progress events wait in a map, the latest
replacing the one before, and go out once per loop turn; while more than
``BACKLOG_BYTES`` wait unsent to this peer (a slow reader), they wait on, and only the
latest goes out once the peer has caught up. So a watcher costs at most one frame per
job per turn, and a slow one never makes an unbounded queue. A retry or an end first
sends the job's waiting progress, so a watcher sees the events in the order they
happened.

When the connection closes, ``close`` unwatches every job: nothing is left behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..sdk._wire import ErrorCode, Push, Rid, WireError, job_state, ok_reply, raw_json
from .backend import Backend, Finished, Pending, Step, WatchEvent
from .engine import Job
from .scheduler import Handle, Scheduler
from .store import StoreError
from .waits import finished_result

__all__ = ["BACKLOG_BYTES", "MAX_WATCHES", "Watches"]

log = logging.getLogger("conveyor")

#: How many jobs one connection may watch at once; one more is ``limit_exceeded``.
MAX_WATCHES = 10_000
#: While more bytes than this wait unsent to the peer, its progress events wait (the
#: latest of each job kept) and are looked at again after ``BACKLOG_RETRY_S``.
BACKLOG_BYTES = 64 * 1024
BACKLOG_RETRY_S = 0.05


class _Watch:
    __slots__ = ("early", "rid", "started")

    def __init__(self, rid: Rid) -> None:
        self.rid = rid
        self.started = False
        # Events that came before the backend answered the watch (sent after the reply).
        self.early: list[WatchEvent] = []


def _progress_frame(step: Step) -> dict[str, Any]:
    return {
        "push": Push.JOB_EVENT.value,
        "id": step.id,
        "event": "progress",
        "attempt": step.attempt,
        "progress": None if step.progress is None else raw_json(step.progress),
    }


def _retry_frame(step: Step) -> dict[str, Any]:
    return {
        "push": Push.JOB_EVENT.value,
        "id": step.id,
        "event": "retry",
        "attempt": step.attempt,
        "reason": step.reason,
        "error": step.error,
    }


def _end_frame(finished: Finished) -> dict[str, Any]:
    return {"push": Push.JOB_EVENT.value, "event": "end", **finished_result(finished)}


class Watches:
    """The job watches of one connection, at most ``limit`` at once.

    ``send(frame)`` queues a reply; ``notify(frame)`` queues a push; ``unsent()`` is how
    many bytes wait unsent to the peer.
    """

    limit = MAX_WATCHES

    def __init__(
        self,
        backend: Backend,
        scheduler: Scheduler,
        send: Callable[[dict[str, Any]], None],
        notify: Callable[[dict[str, Any]], None],
        unsent: Callable[[], int],
    ) -> None:
        self._backend = backend
        self._scheduler = scheduler
        self._send = send
        self._notify = notify
        self._unsent = unsent
        self._jobs: dict[str, _Watch] = {}
        # The latest progress of each watched job not sent yet (PRG-6).
        self._latest: dict[str, Step] = {}
        self._flush: Handle | None = None
        self._closed = False
        # The one callable given to watch and unwatch (the same object each time).
        self._callback: Callable[[WatchEvent], None] = self._on_event

    def __len__(self) -> int:
        """How many jobs are watched (or about to be)."""
        return len(self._jobs)

    def start(self, rid: Rid, job_id: str) -> None:
        """Watch ``job_id`` and answer request ``rid`` once the backend has. Raises
        ``conflict`` for a job this connection watches already, ``limit_exceeded`` when
        ``limit`` jobs are watched already (nothing is registered then)."""
        if job_id in self._jobs:
            raise WireError(
                ErrorCode.CONFLICT,
                f"id: this connection already watches job {job_id[:128]!r}",
                "id",
            )
        if len(self._jobs) >= self.limit:
            raise WireError(
                ErrorCode.LIMIT_EXCEEDED,
                f"watch_job: this connection already watches {len(self._jobs)} jobs, "
                f"the most it may (max_watches {self.limit})",
            )
        watch = _Watch(rid)
        self._jobs[job_id] = watch
        try:
            pending = self._backend.watch([job_id], self._callback)
        except BaseException:
            del self._jobs[job_id]  # refused at once (the table is unavailable)
            raise
        pending.add_done_callback(lambda came: self._watched(job_id, watch, came))

    def _watched(self, job_id: str, watch: _Watch, came: Pending[list[Job | Finished]]) -> None:
        """The backend answered: reply with the job as it stands, or with its end."""
        try:
            (known,) = came.result()
        except Exception as exc:
            if self._jobs.get(job_id) is watch:
                del self._jobs[job_id]
            if isinstance(exc, StoreError):
                log.warning("a watch could not start: %s", exc)
                error = WireError(
                    ErrorCode.UNAVAILABLE, "the job table is unavailable; try again", rid=watch.rid
                )
            else:
                log.exception("internal error starting a watch", exc_info=exc)
                error = WireError(ErrorCode.INTERNAL, "internal error", rid=watch.rid)
            if not self._closed:
                self._send(error.reply())
            return
        if self._jobs.get(job_id) is not watch:  # unwatched, or closed, meanwhile
            if isinstance(known, Job):
                self._backend.unwatch([job_id], self._callback)
            return
        if isinstance(known, Finished):
            del self._jobs[job_id]
            if watch.rid is not None:  # (fire-and-forget: no reply when it succeeds)
                self._send(ok_reply(watch.rid, {"watching": False, **finished_result(known)}))
            return
        job = known
        if watch.rid is not None:
            self._send(
                ok_reply(
                    watch.rid,
                    {
                        "watching": True,
                        "id": job_id,
                        "state": job_state(job, self._scheduler.now()),
                        "attempts": job.attempts,
                        "max_attempts": job.max_attempts,
                        "progress": None
                        if job.progress_json is None
                        else raw_json(job.progress_json),
                    },
                )
            )
        watch.started = True
        early, watch.early = watch.early, []
        for event in early:
            self._on_event(event)

    def _on_event(self, event: WatchEvent) -> None:
        """A watched job made a step, or ended (PRG-5)."""
        watch = self._jobs.get(event.id)
        if watch is None or self._closed:
            return
        if not watch.started:
            watch.early.append(event)
            return
        if isinstance(event, Finished):
            self._send_latest(event.id)
            del self._jobs[event.id]  # (the backend watches it no more)
            self._notify(_end_frame(event))
        elif event.kind == "progress":
            self._latest[event.id] = event  # the latest wins (PRG-6)
            if self._flush is None:
                self._flush = self._scheduler.call_soon(self._flush_latest)
        else:
            self._send_latest(event.id)
            self._notify(_retry_frame(event))

    def _send_latest(self, job_id: str) -> None:
        step = self._latest.pop(job_id, None)
        if step is not None:
            self._notify(_progress_frame(step))

    def _flush_latest(self) -> None:
        """Send the latest progress of each job, unless the peer is behind (then later)."""
        self._flush = None
        if self._closed or not self._latest:
            return
        if self._unsent() > BACKLOG_BYTES:
            scheduler = self._scheduler
            self._flush = scheduler.call_at(scheduler.now() + BACKLOG_RETRY_S, self._flush_latest)
            return
        latest, self._latest = self._latest, {}
        for step in latest.values():
            self._notify(_progress_frame(step))

    def stop(self, job_id: str) -> bool:
        """Stop watching ``job_id``: whether it was watched."""
        watch = self._jobs.pop(job_id, None)
        if watch is None:
            return False
        self._latest.pop(job_id, None)
        if watch.started:
            self._backend.unwatch([job_id], self._callback)
        return True

    def close(self) -> None:
        """The connection is over: unwatch every job."""
        self._closed = True
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        self._latest.clear()
        started = [job_id for job_id, watch in self._jobs.items() if watch.started]
        self._jobs.clear()
        if started:
            self._backend.unwatch(started, self._callback)
