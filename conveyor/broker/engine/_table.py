"""The job table: every state transition of ``docs/contract.md``, in this one module.

Theory of operation
-------------------
A ``JobTable`` owns its queues and an index of every live row by sequence number (a
job's id is the table's prefix followed by its ``seq`` in hex, so the index needs no
strings). Each ``Queue`` keeps its rows in exactly one place per state:

* ``_fresh`` and ``_ready``: everything a claim may take. ``_fresh`` holds jobs that
  were ready when enqueued, one first-in-first-out line per priority (arrival order is
  claim order there: see ``Fifo``); ``_ready`` is a heap keyed ``(-priority, ready
  time, seq)`` of the rest: retried, redriven and matured pending rows, and processing
  rows whose lease has lapsed (their ready time is the lapsed ``deadline``: CLM-6). A
  claim takes the smaller head of the two.
* ``_scheduled``: a heap keyed ``(ready_at, seq)`` of pending rows not yet ready.
* ``_leases``: processing rows keyed ``(deadline, seq)``, in a ``Line`` (a heap with
  a first-in-first-out fast lane for deadlines that come in order, as those of one
  visibility timeout do). A heartbeat only moves ``row.deadline`` later; the entry is
  re-keyed lazily when it reaches the top, so a heartbeat is O(1).
* ``_expiry``: a heap keyed ``(expires_at, seq)`` of live rows that can expire.
* ``_dead``: dead rows in the order they died (the clock never goes backwards, so
  this is ``died_at`` order), which makes retention a walk from the front.
* ``_completed``: acked rows a queue keeps (``completed_retention_s``, RES-3) in the
  order they were acked, which makes their retention a walk from the front, as ``_dead``.
* ``_exhausted``: lapsed rows whose attempts are used up. They sit in ``_ready`` so
  that a claim meets them in order, and here so that a sweep finds them without a scan.

Nothing moves on its own. Every public operation reads the injected clock once and
first calls ``_advance(now)``, which moves matured scheduled rows and lapsed leases
into ``_ready``, each exactly once (CST-2). Counters change with every transition, so
``stats()`` never walks rows (CST-4). Removal from a heap is lazy (see ``_heap``).

A job followed (``watch``, RES-5) has its seq in ``_watched``; where a job finishes (an
ack, a death, a delete of a live row) a ``Finish`` is queued for ``take_finished()`` when
its seq is there. With nothing watched, the test is one truth test of an empty set.

Schedules (SCH-1 on) are kept by ``_schedules.Schedules``, which the table's schedule
methods call: un-paused ones in a heap by next tick, whose top ``next_event_at()`` reads
beside the queues' events; ``fire_schedules()`` enqueues the due ticks' jobs here, through
``Queue``, in the same journal as the schedules' progress.
"""

from __future__ import annotations

import json
import random
import secrets
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from heapq import merge
from typing import Any, Generic, NamedTuple, TypeVar, overload

from . import _guards as guard
from ._errors import DependencyCycle, InvalidArgument
from ._flow import NEVER as _NEVER
from ._flow import Flow, Part
from ._heap import IN_FIFO, Fifo, Heap, Line, Log, Ranked
from ._rows import Rows
from ._schedule import ScheduleInfo, ScheduleSpec
from ._schedules import Schedules
from ._types import (
    LIMIT_FIELDS,
    Job,
    JobState,
    Limits,
    NewJob,
    QueueOpts,
    QueueStats,
    QueueTotals,
    SweepResult,
)

__all__ = [
    "DEP_FIELDS",
    "LIST_STATES",
    "MAX_PROGRESS_BYTES",
    "SEARCH_SCAN",
    "Finish",
    "JobHandle",
    "JobTable",
    "Queue",
    "Step",
    "check_list_key",
    "lease_number",
]

PENDING = JobState.PENDING
PROCESSING = JobState.PROCESSING
DEAD = JobState.DEAD
COMPLETED = JobState.COMPLETED
WAITING = JobState.WAITING
# Each state's stored text. ``state.value`` is an enum property, a call per read in
# Python 3.11, and the journal reads one per changed row.
_STATE_TEXT: dict[JobState | None, str] = {state: state.value for state in JobState}

EXPIRED = "expired"
MAX_ATTEMPTS_EXCEEDED = "max attempts exceeded"
FAILED = "failed"

# 2.0 ** 1023 is the largest power of two a float holds; past it the curve is at its cap
# for any base > 0, so clamping the exponent keeps the arithmetic from overflowing.
_MAX_EXPONENT = 1023

#: The states ``Queue.list_jobs`` lists, as the wire names them (JOB-5).
LIST_STATES = ("ready", "scheduled", "processing", "dead", "completed", "waiting")
#: How many jobs a search looks at per ``list_jobs`` call, at most (LST-4).
SEARCH_SCAN = 2000


def _wall_clock() -> float:
    """The default clock: wall-clock seconds since the epoch. Tests inject their own."""
    return datetime.now(UTC).timestamp()


class Finish(NamedTuple):
    """A followed job that finished (RES-5): ``state`` ``"completed"``, ``"dead"`` or
    ``"cancelled"``; ``result`` the encoded JSON its ack stored; ``error`` its last
    error when dead."""

    id: str
    queue: str
    state: str
    result: bytes | None
    error: str | None


class Step(NamedTuple):
    """What a watched job did short of finishing (PRG-5): ``kind`` ``"progress"`` (its
    lease holder reported ``progress``, encoded JSON), or ``"retry"`` (the attempt
    ``attempt`` ended and the job will run again: ``reason`` ``"failed"`` for a worker's
    retry, with its ``error``; ``"lapsed"`` for a lease that ran out; ``"backed_off"``
    for a worker's back-off, which does not count as an attempt)."""

    id: str
    kind: str
    attempt: int
    progress: bytes | None = None
    reason: str | None = None
    error: str | None = None


#: The most encoded bytes one progress value may have (PRG-3), or the table's
#: ``max_payload_bytes`` when that is smaller.
MAX_PROGRESS_BYTES = 64 * 1024


class _Rare:
    """The fields of a row that a pending job never sets (its finish, its errors, its
    dependencies, its expiry), apart from the row: a ``_Row`` makes one only when one
    of them is set to other than its default, so a million pending rows do without."""

    __slots__ = (
        "_age_entry",
        "_exp_entry",
        "after",
        "completed_at",
        "died_at",
        "expires_at",
        "last_error",
        "met",
        "partition",
        "progress",
        "result",
        "unmet",
    )

    def __init__(self) -> None:
        # Its dependencies (DEP-1): their seqs in the order named, the results of those
        # whose acks landed (by seq; kept until the row goes), and how many it still
        # waits for while WAITING.
        self.after: tuple[int, ...] = ()
        self.met: dict[int, bytes | None] | None = None
        self.unmet: int = 0
        self.completed_at: float | None = None
        self.died_at: float | None = None
        self.expires_at: float | None = None
        self.last_error: str | None = None
        self.progress: bytes | None = None
        self.result: bytes | None = None
        # Its partition key (FLW-3): only jobs of partitioned queues have one.
        self.partition: str | None = None
        # Its entry in the queue's heap of ready times (a ready row off the Fifo).
        self._age_entry: tuple[Any, ...] | None = None
        self._exp_entry: tuple[Any, ...] | None = None


#: A processing row's claim: its lease, the worker holding it and the lease's deadline
#: (a heartbeat makes a new one). A claim makes one and the row drops it when it stops
#: being processing, so a pending row holds one slot for the three, not three. A tuple,
#: not an object: a claim makes one per job, and a tuple is the cheapest to make.
_Held = tuple[str | None, str | None, float | None]


class _Options:
    """The queue and options a job keeps from its enqueue and never changes, shared by the rows
    that have the same (``Queue._options_for``): most jobs of a queue take its defaults,
    so a million pending rows hold one of these, not a million."""

    __slots__ = (
        "backoff_base_s",
        "backoff_max_s",
        "max_attempts",
        "queue",
        "timeout_s",
        "visibility_timeout_s",
    )

    def __init__(
        self,
        queue: Queue,
        max_attempts: int,
        visibility_timeout_s: float,
        backoff_base_s: float,
        backoff_max_s: float,
        timeout_s: float | None,
    ) -> None:
        self.queue = queue
        self.max_attempts = max_attempts
        self.visibility_timeout_s = visibility_timeout_s
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.timeout_s = timeout_s

    def same(
        self,
        max_attempts: int,
        visibility_timeout_s: float,
        backoff_base_s: float,
        backoff_max_s: float,
        timeout_s: float | None,
    ) -> bool:
        """Whether these are its options, of the same types too (a 30 is not a 30.0 in
        a snapshot)."""
        return all(
            a is b or (type(a) is type(b) and a == b)
            for a, b in (
                (self.max_attempts, max_attempts),
                (self.visibility_timeout_s, visibility_timeout_s),
                (self.backoff_base_s, backoff_base_s),
                (self.backoff_max_s, backoff_max_s),
                (self.timeout_s, timeout_s),
            )
        )


V = TypeVar("V")


class _OnRare(Generic[V]):
    """A field of ``_Row`` kept on its side object (``_Rare``): read as ``default`` while
    the row has none, and set to ``default`` on a row with none it makes none."""

    __slots__ = ("_default", "_name")

    def __init__(self, default: V) -> None:
        self._default = default
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, row: None, owner: type) -> _OnRare[V]: ...
    @overload
    def __get__(self, row: _Row, owner: type) -> V: ...
    def __get__(self, row: _Row | None, owner: type) -> V | _OnRare[V]:
        if row is None:
            return self
        rare = row._rare
        return self._default if rare is None else getattr(rare, self._name)

    def __set__(self, row: _Row, value: V) -> None:
        rare = row._rare
        if rare is None:
            if value == self._default:
                return
            rare = row._rare = _Rare()
        setattr(rare, self._name, value)


class _Row:
    """One stored job. Mutable, private; the outside world sees ``Job`` snapshots."""

    __slots__ = (
        "_entry",
        "_heap",
        "_held",
        "_opts",
        "_rank",
        "_rare",
        "attempts",
        "enqueued_at",
        "key",
        "payload",
        "priority",
        "ready_at",
        "seq",
        "state",
    )

    def __init__(
        self,
        seq: int,
        queue: Queue,
        payload: bytes,
        priority: int,
        max_attempts: int,
        visibility_timeout_s: float,
        backoff_base_s: float,
        backoff_max_s: float,
        enqueued_at: float,
        ready_at: float,
        expires_at: float | None,
        key: str | None,
        timeout_s: float | None = None,
        partition: str | None = None,
    ) -> None:
        self.seq = seq
        self.payload = payload
        self.priority = priority
        self.state: JobState | None = PENDING  # None once the row is deleted
        self.attempts = 0
        self.enqueued_at = enqueued_at
        self.ready_at = ready_at
        self._held: _Held | None = None  # its claim, while processing
        self.key = key
        # What a pending job never sets (see _Rare), made when first set.
        self._rare: _Rare | None = None
        if expires_at is not None:
            self.expires_at = expires_at
        if partition is not None:
            self.partition = partition
        self._opts = queue._options_for(
            max_attempts, visibility_timeout_s, backoff_base_s, backoff_max_s, timeout_s
        )
        self._entry: tuple[Any, ...] | None = None
        self._heap: Heap | Fifo | None = None  # (a Line is a Heap)
        # Its entry in the queue's listing index of its state (None for a fresh ready
        # row, which its Fifo line lists): see Queue.list_jobs and Queue._listing.
        self._rank: tuple[Any, ...] | None = None

    # What a pending job never sets, on its side object (_Rare) once first set.
    after: _OnRare[tuple[int, ...]] = _OnRare(())
    completed_at: _OnRare[float | None] = _OnRare(None)
    died_at: _OnRare[float | None] = _OnRare(None)
    expires_at: _OnRare[float | None] = _OnRare(None)
    last_error: _OnRare[str | None] = _OnRare(None)
    met: _OnRare[dict[int, bytes | None] | None] = _OnRare(None)
    partition: _OnRare[str | None] = _OnRare(None)
    progress: _OnRare[bytes | None] = _OnRare(None)
    result: _OnRare[bytes | None] = _OnRare(None)
    unmet: _OnRare[int] = _OnRare(0)
    _age_entry: _OnRare[tuple[Any, ...] | None] = _OnRare(None)
    _exp_entry: _OnRare[tuple[Any, ...] | None] = _OnRare(None)

    # Its queue and the options fixed at its enqueue, in an _Options its queue shares
    # between rows. (The per-job paths, a claim, an ack, a journal entry, read
    # ``row._opts.queue`` without the property call.)

    @property
    def queue(self) -> Queue:
        return self._opts.queue

    @property
    def max_attempts(self) -> int:
        return self._opts.max_attempts

    @property
    def visibility_timeout_s(self) -> float:
        return self._opts.visibility_timeout_s

    @property
    def backoff_base_s(self) -> float:
        return self._opts.backoff_base_s

    @property
    def backoff_max_s(self) -> float:
        return self._opts.backoff_max_s

    @property
    def timeout_s(self) -> float | None:
        return self._opts.timeout_s

    # Its claim's fields, on its _Held while it is processing.

    @property
    def lease(self) -> str | None:
        held = self._held
        return None if held is None else held[0]

    @property
    def worker_id(self) -> str | None:
        held = self._held
        return None if held is None else held[1]

    @property
    def deadline(self) -> float | None:
        held = self._held
        return None if held is None else held[2]


class JobHandle:
    """A claim of one job: its id, its lease, and what the claim made of it.

    ``attempt``, ``deadline``, ``payload_json`` and the job's fixed options are read
    straight off the handle (what a push needs); ``job`` is the full snapshot as of the
    claim, built when first asked for, since most claims never need one.

    ``ack``, ``retry``, ``fail`` and ``heartbeat`` answer ``False`` when the lease is no
    longer valid (lapsed, already used, or the job cancelled or dead) and change nothing
    then; they raise ``InvalidArgument`` only for a bad argument (``docs/contract.md``,
    HND-1 to HND-3, HND-9).
    """

    __slots__ = (
        "_job",
        "_queue",
        "_row",
        "_was",
        "attempt",
        "deadline",
        "dependencies",
        "id",
        "lease",
        "max_attempts",
        "partition",
        "payload_json",
        "priority",
        "queue",
        "ready_since",
        "timeout_s",
        "visibility_timeout_s",
    )

    def __init__(self, queue: Queue, row: _Row, job_id: str, lease: str, deadline: float) -> None:
        """Made by ``Queue.claim_batch`` only, with the row's id and its new lease."""
        self._queue = queue
        self._row = row
        self._job: Job | None = None
        self.id = job_id
        self.lease = lease
        self.attempt: int = row.attempts
        self.deadline = deadline
        # What a later retry, fail or redrive may change and the snapshot must not see.
        rare = row._rare  # (its fields read off it: most rows have none)
        held = row._held
        worker_id = None if held is None else held[1]
        self._was: tuple[str | None, float, str | None, float | None]
        if rare is None:
            self._was = (worker_id, row.ready_at, None, None)
        else:
            self._was = (worker_id, row.ready_at, rare.last_error, rare.died_at)
        # Plain attributes, not properties reading the row: every push reads each of
        # them once, and a property call costs several attribute reads.
        self.queue: str = queue.name
        self.payload_json: bytes = row.payload
        self.priority: int = row.priority
        opts = row._opts
        self.max_attempts: int = opts.max_attempts
        self.visibility_timeout_s: float = opts.visibility_timeout_s
        self.timeout_s: float | None = opts.timeout_s
        self.partition: str | None = None if rare is None else rare.partition
        #: How many jobs it depended on (DEP-2: their results are ``dependency_results``).
        self.dependencies: int = 0 if rare is None else len(rare.after)
        #: When the job became claimable for this claim (its ready time, or its enqueue).
        ready_at, enqueued_at = row.ready_at, row.enqueued_at
        self.ready_since: float = ready_at if ready_at > enqueued_at else enqueued_at

    @property
    def job(self) -> Job:
        """The job as the claim left it (state processing), built on first use."""
        job = self._job
        if job is None:
            worker_id, ready_at, last_error, died_at = self._was
            as_claimed = (
                PROCESSING,
                self.attempt,
                worker_id,
                self.deadline,
                ready_at,
                last_error,
                died_at,
            )
            job = self._job = self._queue._table._snapshot(self._row, as_claimed)
        return job

    def ack(self, result: bytes | None = None) -> bool:
        """The job is done: it is deleted, or kept completed with ``result`` (the encoded
        JSON) where its queue keeps finished jobs (HND-5, RES-1 to RES-3)."""
        if result is not None:
            guard.result(result, self._queue._table.max_payload_bytes)
        return self._queue._ack(self._row, self.lease, self._queue._table._now(), result)

    def retry(self, error: str | None = None, delay_s: float | None = None) -> bool:
        """Back to pending after ``delay_s`` (or the backoff curve), or dead if used up
        (HND-6)."""
        return self._queue._retry(self._row, self.lease, error, delay_s)

    def fail(self, error: str | None = None) -> bool:
        """Dead at once, with ``error`` or ``"failed"`` as its last error (HND-7)."""
        return self._queue._fail(self._row, self.lease, error)

    def heartbeat(self) -> bool:
        """Extend the lease to now + visibility timeout (an absolute reset: HND-8)."""
        return self._queue._heartbeat(self._row, self.lease)

    def __repr__(self) -> str:
        return f"<JobHandle {self.id} lease={self.lease}>"


class Queue:
    """One named queue of a ``JobTable``. Get it from ``JobTable.queue(name)``.

    Every operation is O(log n) or better in the queue's depth. Operations that take an
    id answer ``None`` / ``False`` for an id of another queue or of no job.
    """

    __slots__ = (
        "_ages",
        "_by_completion",
        "_by_death",
        "_by_due",
        "_by_ready",
        "_by_wait",
        "_claims",
        "_completed",
        "_dead",
        "_event_entry",
        "_exhausted",
        "_expiry",
        "_flow",
        "_fresh",
        "_keys",
        "_last_options",
        "_leases",
        "_n_processing",
        "_n_ready",
        "_n_scheduled",
        "_n_waiting",
        "_opts",
        "_order",
        "_paused",
        "_ready",
        "_scheduled",
        "_table",
        "_totals",
        "name",
    )

    def __init__(self, table: JobTable, name: str, opts: QueueOpts) -> None:
        self._table = table
        self.name = name
        self._opts = opts
        self._paused = False
        self._ready = Heap("_entry")
        self._fresh = Fifo()
        self._scheduled = Heap("_entry")
        self._leases = Line("_entry")
        self._expiry = Heap("_exp_entry")
        self._exhausted: dict[int, _Row] = {}
        self._dead: OrderedDict[int, _Row] = OrderedDict()
        self._completed: OrderedDict[int, _Row] = OrderedDict()
        self._keys: dict[str, _Row] = {}
        # The listing indexes (list_jobs): ready rows off the Fifo in claim order,
        # scheduled rows by due time, processing rows in claim order, dead rows by death.
        self._by_ready = Ranked()  # (-priority, ready_at, seq, row)
        self._by_due = Ranked()  # (ready_at, seq, row)
        self._claims = Log()  # (lease number, row)
        self._by_death = Ranked()  # (died_at, seq, row)
        self._by_completion = Ranked()  # (completed_at, seq, row)
        self._by_wait = Ranked()  # (enqueued_at, seq, row): waiting rows, oldest first
        # Ready rows off the Fifo by ready time, for the oldest ready time (stats): the
        # claim order puts priority first, so it cannot tell.
        self._ages = Heap("_age_entry")  # (ready_at, seq, row)
        self._n_ready = 0
        self._n_scheduled = 0
        self._n_processing = 0
        self._n_waiting = 0
        # Flow control: slots, buckets, back-offs, partition keys' turns (see _flow).
        self._flow = Flow()
        # enqueued, completed, retried, dead, expired, cancelled (see QueueTotals)
        self._totals = [0, 0, 0, 0, 0, 0]
        # Its entry in the table's heap of next events, and a tie-break for that heap.
        self._event_entry: tuple[Any, ...] | None = None
        self._order = len(table._queues)
        # The options its last row took (see _Options).
        self._last_options: _Options | None = None

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    def _options_for(
        self,
        max_attempts: int,
        visibility_timeout_s: float,
        backoff_base_s: float,
        backoff_max_s: float,
        timeout_s: float | None,
    ) -> _Options:
        """A row's fixed options: those of the row before it when they are the same
        (the common case, every option its queue's default), else new ones."""
        last = self._last_options
        if last is not None and (
            (
                last.max_attempts is max_attempts
                and last.visibility_timeout_s is visibility_timeout_s
                and last.backoff_base_s is backoff_base_s
                and last.backoff_max_s is backoff_max_s
                and last.timeout_s is timeout_s
            )
            or last.same(
                max_attempts, visibility_timeout_s, backoff_base_s, backoff_max_s, timeout_s
            )
        ):
            return last
        made = self._last_options = _Options(
            self, max_attempts, visibility_timeout_s, backoff_base_s, backoff_max_s, timeout_s
        )
        return made

    # -- options and operator switches ------------------------------------------------

    @property
    def opts(self) -> QueueOpts:
        """The options later enqueues resolve against."""
        return self._opts

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        """Stop handing out jobs from this queue; nothing else changes (OPS-4)."""
        self._paused = True
        self._table._touch_queue(self)

    def resume(self) -> None:
        """Hand out jobs again."""
        self._paused = False
        self._table._touch_queue(self)

    @property
    def limits(self) -> Limits:
        """The queue's flow-control limits (FLW-1)."""
        return self._flow.limits

    def set_limits(self, limits: Limits) -> None:
        """Replace the queue's limits, from its next claim on (FLW-1, FLW-2); a limit
        below the slots held ends no lease. Raises ``InvalidArgument`` naming the field of
        a bad one (nothing changed)."""
        limits = guard.check_limits(limits)
        now = self._table._now()
        self._advance(now)
        self._flow.set_limits(limits, now)
        self._table._touch_queue(self)
        self._table._freed.add(self)

    def back_off(self, partition: str | None, delay_s: float) -> None:
        """Hand out nothing of ``partition`` (of the whole queue when ``None``) for
        ``delay_s`` seconds from now; a later back-off extends, never shortens (FLW-6).
        Raises ``InvalidArgument`` for a bad delay or key."""
        delay, name, _ = _back_off_args(delay_s, partition, False)
        now = self._table._now()
        self._advance(now)
        self._flow.back_off(None if name is None else self._flow.part(name), now + delay, now)
        self._table._timing_dirty.add(self)

    # -- enqueue --------------------------------------------------------------------------

    def enqueue(
        self,
        payload: Any,
        *,
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
        after: Sequence[str] = (),
    ) -> str:
        """Store a job and return its id (``docs/contract.md``, ENQ-2 to ENQ-10).

        With a ``key`` that a live job of this queue already carries, return that job's
        id and change nothing. Raises ``InvalidArgument`` (nothing changed) for a bad
        argument; every guard runs before the key is looked at.

        ``after``: ids of jobs it depends on (DEP-1 on), of any queue, each one the table
        knows (else ``InvalidArgument``, field ``after[i]``). The job waits (``WAITING``)
        until each is acked; one already completed counts as acked; one dead, or dying
        later, makes it die (DEP-3).
        """
        # (The options go to resolve as they are: building a NewJob first cost as much
        # as the rest of an enqueue.)
        resolved = self.resolve(
            payload,
            priority,
            delay_s,
            run_at,
            expires_s,
            visibility_timeout_s,
            max_attempts,
            backoff_base_s,
            key,
            timeout_s,
            partition,
        )
        deps = self._table._deps(guard.after(after)) if after else None
        return self._insert(resolved, self._table._now(), deps)

    def enqueue_batch(self, jobs: Sequence[NewJob]) -> list[str]:
        """Store every job of ``jobs`` or none: all are checked before any is stored (ENQ-11).

        Returns the ids in order (a job whose key is taken, by a stored job or by an
        earlier one of the batch, gets that job's id). A bad job raises
        ``InvalidArgument`` whose field is ``jobs[i].<field>``.
        """
        resolved = []
        after: list[list[_Row] | None] = []
        for index, spec in enumerate(jobs):
            if not isinstance(spec, NewJob):
                raise InvalidArgument(f"jobs[{index}]", "must be a NewJob")
            try:
                resolved.append(
                    self.resolve(
                        spec.payload,
                        spec.priority,
                        spec.delay_s,
                        spec.run_at,
                        spec.expires_s,
                        spec.visibility_timeout_s,
                        spec.max_attempts,
                        spec.backoff_base_s,
                        spec.key,
                        spec.timeout_s,
                        spec.partition,
                    )
                )
                after.append(self._table._deps(guard.after(spec.after)) if spec.after else None)
            except InvalidArgument as exc:
                raise exc.within(f"jobs[{index}]") from None
        now = self._table._now()
        return [self._insert(item, now, deps) for item, deps in zip(resolved, after, strict=True)]

    def resolve(
        self,
        payload: Any,
        priority: Any,
        delay_s: Any,
        run_at: Any,
        expires_s: Any,
        visibility_timeout_s: Any,
        max_attempts: Any,
        backoff_base_s: Any,
        key: Any,
        timeout_s: Any = None,
        partition: Any = None,
    ) -> tuple[Any, ...]:
        """Check every option of one job and resolve it against the queue's, as an enqueue
        would store it; changes nothing (ENQ-2 to ENQ-9). Returns ``(payload bytes,
        priority, delay_s, run_at, expires_s, visibility_timeout_s, max_attempts,
        backoff_base_s, key, timeout_s, partition)``, the queue's defaults filled in. Raises
        ``InvalidArgument``. A backend that stores jobs elsewhere (PostgreSQL) resolves
        them here too, so that the rules stay in one place."""
        opts = self._opts
        prio = guard.priority(priority)
        # (Each unset option is tested here rather than in guard.optional: most jobs set
        # none, and a call per option showed in an enqueue's profile.)
        if delay_s is not None:
            delay_s = guard.nonneg("delay_s", delay_s)
        if run_at is not None:
            run_at = guard.finite("run_at", run_at)
        if expires_s is not None:
            expires_s = guard.positive("expires_s", expires_s)
        vis = visibility_timeout_s
        if vis is not None:
            vis = guard.positive("visibility_timeout_s", vis)
        attempts = max_attempts
        if attempts is not None:
            attempts = guard.positive_int("max_attempts", attempts)
        base = backoff_base_s
        if base is not None:
            base = guard.nonneg("backoff_base_s", base)
        if base is None:
            base = opts.backoff_base_s
        elif base > opts.backoff_max_s:
            raise InvalidArgument(
                "backoff_base_s",
                f"must be <= the queue's backoff_max_s ({opts.backoff_max_s}), got {base}",
            )
        if timeout_s is not None:
            timeout_s = guard.positive("timeout_s", timeout_s)
        key = guard.key(key)
        if partition is not None:
            partition = guard.key(partition, "partition")
        payload = guard.encode_payload(payload, self._table.max_payload_bytes)
        if expires_s is None:
            expires_s = opts.expires_s
        return (
            payload,
            prio,
            delay_s,
            run_at,
            expires_s,
            opts.visibility_timeout_s if vis is None else vis,
            opts.max_attempts if attempts is None else attempts,
            base,
            key,
            timeout_s,
            partition,
        )

    def _insert(self, resolved: tuple[Any, ...], now: float, deps: list[_Row] | None = None) -> str:
        """Store one resolved job; ``deps``: the rows it depends on (DEP-1), checked."""
        payload, prio, delay_s, run_at, expires_s, vis, attempts, base, key, limit, part = resolved
        table = self._table
        if key is not None:
            existing = self._keys.get(key)
            if existing is not None:
                return table._format_id(existing.seq)
        if delay_s is not None:  # ENQ-5
            ready_at = now + delay_s
        elif run_at is not None:
            ready_at = run_at if run_at > now else now
        else:
            ready_at = now
        seq = table._next_seq()
        row = _Row(
            seq,
            self,
            payload,
            prio,
            attempts,
            vis,
            base,
            self._opts.backoff_max_s,
            now,
            ready_at,
            None if expires_s is None else now + expires_s,
            key,
            limit,
            part,
        )
        table._rows[seq] = row
        if table._journal is not None:
            table._journal_new.add(seq)
        if key is not None:
            self._keys[key] = row
        self._totals[0] += 1
        if deps:
            row.after = tuple(dep.seq for dep in deps)
            row.met = {}
            self._advance(now)
            death = table._link(row)
            table._journal_edges(row)
            if death is not None:
                self._kill(row, death, now)  # DEP-3: a dependency dead already
            else:
                if row.expires_at is not None:
                    self._expiry.push((row.expires_at, seq, row))
                self._settle_linked(row, now, fresh=True)
            return table._format_id(seq)
        if row.expires_at is not None:
            self._expiry.push((row.expires_at, seq, row))
        self._advance(now)
        self._place_pending(row, now, fresh=True)
        return table._format_id(seq)

    def _settle_linked(self, row: _Row, now: float, *, fresh: bool = False) -> None:
        """File a live row just linked to its dependencies: waiting while some are not
        acked (DEP-1), else pending."""
        if row.unmet:
            self._table._touch(row)
            row.state = WAITING
            self._n_waiting += 1
            self._by_wait.add((row.enqueued_at, row.seq, row))
        else:
            self._place_pending(row, now, fresh=fresh)

    def _wake(self, row: _Row, now: float) -> None:
        """A waiting row's last dependency was acked: pending, ready at the later of its
        own ready time and now (DEP-1, DEP-10), filed as a retried row is."""
        self._advance(now)
        self._by_wait.remove(row)
        self._n_waiting -= 1
        row.state = PENDING
        if row.ready_at < now:
            row.ready_at = now
        self._place_pending(row, now)
        self._table._freed.add(self)

    # -- claim ----------------------------------------------------------------------------

    def claim_one(self, worker_id: str) -> JobHandle | None:
        """``claim_batch(worker_id, 1)``, unpacked."""
        handles = self.claim_batch(worker_id, 1)
        return handles[0] if handles else None

    def claimable_bound(self) -> int | None:
        """No fewer than the jobs a claim could take now (it may count more: flow
        control and expiry are checked by the claim itself); 0 while paused; ``None``
        while partition keys are in use (their lapsed rows are counted nowhere cheap).
        O(rows that matured or lapsed since the last look)."""
        if self._paused:
            return 0
        self._advance(self._table._now())
        if self._flow.parts:
            return None
        # A lapsed row waits in the ready heap still counted as processing until a claim
        # meets it: the heap's size covers those (and counts its pending rows twice).
        return self._n_ready + len(self._ready)

    def claim_batch(self, worker_id: str, n: int) -> list[JobHandle]:
        """Hand out up to ``n`` claimable jobs in order; ``n <= 0`` hands out none.

        ``docs/contract.md``, "Claiming": claimable rows (CLM-2) in order (CLM-6), each
        claim counting an attempt (CLM-7). A reclaim consumes an attempt (CLM-3): a lapsed
        row whose attempts are used up is not handed out but dies here, and so does an
        expired row (CLM-4); the claim then goes on with the next row (CLM-5).

        Raises ``InvalidArgument`` for an empty ``worker_id`` (checked first) or a non-int
        ``n`` (CLM-9).
        """
        guard.worker_id(worker_id)
        if isinstance(n, bool) or not isinstance(n, int):
            raise InvalidArgument("n", f"must be an int, got {type(n).__name__}")
        if n <= 0 or self._paused:
            return []
        now = self._table._now()
        self._advance(now)
        handles: list[JobHandle] = []
        ready, fresh, leases = self._ready, self._fresh, self._leases
        table = self._table
        journal = table._journal
        leased = table._leased
        prefix = table.id_prefix
        flow = self._flow
        gated = flow.gated
        parts = flow.parts
        while len(handles) < n:
            if gated and flow.opens_at(now) is not None:
                break  # the queue's own limit or back-off holds it (FLW-2, FLW-4, FLW-6)
            # The next row of no key in claim order (CLM-6): the heap's top or a fresh
            # line's head; and, with keys in use, the key whose turn it is (FLW-5).
            entry = ready.top()
            row: _Row | None = fresh.top()
            plain: Heap | Fifo | None = None
            first = 0
            if row is not None and (
                entry is None or (-row.priority, row.ready_at, row.seq) < entry[:3]
            ):
                plain, first = fresh, -row.priority
            elif entry is not None:
                plain, first = ready, entry[0]
            part: Part | None = flow.top() if parts else None
            if part is not None:
                head = part.ready.top()
                assert head is not None
                if plain is not None and (first, flow.plain_turn) < (head[0], part.turn):
                    part = None
                else:
                    flow.turns.pop()
                    part.ready.pop()
                    row = head[-1]
            if part is None:
                if plain is fresh:
                    fresh.pop()
                elif plain is ready:
                    assert entry is not None
                    ready.pop()
                    row = entry[-1]
                else:
                    break
                if parts:
                    flow.plain_turn = flow.next_turn()
            assert row is not None
            if row._rank is not None:  # (a fresh row has no listing entry of its own)
                self._listing(row, row._heap).remove(row)
            row._heap = None
            if row._rare is not None and row._rare._age_entry is not None:
                self._ages.forget(row)
            if row.state is PENDING:
                self._n_ready -= 1
                if part is not None:
                    flow.count(part, -1)
            else:  # a lapsed lease: this is a reclaim
                self._n_processing -= 1
                self._exhausted.pop(row.seq, None)
                leased.pop(row.lease, None)  # type: ignore[arg-type]
            if row.expires_at is not None and now >= row.expires_at:
                self._kill(row, EXPIRED, now)
                if part is not None:
                    flow.refile(part, now)
                continue
            if row.attempts >= row.max_attempts:  # CLM-3: the lapsed lease used the last one
                self._kill(row, MAX_ATTEMPTS_EXCEEDED, now)
                if part is not None:
                    flow.refile(part, now)
                continue
            flow.took(now)
            if part is not None:
                part.held += 1
                if part.bucket is not None:
                    part.bucket.take(now)
                part.turn = flow.next_turn()
                flow.refile(part, now)
            row.state = PROCESSING
            row.attempts += 1
            # A lease is the prefix, "L" and the count of leases issued, in hex; the id
            # below is _format_id's (inlined here: two calls per claimed job).
            table._leases_issued += 1
            lease = f"{prefix}L{table._leases_issued:x}"
            deadline = now + row._opts.visibility_timeout_s
            row._held = (lease, worker_id, deadline)
            self._claims.add((table._leases_issued, row))
            self._n_processing += 1
            self._push(leases, (deadline, row.seq, row))
            if journal is not None:
                table._journal_claim(row)
            job_id = f"{prefix}{row.seq:x}"
            leased[lease] = (job_id, row)
            handles.append(JobHandle(self, row, job_id, lease, deadline))
        if handles:
            table._timing_dirty.add(self)
        return handles

    # -- lease operations -----------------------------------------------------------------

    def _valid(self, row: _Row, lease: str, now: float) -> bool:
        """The validity predicate, HND-1 (the row's existence is the caller's look-up)."""
        held = row._held
        return (
            row.state is PROCESSING
            and held is not None
            and held[0] == lease
            and held[2] is not None
            and now < held[2]
        )

    def _ack(self, row: _Row, lease: str, now: float, result: bytes | None = None) -> bool:
        if not self._valid(row, lease, now):
            return False
        self._totals[1] += 1
        table = self._table
        if table._watched and row.seq in table._watched:
            table._finish(row, "completed", result, None)
        if table._dependents and row.seq in table._dependents:
            table._acked_dependency(row, result, now)
        if self._opts.completed_retention_s is None:
            self._delete(row, now)
            return True
        # Kept, with its result, until its retention ends (RES-3); its key stays taken.
        table._touch(row)
        self._unlink(row, now)
        if row._exp_entry is not None:
            self._expiry.forget(row)
        row.state = COMPLETED
        row.completed_at = now
        row.result = result
        row._held = None
        self._completed[row.seq] = row
        self._by_completion.add((now, row.seq, row))
        return True

    def _retry(self, row: _Row, lease: str, error: object, delay_s: object) -> bool:
        delay = guard.optional(guard.nonneg, "delay_s", delay_s)
        text = guard.error_text("error", error)
        now = self._table._now()
        if not self._valid(row, lease, now):
            return False
        self._unlink(row, now)
        if row.attempts >= row.max_attempts:
            self._kill(row, text or MAX_ATTEMPTS_EXCEEDED, now)
            return True
        if delay is None:
            delay = self._backoff(row)
        row.state = PENDING
        row._held = None
        if text is not None:
            row.last_error = text
        row.ready_at = now + delay
        self._place_pending(row, now)
        self._totals[2] += 1
        table = self._table
        if table._observed and row.seq in table._observed:
            table._step(row, "failed", text)
        return True

    def _backoff(self, row: _Row) -> float:
        """The equal-jitter delay for the claim being retried (RTY-2 to RTY-4)."""
        exponent = min(row.attempts - 1, _MAX_EXPONENT)
        exp = min(row.backoff_max_s, row.backoff_base_s * 2.0**exponent)
        return exp / 2 + self._table._rng.random() * (exp / 2)

    def _fail(self, row: _Row, lease: str, error: object) -> bool:
        text = guard.error_text("error", error)
        now = self._table._now()
        if not self._valid(row, lease, now):
            return False
        self._unlink(row, now)
        self._kill(row, text or FAILED, now)
        return True

    def _back_off(
        self, row: _Row, lease: str, delay: float, partition: str | None, whole: bool
    ) -> bool:
        now = self._table._now()
        if not self._valid(row, lease, now):
            return False
        self._unlink(row, now)
        key = None if whole else partition if partition is not None else row.partition
        flow = self._flow
        flow.back_off(None if key is None else flow.part(key), now + delay, now)
        row.state = PENDING
        row.attempts -= 1  # the claim did not count (FLW-6)
        row._held = None
        self._place_pending(row, now)  # (its ready time is past: back to its place)
        table = self._table
        table._timing_dirty.add(self)
        if table._observed and row.seq in table._observed:
            table._step(row, "backed_off", None, row.attempts + 1)  # (the claim given back)
        return True

    def _heartbeat(self, row: _Row, lease: str) -> bool:
        now = self._table._now()
        if not self._valid(row, lease, now):
            return False
        # The lease heap entry keeps the old, earlier deadline; _advance re-keys it.
        held = row._held
        assert held is not None
        row._held = (held[0], held[1], now + row._opts.visibility_timeout_s)
        self._table._touch(row)
        return True

    def _lapse(self, row: _Row, lease: str) -> bool:
        now = self._table._now()
        if not self._valid(row, lease, now):
            return False
        # An earlier deadline cannot be re-keyed lazily: replace the entry.
        self._leases.forget(row)
        held = row._held
        assert held is not None
        row._held = (held[0], held[1], now)
        self._push(self._leases, (now, row.seq, row))
        self._table._touch(row)
        self._advance(now)
        return True

    def ack_batch(self, items: Iterable[tuple[str, str]]) -> int:
        """Ack each ``(job_id, lease)`` on its own; return how many landed (HND-10)."""
        landed = 0
        now = self._table._now()
        for job_id, lease in items:
            row = self._row(job_id)
            if row is not None and self._ack(row, lease, now, None):
                landed += 1
        return landed

    # -- by id ----------------------------------------------------------------------------

    def _row(self, job_id: str) -> _Row | None:
        row = self._table._lookup(job_id)
        return row if row is not None and row.queue is self else None

    def get_job(self, job_id: str) -> Job | None:
        """A snapshot of the job, or ``None`` when it is gone or of another queue (OPS-1,
        OPS-3)."""
        row = self._row(job_id)
        if row is None:
            return None
        self._advance(self._table._now())
        return self._table._snapshot(row)

    def cancel(self, job_id: str) -> bool:
        """Delete the job in whatever state; ``True`` if it existed. Its lease dies with it
        (OPS-2)."""
        row = self._row(job_id)
        if row is None:
            return False
        now = self._table._now()
        self._advance(now)
        self._delete(row, now)
        self._totals[5] += 1
        return True

    def redrive(self, job_id: str) -> bool:
        """Put a dead job back to pending: attempts 0, ready now, ``last_error`` kept (OPS-5)."""
        row = self._row(job_id)
        if row is None or row.state is not DEAD:
            return False
        now = self._table._now()
        self._advance(now)
        self._revive(row, now)
        return True

    def _revive(self, row: _Row, now: float) -> None:
        """Move a dead row back to pending, ready now (OPS-5)."""
        del self._dead[row.seq]
        self._by_death.remove(row)
        row.state = PENDING
        row.attempts = 0
        row.died_at = None
        row.ready_at = now
        if row.after:
            # It waits again for the dependencies not acked yet (DEP-5), or dies again
            # at once if one of them is dead or gone.
            death = self._table._link(row)
            if death is not None:
                self._kill(row, death, now)
                return
            if row.expires_at is not None:
                self._expiry.push((row.expires_at, row.seq, row))
            self._settle_linked(row, now)
            return
        if row.expires_at is not None:
            self._expiry.push((row.expires_at, row.seq, row))
        self._place_pending(row, now)

    def dead_jobs(self, offset: int = 0, limit: int = 20) -> list[Job]:
        """A page of this queue's dead jobs, the most recent death first.

        Costs O(log n + limit): the page starts at its position in the death index.
        Raises ``InvalidArgument`` for a negative offset or a limit below 1.
        """
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidArgument("offset", f"must be an int >= 0, got {offset!r}")
        guard.positive_int("limit", limit)
        index = self._by_death
        snapshot = self._table._snapshot
        stop = min(len(index), offset + limit)
        return [snapshot(index.at(-1 - i)[-1]) for i in range(offset, stop)]

    def list_jobs(
        self,
        state: str,
        after: tuple[Any, ...] | None = None,
        limit: int = 50,
        search: str | None = None,
        scan: int = SEARCH_SCAN,
    ) -> tuple[list[Job], tuple[Any, ...] | None]:
        """A page of this queue's jobs in ``state`` (one of ``LIST_STATES``), in the
        state's order, and the key to pass as ``after`` for the next page (``None``: no
        job of the state follows). Keyset pagination: a page starts after the key, so a
        job that stays in its state between two pages is on exactly one of them.

        The orders (``docs/contract.md``, LST-1), each with its key:

        * ``ready``: claim order, priority high to low, then ready time, then seq
          (CLM-6); key ``(priority, ready_at, seq)``.
        * ``scheduled``: the soonest due first; key ``(ready_at, seq)``.
        * ``processing``: the oldest claim first (the longest running); key
          ``(claim number,)``, the lease's count (JOB-2), which a heartbeat leaves alone.
        * ``dead``: the most recent death first; key ``(died_at, seq)``.
        * ``completed``: the most recent ack first; key ``(completed_at, seq)`` (RES-3).
        * ``waiting``: the oldest enqueue first; key ``(enqueued_at, seq)`` (DEP-1).

        ``search``: only jobs whose id or key equals it, or whose stored payload JSON
        contains it (as UTF-8 bytes); at most ``scan`` jobs are looked at per call, and
        the key returned then is that of the last one looked at, so that the next call
        goes on from there (a page may come back short, even empty, with a key).

        Costs O(log n + limit) without search (O(priorities) more for ready, whose fresh
        rows wait in one line per priority); with it O(log n + scan). Raises
        ``InvalidArgument`` for a bad state, limit or key.
        """
        if state not in LIST_STATES:
            raise InvalidArgument(
                "state", f"must be one of {', '.join(LIST_STATES)}, got {state!r}"
            )
        guard.positive_int("limit", limit)
        guard.positive_int("scan", scan)
        if search is not None and not isinstance(search, str):
            raise InvalidArgument("search", "must be a string")
        if after is not None:
            check_list_key(state, after)
        self._advance(self._table._now())
        low: tuple[Any, ...] | None
        if state == "ready":
            low = None if after is None else (-after[0], after[1], after[2] + 1)
            entries = self._ready_entries(low)
            key: Callable[[tuple[Any, ...]], tuple[Any, ...]] = _ready_key
        elif state == "scheduled":
            low = None if after is None else (after[0], after[1] + 1)
            entries = self._by_due.from_key(low)
            key = _plain_key
        elif state == "processing":
            entries = self._claims.after(None if after is None else after[0])
            key = _claim_key
        elif state == "waiting":
            low = None if after is None else (after[0], after[1] + 1)
            entries = self._by_wait.from_key(low)
            key = _plain_key
        else:
            high = None if after is None else (after[0], after[1])
            index = self._by_death if state == "dead" else self._by_completion
            entries = index.to_key(high)
            key = _plain_key
        return self._page(entries, key, limit, search, scan)

    def _ready_entries(self, low: tuple[Any, ...] | None) -> Iterator[tuple[Any, ...]]:
        """The ready rows as ``(-priority, ready_at, seq, row)`` from ``low`` on, in claim
        order: the ready heap's index merged with each priority's Fifo line, each
        bisected to ``low``."""
        sources: list[Iterator[tuple[Any, ...]]] = [self._by_ready.from_key(low)]
        for priority, rows, head in self._fresh.lanes():
            if low is None or -priority > low[0]:
                start = head
            elif -priority < low[0]:
                continue  # the whole line comes before the key
            else:
                # A fresh row's ready time is its enqueue time: (enqueued_at, seq) is
                # sorted along the line, stale rows included (see Fifo).
                start = bisect_left(rows, (low[1], low[2]), lo=head, key=_arrival)
            sources.append(_lane_entries(rows, start))
        if len(sources) == 1:
            return sources[0]
        return merge(*sources, key=_ready_order)

    def _page(
        self,
        entries: Iterator[tuple[Any, ...]],
        key: Callable[[tuple[Any, ...]], tuple[Any, ...]],
        limit: int,
        search: str | None,
        scan: int,
    ) -> tuple[list[Job], tuple[Any, ...] | None]:
        snapshot = self._table._snapshot
        jobs: list[Job] = []
        last: tuple[Any, ...] | None = None
        if search is None:
            for entry in entries:
                if len(jobs) == limit:
                    assert last is not None
                    return jobs, key(last)  # (one more follows)
                jobs.append(snapshot(entry[-1]))
                last = entry
            return jobs, None
        needle = search.encode()
        found = self._table._lookup(search)
        seen = 0
        for entry in entries:
            if len(jobs) == limit or seen == scan:
                return jobs, None if last is None else key(last)
            seen += 1
            last = entry
            row: _Row = entry[-1]
            if row is found or row.key == search or needle in row.payload:
                jobs.append(snapshot(row))
        return jobs, None

    def redrive_all(self, limit: int | None = None) -> int:
        """Redrive the dead jobs of this queue, the longest dead first, at most ``limit``
        of them (all when ``None``); return how many (OPS-5, OPS-8). O(k log n) for k."""
        if limit is not None:
            guard.positive_int("limit", limit)
        now = self._table._now()
        self._advance(now)
        dead = self._dead
        n = len(dead) if limit is None else min(limit, len(dead))
        rows = [row for _, row in zip(range(n), dead.values(), strict=False)]
        for row in rows:
            self._revive(row, now)
        return len(rows)

    def oldest_ready_at(self) -> float | None:
        """The earliest ``ready_at`` of a ready job (how long the queue has kept work
        waiting), or ``None`` when none is ready: the smaller of the ready-time heap's
        top and the Fifo lines' heads, O(log n + priorities) (CST-5)."""
        self._advance(self._table._now())
        return self._oldest_ready_at()

    def _oldest_ready_at(self) -> float | None:
        entry = self._ages.top()
        fresh = self._fresh.oldest_ready_at()
        if entry is None:
            return fresh
        return entry[0] if fresh is None or entry[0] < fresh else fresh

    def _restore_indexes(self, waiting: Sequence[_Row] = ()) -> None:
        """Build the listing indexes of a restored queue from its heaps (O(n log n))."""
        self._by_ready = Ranked(self._ready.entries())
        for entry in self._ready.entries():
            row = entry[-1]
            self._ages.append((row.ready_at, row.seq, row))
        self._ages.rebuild()
        self._by_due = Ranked(self._scheduled.entries())
        self._claims.extend((lease_number(e[-1].lease), e[-1]) for e in self._leases.entries())
        self._by_death = Ranked((row.died_at, row.seq, row) for row in self._dead.values())
        self._by_completion = Ranked(
            (row.completed_at, row.seq, row) for row in self._completed.values()
        )
        self._by_wait = Ranked((row.enqueued_at, row.seq, row) for row in waiting)

    def purge_dead(self) -> int:
        """Delete every dead job of this queue; return how many (OPS-6)."""
        rows = list(self._dead.values())
        now = self._table._now()
        for row in rows:
            self._delete(row, now)
        return len(rows)

    # -- time-driven work -----------------------------------------------------------------

    def sweep_expired(self) -> SweepResult:
        """Kill expired and used-up lapsed rows, delete dead rows past retention (DLQ-2 to
        DLQ-5)."""
        now = self._table._now()
        self._advance(now)
        expired = exhausted = purged = 0
        expiry = self._expiry
        while (entry := expiry.top()) is not None and entry[0] <= now:
            expiry.pop()
            row: _Row = entry[-1]
            self._unlink(row, now)
            self._kill(row, EXPIRED, now)
            expired += 1
        for row in list(self._exhausted.values()):
            self._unlink(row, now)
            self._kill(row, MAX_ATTEMPTS_EXCEEDED, now)
            exhausted += 1
        retention = self._opts.dead_letter_retention_s
        if retention is not None:
            dead = self._dead
            while dead:
                row = next(iter(dead.values()))
                assert row.died_at is not None
                if row.died_at + retention > now:
                    break
                self._delete(row, now)
                purged += 1
        keep = self._opts.completed_retention_s
        completed = self._completed
        # (A queue that stopped keeping finished jobs still lets go of those it kept.)
        while completed:
            row = next(iter(completed.values()))
            assert row.completed_at is not None
            if keep is not None and row.completed_at + keep > now:
                break
            self._delete(row, now)
            purged += 1
        return SweepResult(expired, exhausted, purged)

    def stats(self) -> QueueStats:
        """Counts by state and running totals, read from counters (CST-4)."""
        now = self._table._now()
        self._advance(now)
        return QueueStats(
            ready=self._n_ready,
            scheduled=self._n_scheduled,
            processing=self._n_processing,
            dead=len(self._dead),
            completed=len(self._completed),
            waiting=self._n_waiting,
            paused=self._paused,
            totals=QueueTotals(*self._totals),
            oldest_ready_at=self._oldest_ready_at(),
            **self._flow_stats(now),
        )

    def _flow_stats(self, now: float) -> dict[str, Any]:
        """The flow-control fields of ``stats`` (FLW-8), O(1)."""
        flow = self._flow
        held_back = flow.gated and flow.opens_at(now) is not None
        return {
            "limited": self._n_ready if held_back else flow.n_limited,
            "partitions": flow.n_busy,
            "backoff_until": flow.until if flow.until > now else None,
            "limits": flow.limits,
        }

    def _next_event_at(self, now: float) -> float | None:
        """The earliest time this queue needs attention (see ``JobTable.next_event_at``)."""
        self._advance(now)
        times = []
        entry = self._scheduled.top()
        if entry is not None:
            times.append(entry[0])
        entry = self._lease_top()
        if entry is not None:
            times.append(entry[0])
        entry = self._expiry.top()
        if entry is not None:
            times.append(entry[0])
        retention = self._opts.dead_letter_retention_s
        if retention is not None and self._dead:
            died_at = next(iter(self._dead.values())).died_at
            assert died_at is not None
            times.append(died_at + retention)
        if self._completed:
            completed_at = next(iter(self._completed.values())).completed_at
            assert completed_at is not None
            keep = self._opts.completed_retention_s
            times.append(completed_at if keep is None else completed_at + keep)
        if self._exhausted:
            times.append(now)  # used-up lapsed rows wait for a sweep
        flow = self._flow
        if flow.waking:
            times.append(flow.next_at())
        # (Lapsed leases of keys wait in their keys' heaps, counted in neither
        # _n_ready nor _ready: a key that may give one is in the turns.)
        if flow.gated and (self._n_ready or len(self._ready) or len(flow.turns)):
            opens = flow.opens_at(now)  # the queue's own bucket or back-off
            if opens is not None and opens != float("inf"):
                times.append(opens)
        return min(times) if times else None

    # -- the transitions' building blocks -------------------------------------------------

    def _push(self, heap: Heap, entry: tuple[Any, ...]) -> None:
        heap.push(entry)
        entry[-1]._heap = heap

    def _place_pending(self, row: _Row, now: float, *, fresh: bool = False) -> None:
        """File a pending row under ready or scheduled by its ``ready_at``.

        ``fresh``: the row was just enqueued, so a ready one joins its priority's line
        in ``_fresh`` (see ``Fifo``); every other ready row goes to the heap.
        """
        self._table._touch(row)
        if row.ready_at <= now:
            if fresh and (row._rare is None or row._rare.partition is None):
                self._fresh.append(row)
                row._heap = self._fresh
            else:
                self._make_ready(row, now)
            self._n_ready += 1
        else:
            self._push(self._scheduled, (row.ready_at, row.seq, row))
            self._by_due.add((row.ready_at, row.seq, row))
            self._n_scheduled += 1

    def _make_ready(self, row: _Row, now: float) -> None:
        """File a pending row whose time has come in the ready heap (its key's, when it
        has one) and its indexes."""
        entry = (-row.priority, row.ready_at, row.seq, row)
        rare = row._rare  # (read off it once: most rows have none)
        partition = None if rare is None else rare.partition
        if partition is None:
            self._push(self._ready, entry)
        else:
            self._file_keyed(row, entry, now)
            self._flow.count(self._flow.parts[partition], 1)
        self._by_ready.add(entry)
        self._ages.push((row.ready_at, row.seq, row))

    def _file_keyed(self, row: _Row, entry: tuple[Any, ...], now: float) -> None:
        """File ``entry`` of a row with a partition key in its key's ready heap (FLW-5)."""
        flow = self._flow
        part = flow.part(row.partition)  # type: ignore[arg-type]
        self._push(part.ready, entry)
        flow.added(part, entry, now)

    def _release(self, row: _Row, now: float) -> None:
        """A processing row's lease stopped holding its slot (FLW-2): acked, retried,
        failed, backed off, cancelled, expired or lapsed."""
        flow = self._flow
        flow.held -= 1
        rare = row._rare  # (read off it once: most rows have none)
        if rare is not None and rare.partition is not None:
            flow.released(flow.parts[rare.partition], now)
        limits = flow.limits
        if limits.concurrency is not None or limits.partition_concurrency is not None:
            self._table._freed.add(self)

    def _lease_top(self) -> tuple[Any, ...] | None:
        """The lease heap's top with its key brought up to date after heartbeats."""
        leases = self._leases
        while (entry := leases.top()) is not None:
            row: _Row = entry[-1]
            held = row._held
            assert held is not None
            deadline = held[2]
            assert deadline is not None
            if entry[0] >= deadline:
                return entry
            leases.pop()
            self._push(leases, (deadline, row.seq, row))
        return None

    def _advance(self, now: float) -> None:
        """Move matured scheduled rows and lapsed leases into ``_ready``, each once (CLM-2,
        CST-2); note a lapsed row with its attempts used up for the sweep (DLQ-3)."""
        scheduled = self._scheduled
        ready = self._ready
        while (entry := scheduled.top()) is not None and entry[0] <= now:
            self._table._timing_dirty.add(self)
            scheduled.pop()
            row: _Row = entry[-1]
            self._by_due.remove(row)
            self._make_ready(row, now)
            self._n_scheduled -= 1
            self._n_ready += 1
        while (entry := self._lease_top()) is not None and entry[0] <= now:
            self._table._timing_dirty.add(self)
            self._leases.pop()
            row = entry[-1]
            # Lapsed at its deadline, which is its ready time for the reclaim. It stays
            # "processing" (and counted so) until a claim or a sweep meets it; its slot
            # is free from now (FLW-2).
            self._release(row, now)
            lapsed = (-row.priority, row.deadline, row.seq, row)
            if row.partition is None:
                self._push(ready, lapsed)
            else:
                self._file_keyed(row, lapsed, now)
            if row.attempts >= row.max_attempts:
                self._exhausted[row.seq] = row
            else:
                table = self._table
                if table._observed and row.seq in table._observed:
                    table._step(row, "lapsed", None)
        flow = self._flow
        if flow.waking or flow.until != _NEVER:
            flow.wake(now)

    def _listing(self, row: _Row, heap: Heap | Fifo | None) -> Ranked | Log:
        """The listing index holding a row's ``_rank`` entry, which its state tells (and
        for a pending row ``heap``, the claim index it is in: the scheduled heap or not)."""
        state = row.state
        if state is PENDING:
            return self._by_due if heap is self._scheduled else self._by_ready
        if state is PROCESSING:
            return self._claims
        if state is DEAD:
            return self._by_death
        if state is COMPLETED:
            return self._by_completion
        return self._by_wait

    def _unlink(self, row: _Row, now: float) -> None:
        """Take a live, dead or completed row out of its index and counters."""
        heap = row._heap
        if heap is not None:
            heap.forget(row)
            row._heap = None
        if row._rank is not None:
            # (A processing row's, every ack's, without the call: its claims log.)
            listing = self._claims if row.state is PROCESSING else self._listing(row, heap)
            listing.remove(row)
        rare = row._rare  # (its fields read off it: most rows have none)
        if rare is not None and rare._age_entry is not None:
            self._ages.forget(row)
        partition = None if rare is None else rare.partition
        state = row.state
        if state is PENDING:
            if heap is self._scheduled:
                self._n_scheduled -= 1
            else:
                self._n_ready -= 1
                if partition is not None:
                    self._flow.count(self._flow.parts[partition], -1)
        elif state is PROCESSING:
            if heap is self._leases:
                self._release(row, now)
            self._n_processing -= 1
            self._exhausted.pop(row.seq, None)
            held = row._held
            if held is not None:
                self._table._leased.pop(held[0], None)  # type: ignore[arg-type]
        elif state is DEAD:
            del self._dead[row.seq]
        elif state is COMPLETED:
            del self._completed[row.seq]
        elif state is WAITING:
            self._n_waiting -= 1
        if partition is not None and heap is not None and heap is not self._scheduled:
            part = self._flow.parts.get(partition)
            if part is not None and heap is part.ready and not part.ready:
                # Its key's last ready row went (cancelled, expired, swept): file the
                # part again now, so that one with nothing left is dropped, not kept
                # until a claim happens on its stale turn.
                self._flow.refile(part, now)

    def _kill(self, row: _Row, error: str, now: float, *, spread: bool = True) -> None:
        """Move an unlinked row to dead (DLQ-1); and, unless ``spread`` is false, the
        jobs waiting for it (DEP-3)."""
        self._table._touch(row)
        if row._exp_entry is not None:
            self._expiry.forget(row)
        row.state = DEAD
        row.died_at = now
        row.last_error = error
        row._held = None
        self._dead[row.seq] = row
        self._by_death.add((now, row.seq, row))
        self._totals[3] += 1
        if error == EXPIRED:
            self._totals[4] += 1
        table = self._table
        if table._watched and row.seq in table._watched:
            table._finish(row, "dead", None, error)
        if spread and table._dependents and row.seq in table._dependents:
            table._doom(row, _died(table._format_id(row.seq), error), now)

    def _delete(self, row: _Row, now: float) -> None:
        """Remove a row for good (ack, cancel, purge, retention)."""
        table = self._table
        if table._watched and row.seq in table._watched:
            # A live row deleted: cancelled (a finished one told its follower already).
            table._finish(row, "cancelled", None, None)
        table._touch(row)
        self._unlink(row, now)
        rare = row._rare  # (its fields read off it: most rows have none)
        if rare is not None and rare._exp_entry is not None:
            self._expiry.forget(row)
        if table._dependents and row.seq in table._dependents:
            if row.state is not None and row.state is not DEAD:  # a live row cancelled
                table._doom(row, f"dependency {table._format_id(row.seq)} was cancelled", now)
            del table._dependents[row.seq]
        if rare is not None and rare.after:
            table._unhook(row)
            if table._journal is not None:
                table._journal_gone.append(row.seq)
        del table._rows[row.seq]
        if row.key is not None:
            del self._keys[row.key]
        row.state = None
        row._held = None


_HEX_DIGITS = "0123456789abcdef"

# Below every (ready time, seq) a restored row can have.
_BEFORE_ALL = (float("-inf"), -1)


def _died(job_id: str, error: str) -> str:
    """A dependent's last error when its dependency ``job_id`` died of ``error`` (DEP-3),
    cut to ``MAX_ERROR_CHARS`` as any error (a long chain nests them)."""
    text = f"dependency {job_id} died: {error}"
    if len(text) > guard.MAX_ERROR_CHARS:
        text = text[: guard.MAX_ERROR_CHARS - 3] + "..."
    return text


# Each listed state's key: "i" an int, "f" a number (see Queue.list_jobs).
_KEY_KINDS = {
    "ready": "ifi",
    "scheduled": "fi",
    "processing": "i",
    "dead": "fi",
    "completed": "fi",
    "waiting": "fi",
}


def _back_off_args(
    delay_s: object, partition: object, whole_queue: object
) -> tuple[float, str | None, bool]:
    """``back_off``'s arguments, checked (FLW-6)."""
    if not isinstance(whole_queue, bool):
        raise InvalidArgument("whole_queue", f"must be a bool, got {type(whole_queue).__name__}")
    return guard.nonneg("delay_s", delay_s), guard.key(partition, "partition"), whole_queue


def check_list_key(state: str, key: object) -> None:
    """Raise ``InvalidArgument`` (field ``cursor``) unless ``key`` is a key of ``state``'s
    listing: a tuple of its length whose members are of its kinds."""
    kinds = _KEY_KINDS[state]
    ok = isinstance(key, tuple) and len(key) == len(kinds)
    if ok:
        assert isinstance(key, tuple)
        for kind, value in zip(kinds, key, strict=True):
            kind_ok = isinstance(value, int | float) if kind == "f" else isinstance(value, int)
            if isinstance(value, bool) or not kind_ok:
                ok = False
            elif isinstance(value, float) and value != value:  # NaN orders nothing
                ok = False
    if not ok:
        raise InvalidArgument("cursor", f"is not a cursor of a {state} listing")


def _ready_key(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    return (-entry[0], entry[1], entry[2])


def _ready_order(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    return entry[:3]


def _plain_key(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    return (entry[0], entry[1])


def _claim_key(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    return (entry[0],)


def _arrival(row: _Row) -> tuple[float, int]:
    return (row.enqueued_at, row.seq)


def _lane_entries(rows: list[_Row], start: int) -> Iterator[tuple[Any, ...]]:
    """The live rows of a Fifo line from ``start`` on, as ready-index entries."""
    for i in range(start, len(rows)):
        row = rows[i]
        if row._entry is IN_FIFO:
            yield (-row.priority, row.ready_at, row.seq, row)


def lease_number(lease: str | None) -> int:
    """The count a lease was issued under (JOB-2: ``<prefix>L<count in hex>``): the hex
    digits after its last ``L``; 0 for none or a malformed one."""
    try:
        return int((lease or "").rsplit("L", 1)[1], 16)
    except (IndexError, ValueError):
        return 0


class JobTable:
    """The in-memory job table: the rules of ``docs/contract.md``.

    ``clock`` returns now in seconds (default: the wall clock); ``rng`` draws the retry
    jitter and nothing else. ``id_prefix`` starts every job id (default: random, so ids
    of two tables differ); ``max_payload_bytes`` bounds an encoded payload. No method
    sleeps, starts anything or touches I/O: time passes only through ``clock``, and the
    caller asks ``next_event_at()`` when to come back.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
        id_prefix: str | None = None,
        max_payload_bytes: int = 1 << 20,
    ) -> None:
        self._now = clock if clock is not None else _wall_clock
        self._rng = rng if rng is not None else random.Random()
        if id_prefix is None:
            id_prefix = secrets.token_hex(4) + "-"
        if not isinstance(id_prefix, str):
            raise InvalidArgument("id_prefix", "must be a string")
        self.id_prefix = id_prefix
        self.max_payload_bytes = guard.positive_int("max_payload_bytes", max_payload_bytes)
        self._queues: dict[str, Queue] = {}
        self._rows: Rows[_Row] = Rows()
        self._seq = 0
        self._leases_issued = 0
        # The claims this table made, by lease: (job id, row), while the row holds that
        # lease. A report names a job by id; checking an id's form and parsing it was a
        # third of an ack, and a report almost always carries the lease the claim
        # issued. Entries leave where a row stops being processing (Queue._unlink) or
        # is claimed again; a lease not found here (a row restored from a store, say)
        # is looked up by its id as before.
        self._leased: dict[str, tuple[str, _Row]] = {}
        # Rows and queues changed since the last take_changes(), when a store listens.
        self._journal: dict[int, _Row] | None = None
        # Each queue's next event (see next_event_at), and the queues to look at again.
        self._events = Heap("_event_entry")
        self._timing_dirty: set[Queue] = set()
        # Rows enqueued since the last take_changes(): a store has never seen them.
        self._journal_new: set[int] = set()
        # Rows in the journal changed by claims only since the last take (their claim
        # fields are all that changed).
        self._journal_claims: set[int] = set()
        self._journal_queues: set[Queue] = set()
        # Queues where a concurrency slot freed since the last take_freed().
        self._freed: set[Queue] = set()
        # The schedules (SCH-1 on): their registry, heap of next ticks and journal.
        self._schedules = Schedules(self)
        # The seqs of followed live jobs, and what finished of them since the last
        # take_finished() (RES-5). Empty unless a broker has a follower.
        self._watched: set[int] = set()
        self._finished: list[Finish] = []
        # The seqs of live jobs watched for their steps too (progress, retries: PRG-5),
        # each also in _watched for its end; their steps since the last take_steps().
        self._observed: set[int] = set()
        self._steps: list[Step] = []
        # Rows whose progress changed since the last take_changes(), when a store
        # listens: the latest of each is written, once per commit (PRG-2).
        self._journal_progress: dict[int, _Row] = {}
        # Dependencies (DEP-1 on): for each job that others depend on, by its seq, those
        # jobs by seq: waiting ones, and dead ones, which keep the results of the rest
        # for a redrive (DEP-5). An entry goes when the job is acked or deleted (a dead
        # job keeps it: it may be redriven); a dependent leaves the lists when deleted.
        self._dependents: dict[int, dict[int, _Row]] = {}
        # Edges written since the last take (DEP_FIELDS tuples: new ones whole, then
        # acks meeting them as (result, seq, dep)), and the rows with edges deleted.
        self._journal_new_edges: list[tuple[Any, ...]] = []
        self._journal_met: list[tuple[Any, ...]] = []
        self._journal_gone: list[int] = []

    # -- queues ---------------------------------------------------------------------------

    def queue(self, name: str, opts: QueueOpts | None = None) -> Queue:
        """The queue called ``name``, made on first use (ENQ-3).

        With ``opts``, they replace the queue's options for later enqueues (stored jobs
        keep theirs). Raises ``InvalidArgument`` for a bad name or bad options.
        """
        if opts is None and type(name) is str:
            queue = self._queues.get(name)
            if queue is not None:
                return queue  # a name the table holds passed the check when it was made
        guard.queue_name(name)
        checked = None if opts is None else guard.check_opts(opts)
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = Queue(self, name, checked or QueueOpts())
            self._touch_queue(queue)
        elif checked is not None:
            queue._opts = checked
            self._timing_dirty.add(queue)  # its retention may have changed
        return queue

    def queues(self) -> list[str]:
        """The names of every queue made so far, in the order they were made."""
        return list(self._queues)

    def find_queue(self, name: str) -> Queue | None:
        """The queue called ``name`` if one was made, else ``None`` (none is made): O(1),
        where ``queues()`` copies every name (a call about one queue must not cost the
        number of queues)."""
        return self._queues.get(name)

    def _detached_queue(self, name: str) -> Queue:
        """A queue called ``name`` with the default options that the table does not
        hold: what a check of a job for a queue not made yet resolves against."""
        return Queue(self, name, QueueOpts())

    # -- schedules (docs/contract.md, "Schedules"; the registry is _schedules.py) ---------

    def set_schedule(self, spec: ScheduleSpec) -> ScheduleInfo:
        """Make schedule ``spec.id``, or replace its definition (SCH-1, SCH-4 to SCH-6).

        Checks the timing (``check_timing``), the queue's name, and the payload and every
        job option exactly as an enqueue on that queue would; raises ``InvalidArgument``
        naming the field (``cron``, ``priority``...), nothing changed. A new schedule
        fires first at its first tick strictly after now; a change that keeps the timing
        (``same_timing``) keeps its progress (``next_at``, ``last_at``, ``last_job``,
        ``fired``); one that changes it fires next at the new timing's first tick after
        now. Setting the same definition again changes nothing. The queue is made on
        first use. The info's ``spec.payload`` is the JSON value the jobs carry."""
        return self._schedules.define(spec, self._now())

    def delete_schedule(self, schedule_id: str) -> bool:
        """Delete the schedule (SCH-9): whether it existed. The jobs it made stay."""
        return self._schedules.delete(schedule_id)

    def pause_schedule(self, schedule_id: str, paused: bool) -> ScheduleInfo | None:
        """Pause (no job, ``next_at`` ``None``) or resume (next tick: the first after
        now; the ticks meanwhile are skipped, not missed) the schedule (SCH-6). ``None``:
        no such schedule. Pausing a paused one, or resuming a running one, changes
        nothing."""
        return self._schedules.pause(schedule_id, paused, self._now())

    def run_schedule(self, schedule_id: str) -> str | None:
        """Make one job of the schedule now, paused or ended alike, keyed
        ``schedule:<id>:run:<ms>`` (SCH-7); its next tick is unchanged, and the job counts
        in ``fired``, ``last_at`` and ``last_job``. The job's id; ``None``: no such
        schedule."""
        return self._schedules.run(schedule_id, self._now())

    def get_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """The schedule and where it stands, or ``None``."""
        return self._schedules.get(schedule_id)

    def get_schedules(self, ids: Sequence[str]) -> list[ScheduleInfo]:
        """The schedules ``ids`` name, in that order; unknown ids are left out."""
        return self._schedules.get_many(list(ids))

    def list_schedules(self, after: str | None = None, limit: int = 100) -> list[ScheduleInfo]:
        """A page of up to ``limit`` (at most ``MAX_LIST_LIMIT``) schedules in id order,
        starting after the id ``after``: O(log s + limit)."""
        return self._schedules.page(after, limit)

    def fire_schedules(self) -> list[str]:
        """Fire every schedule due now (SCH-3, SCH-4): each tick ``fire`` says makes one
        job, keyed ``tick_key(id, tick)``, and the schedule's progress moves on, in one
        journal with the jobs. The names of the queues that got a job. The driver calls
        it when ``next_event_at()`` comes; it costs O(log s) per schedule due and nothing
        for the others."""
        return sorted(self._schedules.fire_due(self._now()))

    # -- by id alone (the broker gets bare ids) -------------------------------------------

    def queue_of(self, job_id: str) -> str | None:
        """The name of the queue the job is in, or ``None``: an O(1) look-up, no snapshot."""
        row = self._lookup(job_id)
        return None if row is None else row.queue.name

    def get_job(self, job_id: str) -> Job | None:
        row = self._lookup(job_id)
        return None if row is None else row.queue.get_job(job_id)

    def cancel(self, job_id: str) -> bool:
        row = self._lookup(job_id)
        return row is not None and row.queue.cancel(job_id)

    def redrive(self, job_id: str) -> bool:
        row = self._lookup(job_id)
        return row is not None and row.queue.redrive(job_id)

    def enqueue_each(self, jobs: Iterable[tuple[Any, ...]]) -> list[str | Exception]:
        """Enqueue each job on its own, in order, all at one instant (the clock is read
        once): each a tuple ``(queue, payload, priority, delay_s, run_at, expires_s,
        visibility_timeout_s, max_attempts, backoff_base_s, key[, timeout_s[, partition[,
        after]]])`` with ``enqueue``'s meanings, its queue made on first use (ENQ-2 to
        ENQ-10, DEP-1).

        Returns, for each, its id, or the ``InvalidArgument`` that refused it (nothing
        changed for it: ENQ-7), or any other exception raised for it alone (a bug: the
        jobs after it still go in)."""
        now = self._now()
        queues = self._queues
        out: list[str | Exception] = []
        for job in jobs:
            name = job[0]
            try:
                queue = queues.get(name) if type(name) is str else None
                if queue is None:
                    queue = self.queue(name)
                if len(job) > 12 and job[12]:
                    resolved = queue.resolve(*job[1:12])
                    out.append(queue._insert(resolved, now, self._deps(guard.after(job[12]))))
                else:
                    out.append(queue._insert(queue.resolve(*job[1:12]), now))
            except Exception as exc:  # InvalidArgument, or a bug that must stay this job's
                out.append(exc)
        return out

    # -- dependencies (DEP-1 on) ------------------------------------------------------------

    def enqueue_group(self, jobs: Sequence[tuple[Any, ...]]) -> list[str]:
        """Enqueue every job of ``jobs`` or none (DEP-6): each a tuple as
        ``enqueue_each`` takes, whose ``after`` (its 13th member) may also name members
        of the group by index (an ``int``). Returns the ids in the order given (a member
        whose key is taken gets that job's id and adds no edges: DEP-8; those naming it
        depend on that job).

        Raises ``InvalidArgument`` whose field is ``jobs[i].<field>`` for a bad member
        (``jobs[i].after[j]`` for an unknown id or a bad index), or ``DependencyCycle``
        (field ``jobs[i].after``, ``i`` a member of the circle) when members depend on
        each other in a circle (DEP-4): nothing is stored then. The members are stored
        in an order where each comes after those it names (Kahn's algorithm: O(members +
        edges)), all at one instant; queues are made on first use."""
        now = self._now()
        count = len(jobs)
        resolved: list[tuple[Any, ...]] = []
        afters: list[tuple[str | int, ...]] = []
        known: list[list[_Row]] = []
        for i, job in enumerate(jobs):
            try:
                name = job[0]
                queue = self._queues.get(name) if type(name) is str else None
                if queue is None:
                    guard.queue_name(name)
                    queue = self._detached_queue(name)  # (made only once all is checked)
                resolved.append(queue.resolve(*job[1:12]))
                after = guard.after(job[12] if len(job) > 12 else (), count)
                if i in after:
                    raise DependencyCycle("after", "a job cannot depend on itself")
                known.append(self._deps(after))
            except InvalidArgument as exc:
                raise exc.within(f"jobs[{i}]") from None
            afters.append(after)
        order = guard.group_order(afters)  # (each member after those it names)
        ids: list[str] = [""] * count
        for i in order:
            queue = self.queue(jobs[i][0])
            deps = list(known[i])
            for item in afters[i]:
                if isinstance(item, int):
                    row = self._lookup(ids[item])
                    assert row is not None
                    deps.append(row)
            # (Ids first, then members, as named: the order kept is the one given.)
            deps = self._in_order(afters[i], deps, ids)
            ids[i] = queue._insert(resolved[i], now, deps or None)
        return ids

    def _in_order(
        self, after: tuple[str | int, ...], deps: list[_Row], ids: list[str]
    ) -> list[_Row]:
        """``deps`` in the order ``after`` names them (ids and member indexes mixed)."""
        if len(deps) < 2:
            return deps
        by_id = {self._format_id(row.seq): row for row in deps}
        out: list[_Row] = []
        for item in after:
            row = by_id.pop(ids[item] if isinstance(item, int) else item, None)
            if row is not None:
                out.append(row)
        return out

    def _deps(self, after: tuple[str | int, ...]) -> list[_Row]:
        """The rows the ids of ``after`` name (member indexes are skipped), each one the
        table knows (DEP-7); raises ``InvalidArgument`` (field ``after[i]``) for one it
        does not."""
        rows: list[_Row] = []
        for i, job_id in enumerate(after):
            if job_id.__class__ is int:
                continue
            row = self._lookup(job_id)
            if row is None:
                raise InvalidArgument(
                    f"after[{i}]",
                    f"no job {str(job_id)[:80]!r} is known (a dependency must be a live "
                    "job, a member of the same group, or a finished job still kept: "
                    "completed_retention_s)",
                )
            rows.append(row)
        return rows

    def _link(self, row: _Row) -> str | None:
        """Link a new or redriven row to its dependencies not acked yet (DEP-1): its
        ``unmet`` count is set, and it is listed under each live one. A dependency kept
        completed counts as acked (its result taken). Returns why the row must die
        instead (a dependency dead, or gone while not acked: DEP-3, DEP-5), linking
        nothing then."""
        met = row.met
        assert met is not None
        rows = self._rows
        for seq in row.after:
            if seq not in met:
                dep = rows.get(seq)
                death = None
                if dep is None:
                    death = f"dependency {self._format_id(seq)} is gone"
                elif dep.state is DEAD:
                    death = _died(self._format_id(seq), dep.last_error or FAILED)
                if death is not None:
                    # It dies, listed under its live dependencies still, whose acks keep
                    # their results for a later redrive (DEP-5), as any dead dependent.
                    self._register(row)
                    return death
        unmet = 0
        dependents = self._dependents
        journal = self._journal
        for seq in row.after:
            if seq in met:
                continue
            dep = rows[seq]
            if dep.state is COMPLETED:
                met[seq] = dep.result
                if journal is not None:
                    self._journal_met.append((dep.result, row.seq, seq))
                continue
            waiting = dependents.get(seq)
            if waiting is None:
                waiting = dependents[seq] = {}
            waiting[row.seq] = row
            unmet += 1
        row.unmet = unmet
        return None

    def _journal_edges(self, row: _Row) -> None:
        """Record a new row's edges whole for the store (``DEP_FIELDS``)."""
        if self._journal is None:
            return
        met = row.met
        assert met is not None
        seq = row.seq
        self._journal_new_edges.extend(
            (seq, dep, pos, dep in met, met.get(dep)) for pos, dep in enumerate(row.after)
        )

    def _acked_dependency(self, dep: _Row, result: bytes | None, now: float) -> None:
        """``dep``'s ack landed: each job waiting for it keeps its result, and one that
        waits for nothing more becomes pending (DEP-1, DEP-2): O(log n) per edge."""
        waiting = self._dependents.pop(dep.seq)
        journal = self._journal
        for row in waiting.values():
            met = row.met
            assert met is not None
            met[dep.seq] = result
            if journal is not None:
                self._journal_met.append((result, row.seq, dep.seq))
            row.unmet -= 1
            if row.unmet == 0 and row.state is WAITING:  # (a dead one just keeps it)
                row.queue._wake(row, now)

    def _doom(self, dep: _Row, error: str, now: float) -> None:
        """``dep`` died (``error`` says how) or was cancelled while jobs waited for it:
        each dies at once, and so, in turn, does each job waiting for those (DEP-3). A
        stack, not recursion: a chain may be long."""
        stack = [(dep.seq, error)]
        dependents = self._dependents
        while stack:
            seq, why = stack.pop()
            # (The list stays while the dead job is kept: if it is redriven and acked,
            # its dead dependents keep its result for their own redrive, DEP-5.)
            waiting = dependents.get(seq)
            if not waiting:
                continue
            for row in list(waiting.values()):
                if row.state is not WAITING:
                    continue
                queue = row.queue
                queue._unlink(row, now)
                queue._kill(row, why, now, spread=False)
                if row.seq in dependents:
                    stack.append((row.seq, _died(self._format_id(row.seq), why)))

    def _register(self, row: _Row) -> None:
        """List a dead row under its dependencies not acked yet, live or dead (see
        ``_dependents``): one dying as it is linked, or restored from a store."""
        met = row.met
        assert met is not None
        rows = self._rows
        for seq in row.after:
            dep = rows.get(seq)
            if seq not in met and dep is not None and dep.state is not COMPLETED:
                self._dependents.setdefault(seq, {})[row.seq] = row

    def _unhook(self, row: _Row) -> None:
        """Take a deleted row off the lists of the dependencies it was waiting for."""
        met = row.met
        assert met is not None
        dependents = self._dependents
        for seq in row.after:
            if seq in met:
                continue
            waiting = dependents.get(seq)
            if waiting is not None:
                waiting.pop(row.seq, None)
                if not waiting:
                    del dependents[seq]
        row.unmet = 0

    def dependency_results(self, job_id: str) -> list[tuple[str, bytes | None]] | None:
        """The results of the dependencies of ``job_id`` whose acks landed, as ``(id,
        encoded JSON or None)`` in the order its enqueue named them (DEP-2); ``None``
        for an id with no job. Kept as long as the job is."""
        row = self._lookup(job_id)
        if row is None:
            return None
        met = row.met
        if not met:
            return []
        fmt = self._format_id
        return [(fmt(seq), met[seq]) for seq in row.after if seq in met]

    def ack(self, job_id: str, lease: str, result: bytes | None = None) -> bool:
        if result is not None:
            guard.result(result, self.max_payload_bytes)
        row = self._claimed(job_id, lease)
        return row is not None and row._opts.queue._ack(row, lease, self._now(), result)

    # -- following (RES-5, RES-6) -----------------------------------------------------------

    def watch(self, job_id: str) -> Finish | None:
        """Follow ``job_id``: ``None`` for a live (pending or processing) job, which is
        watched from now on (its end comes through ``take_finished()``); else what is
        known already, not watched: a ``Finish`` for a job finished and kept (completed
        or dead), or one of state ``"unknown"`` (queue ``""``) for an id with no job."""
        row = self._lookup(job_id)
        if row is None:
            return Finish(job_id, "", "unknown", None, None)
        state = row.state
        if state is COMPLETED:
            return Finish(job_id, row.queue.name, "completed", row.result, None)
        if state is DEAD:
            return Finish(job_id, row.queue.name, "dead", None, row.last_error)
        self._watched.add(row.seq)
        return None

    def unwatch(self, job_id: str) -> None:
        """Stop following ``job_id`` (nothing if it is not followed)."""
        row = self._lookup(job_id)
        if row is not None:
            self._watched.discard(row.seq)

    def take_finished(self) -> list[Finish]:
        """The followed jobs that finished since the last call, in the order they did;
        each is followed no more."""
        finished = self._finished
        if finished:
            self._finished = []
        return finished

    # -- progress and watching (PRG-1 on) ----------------------------------------------

    def progress_many(
        self, items: Sequence[tuple[str, str, bytes]]
    ) -> list[bool | InvalidArgument]:
        """Store each ``(job_id, lease, progress)`` on its own (PRG-1): whether it landed
        (only under a valid lease; a stale one stores nothing), or why it was refused
        (``progress`` not encoded JSON bytes, or over ``MAX_PROGRESS_BYTES``: PRG-3).
        The latest value replaces the job's last one (PRG-2)."""
        now = self._now()
        limit = min(MAX_PROGRESS_BYTES, self.max_payload_bytes)
        journal = self._journal
        observed = self._observed
        answers: list[bool | InvalidArgument] = []
        for job_id, lease, value in items:
            try:
                guard.progress(value, limit)
            except InvalidArgument as exc:
                answers.append(exc)
                continue
            row = self._claimed(job_id, lease)
            if row is None or not row._opts.queue._valid(row, lease, now):
                answers.append(False)
                continue
            row.progress = value
            if journal is not None:
                self._journal_progress[row.seq] = row
            if observed and row.seq in observed:
                self._steps.append(Step(job_id, "progress", row.attempts, value))
            answers.append(True)
        return answers

    def observe(self, job_id: str) -> Job | None:
        """Watch ``job_id`` (PRG-5): its snapshot now, or ``None`` for an id with no job.
        A live (pending or processing) job is watched from then on: its steps come
        through ``take_steps()`` and its end through ``take_finished()``, as a followed
        job's. A finished one is not watched."""
        row = self._lookup(job_id)
        if row is None:
            return None
        if row.state is PENDING or row.state is PROCESSING:
            self._watched.add(row.seq)
            self._observed.add(row.seq)
        return self._snapshot(row)

    def unobserve(self, job_id: str) -> None:
        """Stop watching ``job_id``'s steps (its end stays followed while ``watch`` is
        in force: ``unwatch`` ends that)."""
        row = self._lookup(job_id)
        if row is not None:
            self._observed.discard(row.seq)

    def take_steps(self) -> list[Step]:
        """The steps of watched jobs since the last call, in the order they were made."""
        steps = self._steps
        if steps:
            self._steps = []
        return steps

    def _step(self, row: _Row, reason: str, error: str | None, attempt: int | None = None) -> None:
        """A watched row's attempt (``attempt``, else its last) ended and it will run
        again (PRG-5)."""
        ended = row.attempts if attempt is None else attempt
        self._steps.append(Step(self._format_id(row.seq), "retry", ended, None, reason, error))

    def _finish(self, row: _Row, state: str, result: bytes | None, error: str | None) -> None:
        self._watched.discard(row.seq)
        self._observed.discard(row.seq)
        self._finished.append(
            Finish(self._format_id(row.seq), row._opts.queue.name, state, result, error)
        )

    def ack_many(
        self,
        pairs: Sequence[tuple[str, str]],
        results: Sequence[bytes | None] | None = None,
    ) -> list[bool]:
        """``ack`` for each ``(job_id, lease)``, in order, all at one instant: the clock is
        read once for the batch. Returns whether each landed. ``results[i]``: the
        encoded JSON result of ``pairs[i]`` (``None``: none), stored only by an ack that
        lands (RES-1). A result over ``max_payload_bytes`` raises ``InvalidArgument``
        (field ``result``, RES-2) before any pair is acked."""
        now = self._now()
        lookup = self._lookup
        leased = self._leased
        landed = []
        if results is None:
            for job_id, lease in pairs:
                # _claimed, inlined: this is the drain's hot loop.
                entry = leased.get(lease) if lease.__class__ is str else None
                row = entry[1] if entry is not None and entry[0] == job_id else lookup(job_id)
                landed.append(row is not None and row._opts.queue._ack(row, lease, now))
            return landed
        if len(results) != len(pairs):
            raise InvalidArgument("result", "must be one per lease")
        limit = self.max_payload_bytes
        for result in results:
            if result is not None:
                guard.result(result, limit)
        for (job_id, lease), result in zip(pairs, results, strict=True):
            entry = leased.get(lease) if lease.__class__ is str else None
            row = entry[1] if entry is not None and entry[0] == job_id else lookup(job_id)
            landed.append(row is not None and row._opts.queue._ack(row, lease, now, result))
        return landed

    def retry(
        self, job_id: str, lease: str, error: str | None = None, delay_s: float | None = None
    ) -> bool:
        row = self._claimed(job_id, lease)
        if row is None:
            # The guards hold for unknown ids too: a bad argument is never "False" (HND-3).
            guard.optional(guard.nonneg, "delay_s", delay_s)
            guard.error_text("error", error)
            return False
        return row.queue._retry(row, lease, error, delay_s)

    def fail(self, job_id: str, lease: str, error: str | None = None) -> bool:
        row = self._claimed(job_id, lease)
        if row is None:
            guard.error_text("error", error)
            return False
        return row.queue._fail(row, lease, error)

    def heartbeat(self, job_id: str, lease: str) -> bool:
        row = self._claimed(job_id, lease)
        return row is not None and row.queue._heartbeat(row, lease)

    def back_off(
        self,
        job_id: str,
        lease: str,
        delay_s: float,
        partition: str | None = None,
        whole_queue: bool = False,
    ) -> bool:
        """The job back to ready without spending its attempt, and its key (``partition``,
        or the whole queue) held for ``delay_s`` seconds (FLW-6). ``False`` for a lease
        that is not valid (nothing changed); ``InvalidArgument`` for a bad argument."""
        row = self._claimed(job_id, lease)
        args = _back_off_args(delay_s, partition, whole_queue)
        return row is not None and row.queue._back_off(row, lease, *args)

    def take_freed(self) -> list[str]:
        """The queues where a slot freed (FLW-2) or limits changed since the last call:
        waiting workers may get jobs there now."""
        freed = self._freed
        if not freed:
            return []
        self._freed = set()
        return [queue.name for queue in freed]

    def lapse(self, job_id: str, lease: str) -> bool:
        """End a valid lease now: the job is reclaimable at once, its attempt consumed
        (HND-11)."""
        row = self._claimed(job_id, lease)
        return row is not None and row.queue._lapse(row, lease)

    # -- time-driven work -----------------------------------------------------------------

    def sweep_expired(self) -> SweepResult:
        """``sweep_expired()`` on every queue, summed (DLQ-5)."""
        total = SweepResult()
        for queue in self._queues.values():
            total = total + queue.sweep_expired()
        return total

    def next_event_at(self) -> float | None:
        """The earliest time anything timed happens, or ``None`` if nothing is timed (TIM-4).

        That is the earliest of: a scheduled job maturing, a lease lapsing, a job
        expiring, a dead row's retention ending, an un-paused schedule's next tick. A
        time at or before now means a sweep, or ``fire_schedules()``, is due now. Jobs
        already claimable are not events: the caller claims them when it has room.

        O(log queues) for each queue changed since the last call, not O(queues): the
        dispatcher asks after every pass. Each queue's next event sits in one heap; a
        change to a queue (every row change goes through ``_touch``) marks it for a fresh
        look, and so does its event coming due, since a job maturing is no event.
        Schedules keep their next ticks in a heap of their own: its top, O(1).
        """
        at = self._next_queue_event(self._now())
        tick = self._schedules.next_at()
        if tick is not None and (at is None or tick < at):
            return tick
        return at

    def _next_queue_event(self, now: float) -> float | None:
        """``next_event_at`` of the queues alone."""
        events = self._events
        dirty = self._timing_dirty
        looked: set[Queue] | None = None
        while True:
            while dirty:
                queue = dirty.pop()
                if looked is None:
                    looked = set()
                looked.add(queue)
                t = queue._next_event_at(now)
                dirty.discard(queue)  # (its own advance above may have marked it again)
                entry = queue._event_entry
                if entry is not None:
                    if entry[0] == t:
                        continue
                    events.forget(queue)
                if t is not None:
                    events.push((t, queue._order, queue))
            entry = events.top()
            if entry is None:
                return None
            if entry[0] > now or (looked is not None and entry[-1] in looked):
                return float(entry[0])
            dirty.add(entry[-1])  # its time has come: look again

    # -- what a store needs ---------------------------------------------------------------

    def start_journal(self) -> None:
        """Record every change from now on, for ``take_changes()`` (a durable store calls it)."""
        if self._journal is None:
            self._journal = {}

    @property
    def has_changes(self) -> bool:
        """Whether anything changed since the last ``take_changes()``."""
        return (
            bool(self._journal)
            or bool(self._journal_queues)
            or self._schedules.has_changes
            or bool(self._journal_progress)
            or bool(self._journal_new_edges or self._journal_met or self._journal_gone)
        )

    def take_changes(self) -> Changes:
        """What changed since the last call, as plain tuples a store can write as they are.

        A row enqueued since the last call comes whole, as a ``ROW_FIELDS`` tuple
        (``upserts``); a row the store already holds comes as an ``UPDATE_FIELDS`` tuple
        (``updates``: only the fields a row's life changes, not its payload), or as a
        ``CLAIM_FIELDS`` tuple when claims are all that changed it (``claims``); a deleted
        row as its seq (``deleted``; a row enqueued and deleted since the last call comes
        not at all). Each changed queue comes as ``QUEUE_FIELDS``, each changed schedule
        whole as ``SCHEDULE_FIELDS`` (``schedules``) and each deleted one as its id
        (``schedules_deleted``): a store writes them all in one transaction, the jobs a
        tick made with the schedule's progress (SCH-3). Call it on the thread
        that uses the table: the tuples are snapshots, safe to hand to another thread
        afterwards.
        """
        journal = self._journal
        if journal is None:
            raise RuntimeError("take_changes() needs start_journal() first")
        new = self._journal_new
        claimed = self._journal_claims
        upserts = []
        updates = []
        claims = []
        deleted = []
        for seq, row in journal.items():
            state = row.state
            if state is None:
                if seq not in new:
                    deleted.append(seq)
            elif seq in new:
                upserts.append(_row_tuple(row))
            elif seq in claimed and (held := row._held) is not None:
                claims.append(
                    (
                        _STATE_TEXT[state],
                        row.attempts,
                        held[1],
                        held[2],
                        held[0],
                        seq,
                    )
                )
            else:
                updates.append(_update_tuple(row))
        queues = [_queue_tuple(queue) for queue in self._journal_queues]
        progress = [
            (row.progress, seq)
            for seq, row in self._journal_progress.items()
            if row.state is not None
        ]
        self._journal_progress = {}
        self._journal = {}
        self._journal_new = set()
        self._journal_claims = set()
        self._journal_queues = set()
        meta = (self.id_prefix, self._seq, self._leases_issued)
        schedules, schedules_deleted = self._schedules.take()
        edges, met, gone = self._journal_new_edges, self._journal_met, self._journal_gone
        if edges or met or gone:
            self._journal_new_edges, self._journal_met, self._journal_gone = [], [], []
        return Changes(
            upserts,
            deleted,
            queues,
            meta,
            updates,
            claims,
            schedules,
            schedules_deleted,
            edges,
            met,
            gone,
            progress=progress,
        )

    def held_leases(self) -> list[tuple[str, str, str]]:
        """``(job id, lease, worker id)`` of every job under a valid lease now, in no order.

        A broker started on a restored table gives these to its dispatcher: the restart
        dropped every connection, so their workers get the disconnect grace to re-attach
        them, as after any dropped connection. O(jobs under a lease).
        """
        now = self._now()
        held = []
        for queue in self._queues.values():
            queue._advance(now)
            for entry in queue._leases.entries():
                row: _Row = entry[-1]
                lease, worker_id = row.lease, row.worker_id
                if row._entry is entry and lease is not None and worker_id is not None:
                    if queue._valid(row, lease, now):
                        held.append((self._format_id(row.seq), lease, worker_id))
        return held

    @classmethod
    def restore(
        cls,
        meta: tuple[str, int, int],
        queues: Iterable[tuple[Any, ...]],
        rows: Iterable[tuple[Any, ...]],
        *,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
        max_payload_bytes: int = 1 << 20,
        schedules: Iterable[tuple[Any, ...]] = (),
        progress: Iterable[tuple[int, bytes]] = (),
        edges: Iterable[tuple[Any, ...]] = (),
    ) -> JobTable:
        """A table rebuilt from what ``take_changes()`` gave a store, journal on.

        ``meta`` is ``(id_prefix, seq, leases_issued)``; ``queues`` are ``QUEUE_FIELDS``
        tuples, ``rows`` ``ROW_FIELDS`` tuples and ``schedules`` ``SCHEDULE_FIELDS``
        tuples, in any order; ``edges`` are ``DEP_FIELDS`` tuples. A schedule keeps its
        progress: a ``next_at`` already past fires at the first ``fire_schedules()``, by
        its ``missed`` policy (SCH-4). Leases
        valid at the save stay valid until their deadline. Raises ``ValueError`` for a
        row that names an unknown state. Costs O(n) (heaps are built in one go, not row by row).
        """
        id_prefix, seq, leases_issued = meta
        table = cls(clock=clock, rng=rng, id_prefix=id_prefix, max_payload_bytes=max_payload_bytes)
        table._seq = seq
        table._leases_issued = leases_issued
        for name, paused, *totals, limits in queues:
            queue = table.queue(name)
            queue._paused = bool(paused)
            queue._totals = [int(t) for t in totals]
            queue._flow.set_limits(_limits_from_text(limits), table._now())
        now = table._now()
        dead: list[_Row] = []
        completed: list[_Row] = []
        keyed: list[_Row] = []
        waiting: list[_Row] = []
        # The last (ready time, seq) each queue's priority line of fresh rows took, and
        # the last enqueue time read (rows of one batch share it, as they did when made).
        lines: dict[tuple[Queue, int], tuple[float, int]] = {}
        shared_at: float | None = None
        for values in rows:
            row = _row_from_tuple(table, values)
            if row.enqueued_at == shared_at:
                row.enqueued_at = shared_at
            shared_at = row.enqueued_at
            if row.ready_at == shared_at:
                row.ready_at = shared_at
            table._rows[row.seq] = row
            queue = row._opts.queue
            if row.key is not None:
                queue._keys[row.key] = row
            if row.state is DEAD:
                dead.append(row)
                continue
            if row.state is COMPLETED:
                completed.append(row)
                continue
            if row.expires_at is not None:
                queue._expiry.append((row.expires_at, row.seq, row))
            if row.state is WAITING:
                waiting.append(row)
                queue._n_waiting += 1
            elif row.state is PENDING:
                if row.ready_at > now:
                    queue._scheduled.append((row.ready_at, row.seq, row))
                    queue._n_scheduled += 1
                elif row.partition is None:
                    # A row ready since its enqueue goes back to its priority's line of
                    # fresh rows (see Fifo: 8 bytes, where the heap and listing entries
                    # take about 300) when it comes after that line's last, as it does
                    # when the rows come in seq order; any other to the heap.
                    line = (queue, row.priority)
                    place = (row.ready_at, row.seq)
                    if row.ready_at == row.enqueued_at and lines.get(line, _BEFORE_ALL) < place:
                        lines[line] = place
                        queue._fresh.append(row)
                        row._heap = queue._fresh
                    else:
                        queue._ready.append((-row.priority, row.ready_at, row.seq, row))
                    queue._n_ready += 1
                else:
                    keyed.append(row)  # filed in its key's heap once the rest stands
            else:
                assert row.deadline is not None
                queue._leases.append((row.deadline, row.seq, row))
                queue._n_processing += 1
                # Its slot is held from the table (FLW-9); a lapse on the first look
                # frees it as any other.
                queue._flow.held += 1
                if row.partition is not None:
                    queue._flow.part(row.partition).held += 1
        dead.sort(key=lambda r: (r.died_at, r.seq))
        for row in dead:
            row.queue._dead[row.seq] = row
        completed.sort(key=lambda r: (r.completed_at, r.seq))
        for row in completed:
            row.queue._completed[row.seq] = row
        table._restore_edges(edges, waiting)
        waiting_in: dict[Queue, list[_Row]] = {}
        for row in waiting:
            waiting_in.setdefault(row.queue, []).append(row)
        for queue in table._queues.values():
            for heap in (queue._ready, queue._scheduled, queue._leases):
                heap.rebuild()
                for entry in heap.entries():
                    entry[-1]._heap = heap
            queue._expiry.rebuild()
            queue._restore_indexes(waiting_in.get(queue, ()))
        for row in keyed:  # O(log n) each (keyed rows are not in the bulk-built heaps)
            row.queue._make_ready(row, now)
            row.queue._n_ready += 1
        table._schedules.restore(schedules)
        rows_by_seq = table._rows
        for seq, value in progress:  # ``(seq, progress)`` of the rows that have one
            found = rows_by_seq.get(seq)
            if found is not None:
                found.progress = value
        table.start_journal()
        return table

    def _restore_edges(self, edges: Iterable[tuple[Any, ...]], waiting: list[_Row]) -> None:
        """Put the stored edges back on their rows, and each waiting row on the lists
        of the dependencies it still waits for (O(edges))."""
        found: dict[int, list[tuple[int, int, bool, bytes | None]]] = {}
        rows = self._rows
        for seq, dep, pos, met, result in edges:
            if seq in rows:
                found.setdefault(seq, []).append(
                    (pos, dep, bool(met), None if result is None else bytes(result))
                )
        for seq, items in found.items():
            row = rows[seq]
            items.sort()
            row.after = tuple(item[1] for item in items)
            row.met = {dep: result for _, dep, met, result in items if met}
        for row in waiting:
            if row.met is None:  # (no edges: nothing to wait for, a store's mistake)
                raise ValueError(f"row {row.seq}: waiting without dependencies")
            if self._link(row) is not None or not row.unmet:
                raise ValueError(f"row {row.seq}: waiting for nothing it can get")
        for seq in found:
            row = rows[seq]
            if row.state is DEAD:
                self._register(row)

    # -- internals ------------------------------------------------------------------------

    def _touch(self, row: _Row) -> None:
        self._timing_dirty.add(row._opts.queue)
        journal = self._journal
        if journal is not None:
            journal[row.seq] = row
            self._journal_claims.discard(row.seq)
            self._journal_queues.add(row._opts.queue)

    def _journal_claim(self, row: _Row) -> None:
        """``_touch`` for a claim, which changes only the ``CLAIM_FIELDS`` of a row and
        no queue total: unless the row changed otherwise since the last take, the store
        gets just those (most of a durable drain's writes are claims). The caller, which
        has a journal, marks the queue's timing once for all its claims."""
        journal = self._journal
        assert journal is not None
        if row.seq not in journal:
            journal[row.seq] = row
            self._journal_claims.add(row.seq)

    def _touch_queue(self, queue: Queue) -> None:
        self._timing_dirty.add(queue)
        if self._journal is not None:
            self._journal_queues.add(queue)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _format_id(self, seq: int) -> str:
        return f"{self.id_prefix}{seq:x}"

    def _claimed(self, job_id: object, lease: object) -> _Row | None:
        """The live row ``job_id`` names, for a report that holds ``lease``: found by the
        lease when this table issued it for that job (``_leased``), else by the id. The
        caller still checks the lease (``Queue._valid``)."""
        entry = self._leased.get(lease) if lease.__class__ is str else None
        if entry is not None and entry[0] == job_id:
            return entry[1]
        return self._lookup(job_id)

    def _lookup(self, job_id: object) -> _Row | None:
        """The live row an id names, or ``None`` (any malformed id names nothing)."""
        if not isinstance(job_id, str) or not job_id.startswith(self.id_prefix):
            return None
        digits = job_id[len(self.id_prefix) :]
        # Only the canonical form, the one the table wrote, names a row: lowercase hex
        # digits with no leading zero (int() would also take "+1f", " 1f", "1_f", "0x1f",
        # "01f" and "1F"). At most 32 digits: a 128-bit sequence is more than any table
        # reaches. (Checked this way, not by formatting the number back and comparing,
        # which showed in an ack's profile.)
        if not 0 < len(digits) <= 32 or digits[0] == "0" or digits.strip(_HEX_DIGITS):
            return None
        return self._rows.get(int(digits, 16))

    def _snapshot(self, row: _Row, changing: tuple[Any, ...] | None = None) -> Job:
        """The row as a ``Job``. ``changing``: the values of its changing fields to show
        instead of the row's (state, attempts, worker_id, deadline, ready_at, last_error,
        died_at), for a claim's snapshot of a row that may have moved on since."""
        if changing is None:
            changing = (
                row.state,
                row.attempts,
                row.worker_id,
                row.deadline,
                row.ready_at,
                row.last_error,
                row.died_at,
            )
        state, attempts, worker_id, deadline, ready_at, last_error, died_at = changing
        assert state is not None
        return Job(
            id=self._format_id(row.seq),
            queue=row.queue.name,
            state=state,
            payload_json=row.payload,
            priority=row.priority,
            attempts=attempts,
            max_attempts=row.max_attempts,
            visibility_timeout_s=row.visibility_timeout_s,
            backoff_base_s=row.backoff_base_s,
            backoff_max_s=row.backoff_max_s,
            enqueued_at=row.enqueued_at,
            ready_at=ready_at,
            expires_at=row.expires_at,
            worker_id=worker_id,
            deadline=deadline,
            last_error=last_error,
            died_at=died_at,
            key=row.key,
            seq=row.seq,
            timeout_s=row.timeout_s,
            partition=row.partition,
            result_json=row.result,
            completed_at=row.completed_at,
            progress_json=row.progress,
            after=tuple(self._format_id(seq) for seq in row.after) if row.after else (),
            waiting_for=row.unmet if state is WAITING else 0,
        )


#: The order of a row tuple in ``take_changes()`` and ``restore()``: the stored columns.
ROW_FIELDS = (
    "seq",
    "queue",
    "state",
    "payload",
    "priority",
    "attempts",
    "max_attempts",
    "visibility_timeout_s",
    "backoff_base_s",
    "backoff_max_s",
    "enqueued_at",
    "ready_at",
    "expires_at",
    "worker_id",
    "deadline",
    "lease",
    "last_error",
    "died_at",
    "key",
    "timeout_s",
    "partition",
    "result",
    "completed_at",
)

#: The order of an update tuple: the fields a stored row's life changes, then its seq.
#: Every other field is fixed at enqueue (a test pins this list against the transitions).
UPDATE_FIELDS = (
    "state",
    "attempts",
    "ready_at",
    "worker_id",
    "deadline",
    "lease",
    "last_error",
    "died_at",
    "result",
    "completed_at",
    "seq",
)

#: The order of an edge tuple (``Changes.edges``, ``restore``'s ``edges``): the dependent
#: job's seq, its dependency's seq, the dependency's place in its ``after``, whether
#: that dependency's ack landed, and the result it stored (DEP-1, DEP-2).
DEP_FIELDS = ("seq", "dep", "pos", "met", "result")

#: The order of a claims tuple of ``Changes``: the fields a claim sets, then the seq.
CLAIM_FIELDS = ("state", "attempts", "worker_id", "deadline", "lease", "seq")

#: The order of a queue tuple: its name, whether paused, its running totals, and its
#: limits (FLW-9) as JSON text (``None`` for none).
QUEUE_FIELDS = (
    "name",
    "paused",
    "enqueued",
    "completed",
    "retried",
    "dead",
    "expired",
    "cancelled",
    "limits",
)


class Changes(NamedTuple):
    """What ``JobTable.take_changes()`` returns."""

    upserts: list[tuple[Any, ...]]  # ROW_FIELDS tuples
    deleted: list[int]  # seqs
    queues: list[tuple[Any, ...]]  # QUEUE_FIELDS tuples
    meta: tuple[str, int, int]  # id_prefix, last seq, leases issued
    updates: list[tuple[Any, ...]]  # UPDATE_FIELDS tuples
    claims: list[tuple[Any, ...]]  # CLAIM_FIELDS tuples
    # (These two last, with defaults, so that a Changes made without them still is one.)
    schedules: list[tuple[Any, ...]] = []  # SCHEDULE_FIELDS tuples  # noqa: RUF012
    schedules_deleted: list[str] = []  # ids  # noqa: RUF012
    # Dependencies (DEP-1 on): new edges (DEP_FIELDS tuples), acks meeting stored edges
    # as (result, seq, dep), and the seqs of deleted rows whose edges go with them.
    edges: list[tuple[Any, ...]] = []  # noqa: RUF012
    edges_met: list[tuple[Any, ...]] = []  # noqa: RUF012
    edges_deleted: list[int] = []  # noqa: RUF012
    # (progress, seq) of each live row whose progress changed: the latest only (PRG-2).
    progress: list[tuple[bytes | None, int]] = []  # noqa: RUF012


def _row_tuple(row: _Row) -> tuple[Any, ...]:
    state = row.state
    assert state is not None
    return (
        row.seq,
        row._opts.queue.name,
        _STATE_TEXT[state],
        row.payload,
        row.priority,
        row.attempts,
        row.max_attempts,
        row.visibility_timeout_s,
        row.backoff_base_s,
        row.backoff_max_s,
        row.enqueued_at,
        row.ready_at,
        row.expires_at,
        row.worker_id,
        row.deadline,
        row.lease,
        row.last_error,
        row.died_at,
        row.key,
        row.timeout_s,
        row.partition,
        row.result,
        row.completed_at,
    )


def _update_tuple(row: _Row) -> tuple[Any, ...]:
    state = row.state
    assert state is not None
    return (
        _STATE_TEXT[state],
        row.attempts,
        row.ready_at,
        row.worker_id,
        row.deadline,
        row.lease,
        row.last_error,
        row.died_at,
        row.result,
        row.completed_at,
        row.seq,
    )


def _queue_tuple(queue: Queue) -> tuple[Any, ...]:
    limits = queue._flow.limits
    text = json.dumps(limits.as_dict(), separators=(",", ":")) if limits.any else None
    return (queue.name, queue._paused, *queue._totals, text)


def _limits_from_text(text: str | None) -> Limits:
    """The limits a queue tuple holds (``QUEUE_FIELDS``' last), checked as if set anew."""
    if not text:
        return Limits()
    values = json.loads(text)
    return guard.check_limits(Limits(**{k: v for k, v in values.items() if k in LIMIT_FIELDS}))


def _row_from_tuple(table: JobTable, values: tuple[Any, ...]) -> _Row:
    (
        seq,
        queue_name,
        state,
        payload,
        priority,
        attempts,
        max_attempts,
        visibility,
        base,
        cap,
        enqueued_at,
        ready_at,
        expires_at,
        worker_id,
        deadline,
        lease,
        last_error,
        died_at,
        key,
        timeout_s,
        partition,
        *finished,
    ) = values
    row = _Row(
        seq,
        table.queue(queue_name),
        bytes(payload),
        priority,
        max_attempts,
        visibility,
        base,
        cap,
        enqueued_at,
        ready_at,
        expires_at,
        key,
        timeout_s,
        partition,
    )
    row.state = JobState(state)
    row.attempts = attempts
    if lease is not None or worker_id is not None or deadline is not None:
        row._held = (lease, worker_id, deadline)
    row.last_error = last_error
    row.died_at = died_at
    if finished:  # (tuples of stores written before results have no such fields)
        result, row.completed_at = finished
        row.result = None if result is None else bytes(result)
    if row.state is PROCESSING and (lease is None or deadline is None):
        raise ValueError(f"row {seq}: processing without a lease")
    return row
