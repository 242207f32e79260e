"""What the SDK hands to callers: job snapshots, and the outcomes a handler may raise."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ._errors import InvalidArgument

__all__ = [
    "Fail",
    "Group",
    "Job",
    "JobEvent",
    "JobInfo",
    "JobPage",
    "RateLimited",
    "Retry",
    "ScheduleInfo",
    "SchedulePage",
]


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A job as ``Client.get_job`` sees it: the fields of ``docs/contract.md`` JOB-3,
    read-only."""

    id: str
    queue: str
    # "ready", "scheduled", "processing", "completed", "dead" or "waiting" (for its
    # dependencies: docs/protocol.md, get_job)
    state: str
    payload: Any
    priority: int
    attempts: int
    max_attempts: int
    visibility_timeout_s: float
    backoff_base_s: float
    backoff_max_s: float
    enqueued_at: float
    ready_at: float
    expires_at: float | None
    worker_id: str | None
    deadline: float | None
    last_error: str | None
    died_at: float | None
    key: str | None
    timeout_s: float | None = None  # the job's own time limit (seconds), if it has one
    partition: str | None = None  # the job's partition key for flow control, if it has one
    result: Any = None  # a completed job's result (its handler's return value), if any
    completed_at: float | None = None  # when a completed job was acked
    # The latest progress its handler reported (``job.progress``), kept through a retry
    # and once completed; ``None``: none.
    progress: Any = None
    after: tuple[str, ...] = ()  # the ids of the jobs it depends on, in the order named
    waiting_for: int = 0  # how many of them are not acked yet (while waiting)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> JobInfo:
        values: dict[str, Any] = {name: data.get(name) for name in cls.__dataclass_fields__}
        values["after"] = tuple(values["after"] or ())
        values["waiting_for"] = values["waiting_for"] or 0
        return cls(**values)


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of ``Client.list_jobs``: the jobs, the cursor of the next page (``None``
    when no job of that state follows), and how many jobs the queue holds in that state
    (from the broker's counters, not the page's or a search's count)."""

    jobs: list[JobInfo]
    next: str | None
    total: int

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> JobPage:
        return cls(
            jobs=[JobInfo.from_wire(job) for job in data["jobs"]],
            next=data.get("next"),
            total=data["total"],
        )


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule as the broker keeps it (``docs/schedules.md``): its definition, as
    ``Client.set_schedule`` takes it, and where it stands.

    ``next_at`` is the tick it fires at next (Unix seconds, broker clock; ``None`` while
    paused or once its ticks have ended); ``last_at`` and ``last_job`` when it last made
    a job (the tick's time, or a run-now's) and that job's id; ``fired`` how many jobs it
    has made in all.
    """

    id: str
    queue: str
    payload: Any
    cron: str | None
    every_s: float | None
    tz: str
    start_at: float | None
    end_at: float | None
    missed: str
    max_catch_up: int
    paused: bool
    priority: int
    max_attempts: int | None
    visibility_timeout_s: float | None
    expires_s: float | None
    backoff_base_s: float | None
    timeout_s: float | None
    partition: str | None
    next_at: float | None
    last_at: float | None
    last_job: str | None
    fired: int
    created_at: float
    updated_at: float

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ScheduleInfo:
        values: dict[str, Any] = {name: data.get(name) for name in cls.__dataclass_fields__}
        return cls(**values)


@dataclass(frozen=True, slots=True)
class SchedulePage:
    """One page of ``Client.list_schedules``, in id order: the schedules, and the ``after``
    of the next page (``None`` when no schedule follows)."""

    schedules: list[ScheduleInfo]
    next: str | None


@dataclass(frozen=True, slots=True)
class JobEvent:
    """What ``Client.watch`` yields of a job (docs/protocol.md, ``job_event``).

    ``kind`` is ``"progress"`` (``progress`` is the job's latest progress; values
    reported in a row may come as their last only), ``"retry"`` (attempt ``attempt``
    ended and the job will run again: ``reason`` ``"failed"``, ``"lapsed"`` or
    ``"backed_off"``, ``error`` what the worker said) or ``"end"`` (the last event:
    ``state`` ``"completed"`` with ``result``, ``"dead"`` with ``error``,
    ``"cancelled"``, or ``"unknown"``: no such job, or one that ended and was not kept).
    """

    id: str
    kind: str
    attempt: int | None = None
    progress: Any = None
    reason: str | None = None
    error: str | None = None
    state: str | None = None
    result: Any = None

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> JobEvent:
        """A ``job_event`` push's event (an ``end`` also from a ``watch_job`` reply)."""
        return cls(
            id=data["id"],
            kind=data.get("event", "end"),
            attempt=data.get("attempt"),
            progress=data.get("progress"),
            reason=data.get("reason"),
            error=data.get("error"),
            state=data.get("state"),
            result=data.get("result"),
        )


class _Done:
    """An awaitable that is done already: what ``Job.progress`` returns, so that both
    ``job.progress(x)`` (a plain ``def`` handler) and ``await job.progress(x)`` work."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # (a generator that yields nothing: awaiting it returns at once)


_DONE = _Done()


class JobLink(Protocol):
    """What a ``Job`` asks of the worker that made it: one object per worker, shared by
    its jobs, so that handing out a job makes no closure."""

    def heartbeat(self, job: Job) -> Awaitable[bool]: ...

    def progress(self, job: Job, value: Any) -> None: ...

    def dependency_results(self, job: Job) -> Awaitable[dict[str, Any]]: ...


@dataclass(slots=True)
class Job:
    """A job handed to a worker's handler.

    ``attempt`` counts from 1; ``deadline`` is when the lease ends (broker clock, epoch
    seconds). The worker heartbeats running jobs by itself; ``await job.heartbeat()``
    extends the lease at once and answers whether it still held. ``timeout_s`` is the
    job's own time limit, given at enqueue (``None``: not set; the handler's or the
    queue's limit, if any, applies: ``docs/worker.md``). ``partition`` is the job's
    partition key for flow control (``None``: none).
    """

    id: str
    queue: str
    payload: Any
    attempt: int
    max_attempts: int
    deadline: float
    lease: str
    priority: int
    visibility_timeout_s: float
    timeout_s: float | None = None
    partition: str | None = None
    #: How many jobs it depended on (``after``); their results: ``dependency_results()``.
    dependencies: int = 0
    # The worker that handed it out (heartbeats, progress, dependencies' results go
    # through it); ``None`` for a job made by hand, as a test of a handler may make one.
    _link: JobLink | None = field(default=None, repr=False, compare=False)

    async def heartbeat(self) -> bool:
        """Extend the lease now; ``False`` when it had already lapsed (the job went on).
        A job made by hand has no lease to extend: ``False``."""
        if self._link is None:
            return False
        return await self._link.heartbeat(self)

    def progress(self, value: Any, message: str | None = None) -> Awaitable[None]:
        """Report how far the handler has got: ``value`` is any JSON value (a number
        from 0 to 1 draws the dashboard's bar), or with ``message`` the object
        ``{"value": value, "message": message}``. The job keeps the latest (get_job
        shows it) and watchers of the job are told (``Client.watch``).

        Cheap to call in a tight loop: it returns at once (``await`` it or not; a plain
        ``def`` handler on its thread calls it as it is), and the worker sends at most
        one report per job in flight and a few a second, the latest value winning, and a
        job's last value before its ack (``docs/worker.md``). Raises ``InvalidArgument``
        (field ``progress``) for a value that is not strict JSON or is over 64 KiB
        encoded (or the broker's ``max_payload_bytes`` if smaller)."""
        if message is not None:
            value = {"value": value, "message": message}
        if self._link is not None:
            self._link.progress(self, value)
        return _DONE

    async def dependency_results(self) -> dict[str, Any]:
        """The results of the jobs this one depended on (``after``), by id, in the order
        its enqueue named them: what each one's handler returned (``None`` for nothing).
        Every dependency was acked before this job was handed out (docs/contract.md,
        DEP-1, DEP-2). ``{}`` for a job with none. Fetched from the broker at each call,
        in pages that fit its frames."""
        if not self.dependencies or self._link is None:
            return {}
        return await self._link.dependency_results(self)


class Group:
    """A tree of jobs to enqueue at once, all or nothing (``Client.enqueue_group``).

    ``add`` takes ``Client.enqueue``'s arguments and returns the member's index: pass it
    in a later (or earlier) member's ``after``, beside ids of jobs already stored::

        group = Group()
        split = group.add("split", {"file": "a.csv"})
        parts = [group.add("part", i, after=[split]) for i in range(100)]
        total = group.add("sum", None, after=parts)
        ids = await client.enqueue_group(group)  # ids[total] is the last job's id

    A member whose ``key`` is taken gets that job's id and adds no dependencies; a cycle
    among members is refused (``DependencyCycle``), and so is the whole group when one
    member is bad (``InvalidArgument`` naming ``jobs[i].<field>``).
    """

    __slots__ = ("jobs",)

    def __init__(self) -> None:
        self.jobs: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self.jobs)

    def add(
        self,
        queue: str,
        payload: Any,
        *,
        after: Sequence[str | int] = (),
        priority: int = 0,
        delay_s: float | None = None,
        run_at: float | None = None,
        expires_s: float | None = None,
        visibility_timeout_s: float | None = None,
        max_attempts: int | None = None,
        backoff_base_s: float | None = None,
        key: str | None = None,
        timeout_s: float | None = None,
        partition: str | None = None,
    ) -> int:
        """Add one job; its index in the group (what ``after`` names it by). Raises
        ``InvalidArgument`` for an ``after`` that is a lone string (not a list of them)."""
        if isinstance(after, str):
            raise InvalidArgument(
                "after: must be a list of job ids and member indexes, got a string",
                field="after",
            )
        options = {
            "delay_s": delay_s,
            "run_at": run_at,
            "expires_s": expires_s,
            "visibility_timeout_s": visibility_timeout_s,
            "max_attempts": max_attempts,
            "backoff_base_s": backoff_base_s,
            "key": key,
            "timeout_s": timeout_s,
            "partition": partition,
        }
        job = {"queue": queue, "payload": payload, "priority": priority, "after": list(after)}
        job.update({name: value for name, value in options.items() if value is not None})
        self.jobs.append(job)
        return len(self.jobs) - 1


def _check_delay(delay_s: Any) -> None:
    if (
        isinstance(delay_s, bool)
        or not isinstance(delay_s, int | float)
        or not math.isfinite(delay_s)
        or delay_s < 0
    ):
        raise InvalidArgument(
            f"delay_s: must be a finite number >= 0, got {delay_s!r}", field="delay_s"
        )


class Retry(Exception):
    """Raise from a handler to retry the job: after ``delay_s``, or the broker's curve."""

    def __init__(self, delay_s: float | None = None, error: str | None = None) -> None:
        """Raises ``InvalidArgument`` for a ``delay_s`` that is not a finite number >= 0
        (an infinity would reach the broker as "no delay given"); the worker then retries
        the job on the queue's curve with that error as the job's error."""
        if delay_s is not None:
            _check_delay(delay_s)
        super().__init__(error or "retry")
        self.delay_s = delay_s
        self.error = error


class Fail(Exception):
    """Raise from a handler to dead-letter the job at once, with ``error`` as its reason."""

    def __init__(self, error: str | None = None) -> None:
        super().__init__(error or "failed")
        self.error = error


class RateLimited(Exception):
    """Raise from a handler when upstream said "slow down" (an HTTP 429): the job goes
    back to ready without spending an attempt, and the broker hands out nothing more of
    ``key`` for ``delay_s`` seconds (``docs/contract.md``, FLW-6).

    ``key`` is a partition key; ``None`` means the job's own (its queue's, when it has
    none). ``queue=True`` holds the whole queue instead. Raises ``InvalidArgument`` for a
    ``delay_s`` that is not a finite number >= 0.
    """

    def __init__(self, delay_s: float, key: str | None = None, *, queue: bool = False) -> None:
        _check_delay(delay_s)
        if key is not None and not isinstance(key, str):
            raise InvalidArgument(
                f"key: must be a string or None, got {type(key).__name__}", field="key"
            )
        super().__init__(f"rate limited for {delay_s} s")
        self.delay_s = delay_s
        self.key = key
        self.queue = queue
