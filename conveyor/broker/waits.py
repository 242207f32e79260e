"""One connection's waits for jobs to finish: the ``wait`` op (docs/protocol.md, "wait").

A wait is answered when its job finishes (completed, dead or cancelled), at once when the
job has already finished (or is unknown), or when its ``timeout_s`` passes first (then
with the job's state at that moment). Nothing polls: the backend's ``follow`` calls back
when a followed job finishes, and each wait has one timer on the broker's ``Scheduler``.

A wait's reply does not keep its place in the connection's order of replies: it is sent
when it is ready, and the replies to later requests may overtake it (the peer matches
replies by ``rid``). Every frame is still queued through the connection (``send``), so it
leaves only once what changed before it is durable.

When the connection closes, ``close`` cancels every timer and unfollows every job: a
closed connection leaves nothing behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..sdk._wire import ErrorCode, Rid, WireError, ok_reply, raw_json
from .backend import Backend, Finished, Pending
from .scheduler import Handle, Scheduler
from .store import StoreError

__all__ = ["MAX_WAITS", "Waits", "finished_result"]

log = logging.getLogger("conveyor")

#: How many waits one connection may have at once; one more is ``limit_exceeded``.
MAX_WAITS = 10_000


class _Waiter:
    __slots__ = ("job_id", "rid", "timer")

    def __init__(self, rid: Rid, job_id: str) -> None:
        self.rid = rid
        self.job_id = job_id
        self.timer: Handle | None = None


def finished_result(finished: Finished) -> dict[str, Any]:
    """The members of a ``wait`` reply for a job that finished (or is unknown):
    ``{id, state}``, with ``result`` when completed and ``error`` when dead."""
    reply: dict[str, Any] = {"id": finished.id, "state": finished.state}
    if finished.state == "completed":
        reply["result"] = None if finished.result_json is None else raw_json(finished.result_json)
    elif finished.state == "dead":
        reply["error"] = finished.error
    return reply


class Waits:
    """The waits of one connection, at most ``limit`` at once.

    ``send(frame)`` queues a reply frame on the connection. Every wait ends exactly once:
    answered when its job finishes, when its time is up, or dropped by ``close``.
    """

    limit = MAX_WAITS

    def __init__(
        self, backend: Backend, scheduler: Scheduler, send: Callable[[dict[str, Any]], None]
    ) -> None:
        self._backend = backend
        self._scheduler = scheduler
        self._send = send
        # Waiters by job id; a job is followed while it has waiters.
        self._by_job: dict[str, list[_Waiter]] = {}
        self._count = 0
        self._closed = False
        # The one callable given to follow and unfollow (the same object each time).
        self._callback: Callable[[Finished], None] = self._on_finished

    def __len__(self) -> int:
        """How many waits are open."""
        return self._count

    def start(self, rid: Rid, job_id: str, timeout_s: float) -> None:
        """Wait for ``job_id`` to finish, for at most ``timeout_s`` seconds, then send the
        reply to request ``rid``. Raises ``limit_exceeded`` when ``limit`` waits are open
        already (nothing is registered then)."""
        if self._count >= self.limit:
            raise WireError(
                ErrorCode.LIMIT_EXCEEDED,
                f"wait: this connection already waits for {self._count} jobs, "
                f"the most it may (max_waits {self.limit})",
            )
        waiter = _Waiter(rid, job_id)
        self._count += 1
        scheduler = self._scheduler
        waiter.timer = scheduler.call_at(scheduler.now() + timeout_s, self._timed_out, waiter)
        waiters = self._by_job.get(job_id)
        if waiters is not None:
            waiters.append(waiter)  # the job is followed already
            return
        self._by_job[job_id] = [waiter]
        try:
            followed = self._backend.follow([job_id], self._callback)
        except BaseException:
            self._take(job_id)  # refused at once (the table is unavailable): no wait left
            raise
        followed.add_done_callback(lambda came: self._followed(job_id, came))

    def _followed(self, job_id: str, came: Pending[list[Finished | None]]) -> None:
        """``follow`` answered: a job already finished (or unknown) ends its waits now."""
        try:
            (known,) = came.result()
        except StoreError as exc:
            log.warning("a wait could not follow its job: %s", exc)
            self._refuse_all(job_id)
            return
        except Exception:
            log.exception("internal error following a job for a wait")
            self._refuse_all(job_id, internal=True)
            return
        if known is not None:
            self._on_finished(known)
        elif job_id not in self._by_job:
            # Its waits ended (timed out, or the connection closed) before the job table
            # answered: the follow it made then is not wanted.
            self._backend.unfollow([job_id], self._callback)

    def _refuse_all(self, job_id: str, *, internal: bool = False) -> None:
        """End ``job_id``'s waits with an error reply (the job table failed them)."""
        for waiter in self._take(job_id):
            if internal:
                error = WireError(ErrorCode.INTERNAL, "internal error", rid=waiter.rid)
            else:
                error = WireError(
                    ErrorCode.UNAVAILABLE,
                    "the job table is unavailable; try again",
                    rid=waiter.rid,
                )
            self._send(error.reply())

    def _on_finished(self, finished: Finished) -> None:
        """A followed job finished: answer each of its waits."""
        waiters = self._take(finished.id, unfollow=False)
        if not waiters:
            return
        result = finished_result(finished)
        for waiter in waiters:
            self._send(ok_reply(waiter.rid, result))

    def _take(self, job_id: str, *, unfollow: bool = False) -> list[_Waiter]:
        """Remove every wait for ``job_id`` (timers cancelled) and return them."""
        waiters = self._by_job.pop(job_id, None)
        if not waiters:
            return []
        for waiter in waiters:
            if waiter.timer is not None:
                waiter.timer.cancel()
                waiter.timer = None
        self._count -= len(waiters)
        if unfollow:
            self._backend.unfollow([job_id], self._callback)
        return waiters

    def _timed_out(self, waiter: _Waiter) -> None:
        """``waiter``'s time is up first: it ends with the job's state now."""
        waiter.timer = None
        waiters = self._by_job.get(waiter.job_id)
        if waiters is None or waiter not in waiters:
            return
        waiters.remove(waiter)
        self._count -= 1
        if not waiters:
            del self._by_job[waiter.job_id]
            self._backend.unfollow([waiter.job_id], self._callback)
        looked = self._backend.get_jobs([waiter.job_id])
        looked.add_done_callback(lambda came: self._answer_state(waiter, came))

    def _answer_state(self, waiter: _Waiter, came: Pending[list[Any]]) -> None:
        """Answer a timed-out wait with what the job is now."""
        if self._closed:
            return
        try:
            (job,) = came.result()
        except StoreError as exc:
            log.warning("a wait could not read its job: %s", exc)
            self._send(
                WireError(
                    ErrorCode.UNAVAILABLE, "the job table is unavailable; try again", rid=waiter.rid
                ).reply()
            )
            return
        except Exception:
            log.exception("internal error reading a job for a wait")
            self._send(WireError(ErrorCode.INTERNAL, "internal error", rid=waiter.rid).reply())
            return
        if job is None:
            reply: dict[str, Any] = {"id": waiter.job_id, "state": "unknown"}
        else:
            state = str(job.state)
            reply = finished_result(
                Finished(job.id, job.queue, state, job.result_json, job.last_error)
            )
        self._send(ok_reply(waiter.rid, reply))

    def close(self) -> None:
        """The connection is over: drop every wait, unanswered, and unfollow its jobs."""
        self._closed = True
        for job_id in list(self._by_job):
            self._take(job_id, unfollow=True)
