"""The backend interface: where the job table lives, as the broker's server needs it.

Every call is batch-shaped, so that a backend whose table lives in a database server
(network round trips, several brokers changing one table) answers a whole batch in one
round trip, and none assumes that this process alone changes the table: what a call
returns is what the table said at that call, and a change made elsewhere reaches this
broker through its ``Listener``.

The rules each call follows are the job contract's (``docs/contract.md``; the ids are
cited below). What a backend adds is *when*:

- Calls take effect in the order they are made.
- Each call returns a ``Pending`` result: awaitable, and ``done()`` once the result is
  there. The local backend's results are there when the call returns (the engine
  decides at once); a database server's come with its answer.
- A frame made from a result goes out through the backend's ``gate``
  (``broker/egress.py`` says what each kind of frame waits for there): the local
  backend's commit gate holds it until the change is written or durable; a backend whose
  results come only once committed has nothing left to wait for (``IMMEDIATE``).
  *Durable* is as durable as the backend promises: nothing for memory; on disk, and with
  ``--sync full`` synced, for SQLite; committed for a database server.
- Read-only calls (``get_jobs``, ``stats``, ``dead_jobs``, ``queues``) see every change
  made before them, durable or not (their frames wait in the gate like any other).
- A backend that fails (a store that cannot write) raises ``BackendError`` from its
  calls, or fails their results with it; the broker must then stop. A backend that
  cannot answer *now* (a database server out of reach) fails the results of the calls it
  could not make with a ``BackendError`` too (the PostgreSQL backend's ``Unavailable``),
  without stopping: such a call is never reported as done (one cut off at its commit
  may still have happened), and later calls may succeed. Bad arguments raise
  the engine's ``InvalidArgument`` (its ``.field`` names the argument) and change
  nothing, except where a batch's items stand alone (``enqueue``, ``report``): there an
  item's error is its result.

Listeners are told of a change once it is made (the local backend: within the call),
from the event loop, and must not raise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from ..egress import Gate
from ..engine import (
    InvalidArgument,
    Job,
    Limits,
    NewJob,
    QueueOpts,
    QueueStats,
    ScheduleInfo,
    ScheduleSpec,
    Step,
    SweepResult,
)
from ..store import StoreError

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

__all__ = [
    "BackOff",
    "Backend",
    "BackendError",
    "Claim",
    "Claimed",
    "Enqueue",
    "Finished",
    "JobList",
    "Later",
    "Listener",
    "Pending",
    "Progress",
    "Ready",
    "Report",
    "Step",
    "WatchEvent",
    "ready",
    "then",
    "unknown",
]

# A backend's failure is a store's failure: the broker stops on either.
BackendError = StoreError

#: How many dead jobs ``redrive_all`` moves per step: each step is its own engine call
#: and commit (its own transaction for PostgreSQL), so that a million dead letters never
#: hold the event loop, or a table's locks, for the whole move.
REDRIVE_CHUNK = 10_000


class JobList(NamedTuple):
    """A page of ``list_jobs``: the jobs, the key after which the next page starts
    (``None``: no job of that state follows), and the count of that state in the queue,
    read from its counters (CST-4)."""

    jobs: list[Job]
    next: tuple[Any, ...] | None
    total: int


class Pending(Protocol[T_co]):
    """A call's result: awaitable, and readable once ``done()`` (``asyncio.Future`` is
    one; so are ``Ready`` and ``Later``)."""

    def done(self) -> bool: ...

    def result(self) -> T_co:
        """The result (raises what the call raised); only once ``done()``."""
        ...

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None:
        """Call ``fn(self)`` once ``done()`` (at once if it is already)."""
        ...

    def __await__(self) -> Generator[Any, None, T_co]: ...


class Ready(Generic[T]):
    """A result there at once: no event loop, no future, nothing scheduled."""

    __slots__ = ("_value",)

    def __init__(self, value: T) -> None:
        self._value = value

    def done(self) -> bool:
        return True

    def result(self) -> T:
        return self._value

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None:
        fn(self)

    def __await__(self) -> Generator[Any, None, T]:
        return self._value
        yield  # (a generator that yields nothing: awaiting it returns at once)


U = TypeVar("U")

_UNSET: Any = object()


class Later(Generic[T]):
    """A result made from another that is still to come (``then``).

    Unlike an ``asyncio.Future``, its callbacks run in the call that settles it, not at
    a later turn of the loop: a frame made from the result is queued in the same
    callback as the result came, so frames keep the order their results came in.
    """

    __slots__ = ("_callbacks", "_error", "_value")

    def __init__(self) -> None:
        self._value: T = _UNSET
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Any], object]] = []

    def done(self) -> bool:
        return self._value is not _UNSET or self._error is not None

    def result(self) -> T:
        if self._error is not None:
            raise self._error
        if self._value is _UNSET:
            raise RuntimeError("result: not there yet")
        return self._value

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None:
        if self.done():
            fn(self)
        else:
            self._callbacks.append(fn)

    def settle(self, make: Callable[[], T]) -> None:
        """Take ``make()``'s value, or what it raised, as the result; run the callbacks."""
        try:
            self._value = make()
        except BaseException as exc:  # (a call cancelled at close, too: nobody waits for ever)
            self._error = exc
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)

    def __await__(self) -> Generator[Any, None, T]:
        if not self.done():
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def wake(_: object) -> None:
                if not future.done():
                    future.set_result(None)

            self.add_done_callback(wake)
            yield from future
        return self.result()


def then(result: Pending[T], fn: Callable[[T], U]) -> Pending[U]:
    """``fn`` of ``result``'s value, as a result: made at once (``Ready``, and what
    ``fn`` raises is raised here) when ``result`` is there already, the local backend's
    way; else when it comes (``Later``, carrying what ``result`` or ``fn`` raised)."""
    if result.done():
        return Ready(fn(result.result()))
    later: Later[U] = Later()
    result.add_done_callback(lambda done: later.settle(lambda: fn(done.result())))
    return later


def ready(result: Pending[T]) -> T:
    """The result of a call whose result must be there already (the local backend's,
    read where it was made: tests and tools; the server goes through ``then``)."""
    if not result.done():
        raise RuntimeError("result: not there yet (use then(), or await it)")
    return result.result()


class Enqueue(NamedTuple):
    """One job to enqueue on ``queue``: its payload and options (ENQ-2 to ENQ-10; the
    same as ``NewJob``'s). A named tuple: one is made per job on the hot path."""

    queue: str
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
    # The ids of the jobs it waits for (DEP-1); in ``enqueue_group`` an ``int`` names a
    # member of the group by its index.
    after: tuple[str | int, ...] = ()


class Finished(NamedTuple):
    """What ``follow`` tells of a job that finished (RES-5): its ``state`` is
    ``"completed"`` (acked; ``result_json`` the result its ack stored, ``None`` for
    none), ``"dead"`` (failed, attempts used up or expired; ``error`` its last error) or
    ``"cancelled"`` (cancelled or purged). ``"unknown"`` (with ``queue`` empty): no such
    job, or one that finished and was not kept."""

    id: str
    queue: str
    state: str
    result_json: bytes | None
    error: str | None


class Progress(NamedTuple):
    """A worker's progress on one lease (PRG-1): ``value_json`` the encoded JSON value."""

    id: str
    lease: str
    value_json: bytes


#: What ``watch`` tells of a watched job (PRG-5): a ``Step`` (progress, or a retry:
#: the attempt ended and the job will run again), then its end, a ``Finished``.
WatchEvent = Step | Finished


def unknown(job_id: str) -> Finished:
    """What ``follow`` answers for a job it does not know (RES-6)."""
    return Finished(job_id, "", "unknown", None, None)


class Claim(NamedTuple):
    """A worker's request for up to ``n`` jobs of ``queues``, taken in that order (an
    earlier queue's claimable job always goes first: the strict order of ``subscribe``).
    A named tuple: a dispatch pass makes one per hungry worker."""

    worker_id: str
    queues: tuple[str, ...]
    n: int


class Claimed(Protocol):
    """One job a claim handed out, with what its push carries (CLM-7). The local
    backend hands out the engine's own claim handles, which have these attributes."""

    @property
    def id(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def lease(self) -> str: ...
    @property
    def payload_json(self) -> bytes: ...
    @property
    def attempt(self) -> int:
        """This claim's attempt: the job's last when it is ``max_attempts``."""
        ...

    @property
    def max_attempts(self) -> int: ...
    @property
    def deadline(self) -> float: ...
    @property
    def priority(self) -> int: ...
    @property
    def visibility_timeout_s(self) -> float: ...
    @property
    def timeout_s(self) -> float | None:
        """The handler's time limit the enqueue gave, ``None`` for none."""
        ...

    @property
    def partition(self) -> str | None:
        """The job's partition key (FLW-3), ``None`` for none."""
        ...

    @property
    def ready_since(self) -> float:
        """When the job became claimable for this claim: its ready time, or its enqueue."""
        ...

    @property
    def dependencies(self) -> int:
        """How many jobs it depended on (DEP-2: their results are
        ``Backend.dependency_results``); 0 for none."""
        ...


@dataclass(frozen=True, slots=True)
class Report:
    """A worker's report on one lease: ``retry`` (after ``delay_s``, or the retry curve
    when ``None``) when ``retry``, else ``fail``; ``error`` as HND-4 says."""

    id: str
    lease: str
    retry: bool
    error: str | None = None
    delay_s: float | None = None


@dataclass(frozen=True, slots=True)
class BackOff:
    """A worker's "rate limited, try later" on one lease (FLW-6): the job goes back to
    ready without using an attempt, and nothing more of ``partition`` (the job's own when
    ``None``; the whole queue when ``whole_queue`` or the job has none) is handed out for
    ``delay_s`` seconds."""

    id: str
    lease: str
    delay_s: float
    partition: str | None = None
    whole_queue: bool = False


class Listener(Protocol):
    """What a backend tells the broker of changes it did not ask for, or did not see:
    time passing, another broker's enqueue or cancel."""

    def work_waiting(self, queues: frozenset[str] | None) -> None:
        """Jobs of ``queues`` (``None``: of any queue) may have become claimable."""
        ...

    def cancelled(self, job_ids: Sequence[str]) -> None:
        """These jobs were cancelled: whoever was pushed one should be told."""
        ...


class Backend(Protocol):
    """The job table as the server uses it. See the module docstring for when each call
    takes effect and when a frame made from its result may leave; each method's
    docstring names the contract rules it follows."""

    name: str
    # Whether the table outlives the process.
    durable: bool
    # Whether other brokers change this table too (a dropped worker may be back through
    # one of them; they sweep it and count it as well).
    shared: bool
    # Where frames made from results wait (broker/egress.py).
    gate: Gate
    # Why the backend cannot go on (the broker stops), once it failed; else ``None``.
    failed: StoreError | None

    def now(self) -> float:
        """The backend's clock (TIM-1): the time its calls see."""
        ...

    def listen(self, listener: Listener) -> None:
        """Tell ``listener`` of every change it should know of, from now on."""
        ...

    def enqueue(self, jobs: Sequence[Enqueue]) -> Pending[list[str | Exception]]:
        """Enqueue each job on its own, in order (the queue made on first use): its id
        (an existing job's for a key still taken, ENQ-10), or why it was refused
        (``InvalidArgument``), or what went wrong with it alone (any other exception:
        a bug, logged; the other jobs go on)."""
        ...

    def enqueue_all(self, queue: str, jobs: Sequence[NewJob]) -> Pending[list[str]]:
        """Enqueue every job on ``queue`` or none (ENQ-11); their ids, in order. Raises
        ``InvalidArgument`` naming the job (``jobs[3].delay_s``)."""
        ...

    def enqueue_group(self, jobs: Sequence[Enqueue]) -> Pending[list[str]]:
        """Enqueue every job or none (DEP-6), each on its own queue (made on first use),
        whose ``after`` may name members of the group by index as well as stored jobs
        by id; their ids, in order (a member whose key is taken gets that job's id and
        adds no edges: DEP-8). Raises ``InvalidArgument`` naming the member and field
        (``jobs[3].after[0]``: an unknown id, DEP-7), or ``DependencyCycle`` (DEP-4)."""
        ...

    def dependency_results(self, job_id: str) -> Pending[list[tuple[str, bytes | None]] | None]:
        """The results of ``job_id``'s dependencies whose acks landed, as ``(id, encoded
        JSON or None)`` in the order its enqueue named them (DEP-2): all of them once it
        is claimable. ``None``: no such job."""
        ...

    def claim(
        self, claims: Sequence[Claim], *, round_robin: bool = False
    ) -> Pending[list[list[Claimed]]]:
        """For each claim, the jobs it was handed (CLM-1 to CLM-8): at most ``n``, each
        from the first of its queues that has one. The claims are served one after the
        other, or with ``round_robin`` one job each in turn until each has its ``n`` or
        nothing is left that it may take. Queues that do not exist hand out nothing."""
        ...

    def claim_bound(self, queue: str) -> int | None:
        """No fewer than the jobs claims on ``queue`` could be handed from it now, read
        at once and without I/O (it may be more: the claim checks flow control and
        expiry); 0 for a queue that does not exist. ``None`` when the backend cannot tell
        so cheaply (a table other brokers share; a queue with partition keys in use). A
        pass offers a queue's jobs to at most
        that many of the workers waiting on it (to a fixed number for ``None``), not to
        each of them."""
        ...

    def ack(
        self,
        leases: Sequence[tuple[str, str]],
        results: Sequence[bytes | None] | None = None,
    ) -> Pending[list[bool]]:
        """Ack each ``(id, lease)`` on its own (HND-5, HND-10): whether it landed.
        ``results[i]`` is the encoded JSON of ``leases[i]``'s result (``None``: none); a
        result is stored only by the ack that lands (RES-1) and, on a queue that keeps
        finished jobs, kept with the job (RES-3). A result over the payload limit raises
        ``InvalidArgument`` (field ``result``, RES-2) before anything is acked."""
        ...

    def follow(
        self, ids: Sequence[str], on_finished: Callable[[Finished], None]
    ) -> Pending[list[Finished | None]]:
        """From now on call ``on_finished`` (on the event loop, once per job) when each
        of these jobs finishes: acked, dead (failed, attempts used up, expired), or
        cancelled or purged (RES-5). The result, per id, is what is known already: a
        ``Finished`` for a job finished and still kept (completed or dead; it is not
        followed then), ``None`` for one still pending or processing (followed), or
        ``unknown(id)`` for an id with no job (RES-6)."""
        ...

    def unfollow(self, ids: Sequence[str], on_finished: Callable[[Finished], None]) -> None:
        """Stop telling ``on_finished`` of these jobs (ids it does not follow are
        ignored)."""
        ...

    def progress(self, items: Sequence[Progress]) -> Pending[list[bool | InvalidArgument]]:
        """Store each item's value as its job's latest progress, on its own (PRG-1 to
        PRG-3): whether it landed (only under a valid lease), or the ``InvalidArgument``
        of a value over the cap (field ``progress``). Watchers of the job are told
        (``watch``)."""
        ...

    def watch(
        self, ids: Sequence[str], on_event: Callable[[WatchEvent], None]
    ) -> Pending[list[Job | Finished]]:
        """From now on call ``on_event`` (on the event loop) with each step of each of
        these jobs, then once with its end (a ``Finished``), after which it is watched
        no more (PRG-5). The result, per id: the job as it stands when the watch began
        (a ``Job``: watched), or a ``Finished`` for a job finished and kept (completed
        or dead) or ``unknown(id)`` for an id with no job (PRG-7), not watched. Steps
        may be coalesced: of progress values reported in a row, a watcher may be told
        only the latest (PRG-6)."""
        ...

    def unwatch(self, ids: Sequence[str], on_event: Callable[[WatchEvent], None]) -> None:
        """Stop telling ``on_event`` of these jobs (ids it does not watch are ignored)."""
        ...

    def report(self, reports: Sequence[Report]) -> Pending[list[bool | InvalidArgument]]:
        """Retry (HND-6) or fail (HND-7) each lease on its own: whether it landed, or
        why the report was refused (a bad ``delay_s`` or ``error``, HND-3)."""
        ...

    def back_off(self, items: Sequence[BackOff]) -> Pending[list[bool | InvalidArgument]]:
        """Each ``BackOff`` (FLW-6): whether its lease was valid (``False``: nothing
        changed), or the ``InvalidArgument`` its bad delay or partition raised."""
        ...

    def heartbeat(self, leases: Sequence[tuple[str, str]]) -> Pending[list[bool]]:
        """Extend each valid lease to now plus its job's visibility timeout (HND-8)."""
        ...

    def lapse(self, leases: Sequence[tuple[str, str]]) -> Pending[list[bool]]:
        """End each valid lease now, its attempt spent (HND-11): a worker is gone."""
        ...

    def reattach(
        self, worker_id: str, leases: Sequence[tuple[str, str]]
    ) -> Pending[list[tuple[str, str]]]:
        """The ``(id, lease)`` pairs among ``leases`` whose job ``worker_id`` still holds
        under that valid lease, each heartbeaten (a worker that reconnected)."""
        ...

    def announce(
        self, broker_id: str, info: dict[str, Any], ttl_s: float
    ) -> Pending[list[dict[str, Any]]]:
        """Say that broker ``broker_id`` is alive, as ``info`` (JSON) describes it; the
        ``info`` of every other broker on this table that said so within ``ttl_s``. A
        table of one broker's own has no others: ``[]``."""
        ...

    def held_leases(self, worker_id: str | None = None) -> Pending[list[tuple[str, str, str]]]:
        """``(id, lease, worker id)`` of every job under a valid lease now (of
        ``worker_id``'s only, when given)."""
        ...

    def cancel(self, ids: Sequence[str]) -> Pending[list[bool]]:
        """Delete each job whatever its state (OPS-2): whether it existed."""
        ...

    def get_jobs(self, ids: Sequence[str]) -> Pending[list[Job | None]]:
        """A snapshot of each job, or ``None`` (OPS-3, JOB-4)."""
        ...

    def set_queue(self, name: str, opts: QueueOpts | None = None) -> Pending[None]:
        """Make queue ``name`` if it does not exist; with ``opts``, give it those
        (ENQ-3). Raises ``InvalidArgument`` for a bad name or bad options."""
        ...

    def set_limits(self, name: str, limits: Limits) -> Pending[None]:
        """Give queue ``name`` (made if it does not exist) these flow-control limits in
        place of its old ones, from its next claim on (FLW-1, FLW-5); durable backends
        keep them. Raises ``InvalidArgument`` naming the field of a bad limit."""
        ...

    def queues(self) -> Pending[list[str]]:
        """The names of every queue, in the order they were made."""
        ...

    def pause(self, queue: str) -> Pending[None]:
        """Stop hand-outs from ``queue`` (OPS-4), making it if need be."""
        ...

    def resume(self, queue: str) -> Pending[bool]:
        """Hand out from ``queue`` again (OPS-4); ``False`` if there is no such queue."""
        ...

    def redrive(self, ids: Sequence[str]) -> Pending[list[bool]]:
        """Put each dead job back to pending (OPS-5): whether it was dead."""
        ...

    def purge_dead(self, queue: str) -> Pending[int | None]:
        """Delete ``queue``'s dead jobs (OPS-6): how many (``None``: no such queue)."""
        ...

    def dead_jobs(self, queue: str, offset: int = 0, limit: int = 20) -> Pending[list[Job]]:
        """A page of ``queue``'s dead jobs, the most recent death first."""
        ...

    def list_jobs(
        self,
        queue: str,
        state: str,
        after: tuple[Any, ...] | None = None,
        limit: int = 50,
        search: str | None = None,
    ) -> Pending[JobList | None]:
        """A page of ``queue``'s jobs in ``state`` (``ready``, ``scheduled``,
        ``processing``, ``dead``, ``completed`` or ``waiting``), in that state's order,
        starting after the key ``after`` (LST-1 to LST-4: the orders and keys are
        ``engine.Queue.list_jobs``');
        with ``search``, at most ``engine.SEARCH_SCAN`` jobs are looked at. ``None``: no
        such queue. Raises ``InvalidArgument`` for a bad state, limit or key."""
        ...

    def redrive_all(self, queue: str) -> Pending[int | None]:
        """Redrive every job dead in ``queue`` when the call is made (OPS-8): how many
        (``None``: no such queue). Done in steps of ``REDRIVE_CHUNK``, each on its own:
        not one atomic change (a job dying meanwhile may stay dead)."""
        ...

    def stats(self, queues: Sequence[str] | None = None) -> Pending[dict[str, QueueStats]]:
        """The counts of each queue named (of every queue for ``None``; CST-4); a name
        with no queue is left out."""
        ...

    # -- schedules (SCH-1 on). The backend fires each schedule's due ticks by itself, at
    # its own timer (the local backend: the table's next event; a shared table: the
    # earliest next_at of any broker's schedules), so no call here fires one; the jobs
    # a tick makes reach the listener as any other work (``work_waiting``).

    def set_schedule(self, spec: ScheduleSpec) -> Pending[ScheduleInfo]:
        """Make schedule ``spec.id``, or replace its definition (SCH-1, SCH-5): a change
        that keeps its timing keeps its progress; one that changes it fires next at the
        new timing's first tick after now. Its queue is made if it does not exist.
        Raises ``InvalidArgument`` naming the field (``cron``, ``tz``, ``priority``...)."""
        ...

    def delete_schedule(self, schedule_id: str) -> Pending[bool]:
        """Delete the schedule (the jobs it made stay): whether it existed."""
        ...

    def pause_schedule(self, schedule_id: str, paused: bool) -> Pending[ScheduleInfo | None]:
        """Pause or resume the schedule (SCH-6): a paused one makes no job, and on resume
        fires next at the first tick after now. ``None``: no such schedule."""
        ...

    def run_schedule(self, schedule_id: str) -> Pending[str | None]:
        """Make one job of the schedule now, whatever its ticks (SCH-7): the job's id;
        ``None``: no such schedule. Its next tick is unchanged."""
        ...

    def schedules(
        self, ids: Sequence[str] | None = None, after: str | None = None, limit: int = 100
    ) -> Pending[list[ScheduleInfo]]:
        """The schedules named by ``ids`` (in that order, unknown ids left out), or a page
        of every schedule in id order, starting after the id ``after``."""
        ...

    def sweep(self) -> Pending[SweepResult]:
        """Expire, kill the used-up and purge past retention now (DLQ-3 to DLQ-5)."""
        ...

    async def settle(self) -> None:
        """Return once every change made so far is durable."""
        ...

    async def close(self) -> None:
        """Make every change durable and release the backend. Idempotent."""
        ...
