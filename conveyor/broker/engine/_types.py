"""Value types of the engine: options, snapshots and results. All immutable."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "Job",
    "JobState",
    "Limits",
    "NewJob",
    "QueueOpts",
    "QueueStats",
    "QueueTotals",
    "RawJSON",
    "SweepResult",
]


class JobState(StrEnum):
    """Where a job stands. Cancelled jobs, and acked jobs of a queue that keeps no finished
    jobs, are gone, so they have no state."""

    # In by enqueue, a retry with attempts left, or a redrive; out by a claim, cancel or death.
    PENDING = "pending"
    # In by a claim (or a reclaim of a lapsed lease); out by ack, retry, fail, cancel or death.
    PROCESSING = "processing"
    # In by fail, used-up attempts or expiry; out by redrive, purge, retention or cancel.
    DEAD = "dead"
    # In by an ack of a valid lease on a queue that keeps finished jobs
    # (``completed_retention_s``); out by its retention ending (sweep) or a cancel.
    COMPLETED = "completed"
    # In by an enqueue (or a redrive) naming dependencies not all acked yet (DEP-1); out
    # to pending by the ack of its last one, to dead by one's death or cancel (DEP-3), by
    # its own expiry, or by a cancel. Never claimable.
    WAITING = "waiting"


@dataclass(frozen=True, slots=True)
class QueueOpts:
    """A queue's defaults for the jobs enqueued on it (``docs/contract.md``, ENQ-1 to ENQ-4).

    Checked by ``JobTable.queue()``, which raises ``InvalidArgument`` for a bad one.
    """

    visibility_timeout_s: float = 300.0
    max_attempts: int = 3
    backoff_base_s: float = 5.0
    backoff_max_s: float = 3600.0
    expires_s: float | None = None
    dead_letter_retention_s: float | None = None
    # Seconds to keep a job once acked, with its result (RES-3); None: an acked job is
    # deleted at once.
    completed_retention_s: float | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """A queue's flow control (``docs/contract.md``, FLW-1 to FLW-9); ``None``: no limit.

    * ``concurrency``: at most this many of the queue's jobs held under valid leases.
    * ``rate`` per ``per_s`` seconds, ``burst`` at once: claims of the queue's jobs pass
      a token bucket (GCRA) that refills ``rate`` tokens every ``per_s`` seconds and
      holds at most ``burst`` (``None``: 1, claims evenly spaced). In any stretch of
      ``t`` seconds at most ``burst + rate * t / per_s`` claims are made.
    * ``partition_*``: the same, for each partition key on its own (jobs enqueued with
      no partition are held only to the queue's limits).

    Checked by ``Queue.set_limits``, which raises ``InvalidArgument`` naming the field.
    """

    concurrency: int | None = None
    rate: int | None = None
    per_s: float = 1.0
    burst: int | None = None
    partition_concurrency: int | None = None
    partition_rate: int | None = None
    partition_per_s: float = 1.0
    partition_burst: int | None = None

    @property
    def any(self) -> bool:
        """Whether any limit is set."""
        return not (
            self.concurrency is None
            and self.rate is None
            and self.partition_concurrency is None
            and self.partition_rate is None
        )

    def given(self) -> dict[str, int | float]:
        """The limits set, by name; a period only with its rate."""
        found = {name: value for name, value in self.as_dict().items() if value is not None}
        if self.rate is None:
            del found["per_s"]
        if self.partition_rate is None:
            del found["partition_per_s"]
        return found

    def as_dict(self) -> dict[str, int | float | None]:
        """The fields by name (the wire's and the TOML file's names)."""
        return {name: getattr(self, name) for name in LIMIT_FIELDS}


#: ``Limits``' fields, in order: the names the wire, the TOML file and the stores use.
LIMIT_FIELDS = (
    "concurrency",
    "rate",
    "per_s",
    "burst",
    "partition_concurrency",
    "partition_rate",
    "partition_per_s",
    "partition_burst",
)


@dataclass(frozen=True, slots=True)
class RawJSON:
    """A payload already encoded as JSON, stored as these bytes without re-encoding.

    The caller vouches that ``data`` is one strict JSON value in UTF-8 (the broker
    passes what its JSON decoder accepted); the engine checks only its size.
    """

    data: bytes


@dataclass(frozen=True, slots=True)
class NewJob:
    """One job of ``Queue.enqueue_batch``: a payload and the same options as ``enqueue``."""

    payload: Any
    priority: int = 0
    delay_s: float | None = None
    run_at: float | None = None
    expires_s: float | None = None
    visibility_timeout_s: float | None = None
    max_attempts: int | None = None
    backoff_base_s: float | None = None
    key: str | None = None
    timeout_s: float | None = None
    partition: str | None = None
    # The ids of the jobs it waits for (DEP-1): it is claimable once each is acked.
    after: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Job:
    """A snapshot of one job, with the fields of ``docs/contract.md`` JOB-3 (OPS-3: changing
    it changes nothing)."""

    id: str
    queue: str
    state: JobState
    payload_json: bytes
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
    seq: int
    # The handler's time limit the enqueue gave (docs/worker.md); None: not set.
    timeout_s: float | None = None
    # The partition key the enqueue gave (flow control, FLW-3); None: not set.
    partition: str | None = None
    # The result its ack stored, as encoded JSON (RES-1); None: none (or not acked).
    result_json: bytes | None = None
    # When the ack that completed it landed (RES-3); None: not completed.
    completed_at: float | None = None
    # The latest progress a holder of its lease reported, as encoded JSON (PRG-1);
    # None: none reported.
    progress_json: bytes | None = None
    # The ids of the jobs it depends on, in the order the enqueue named them (DEP-1).
    after: tuple[str, ...] = ()
    # How many of them it still waits for (their acks not landed yet); 0 for none.
    waiting_for: int = 0

    @property
    def progress(self) -> Any:
        """The latest progress as a JSON value (``None`` when none was reported)."""
        return None if self.progress_json is None else json.loads(self.progress_json)

    @property
    def result(self) -> Any:
        """The result as a JSON value (``None`` when none was stored)."""
        return None if self.result_json is None else json.loads(self.result_json)

    @property
    def payload(self) -> Any:
        """The payload as a JSON value, decoded afresh at each access (a private copy)."""
        return json.loads(self.payload_json)


@dataclass(frozen=True, slots=True)
class QueueTotals:
    """Running totals of a queue since the table was made."""

    enqueued: int = 0
    completed: int = 0
    retried: int = 0
    dead: int = 0
    expired: int = 0
    cancelled: int = 0


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A queue's counts, read from counters (never by walking jobs).

    ``ready`` and ``scheduled`` split the pending jobs by ``ready_at <= now``. A job
    whose lease lapsed but that nobody has reclaimed yet still counts as processing.
    ``oldest_ready_at`` is the earliest ``ready_at`` of a ready job, ``None`` when none
    is ready: now minus it is how long the queue has kept work waiting (CST-5).

    Flow control (FLW-8): ``limited`` is how many ready jobs wait on a limit (their
    partition's, or the queue's: then every ready job), ``partitions`` how many
    partition keys have ready jobs, ``backoff_until`` when a back-off of the whole queue
    ends (``None``: none in force), and ``limits`` the queue's limits.
    """

    ready: int
    scheduled: int
    processing: int
    dead: int
    paused: bool
    totals: QueueTotals = field(default_factory=QueueTotals)
    oldest_ready_at: float | None = None
    limited: int = 0
    partitions: int = 0
    backoff_until: float | None = None
    limits: Limits = field(default_factory=Limits)
    # Finished jobs kept with their results (state COMPLETED, RES-3); not a running
    # total (that is ``totals.completed``).
    completed: int = 0
    # Jobs waiting for their dependencies (state WAITING, DEP-1): not claimable, counted
    # in neither ``ready`` nor ``scheduled``.
    waiting: int = 0

    @property
    def pending(self) -> int:
        return self.ready + self.scheduled

    def count(self, state: str) -> int:
        """How many of the queue's jobs are in ``state``: ``ready``, ``scheduled``,
        ``processing``, ``dead``, ``completed`` or ``waiting`` (JOB-5). Raises ``KeyError``
        for another name."""
        return {
            "waiting": self.waiting,
            "ready": self.ready,
            "scheduled": self.scheduled,
            "processing": self.processing,
            "dead": self.dead,
            "completed": self.completed,
        }[state]


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one ``sweep_expired()`` did: rows expired, rows whose attempts ran out, rows purged."""

    expired: int = 0
    exhausted: int = 0
    purged: int = 0

    def __add__(self, other: SweepResult) -> SweepResult:
        return SweepResult(
            self.expired + other.expired,
            self.exhausted + other.exhausted,
            self.purged + other.purged,
        )
