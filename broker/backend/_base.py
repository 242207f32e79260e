"""The backend interface: where the job table lives, as the broker's server needs it.

Every call is ``async`` and batch-shaped, so that a backend whose table lives in a
database server (network round trips, several brokers changing one table) answers a
whole batch in one round trip, and none assumes that this process alone changes the
table: what a call returns is what the table said at that call, and a change made
elsewhere reaches this broker through its ``Listener``.

The rules each call follows are the job contract's (``docs/contract.md``; the ids are
cited below). What a backend adds is when a call returns:

- A call that changes the table returns once its change is *durable*: as durable as
  the backend promises (nothing for the memory backend; on disk, and with
  ``--sync full`` synced, for SQLite; committed for a database server). A reply made
  from its result may leave at once.
- ``claim`` returns once its claims are *written* (a killed broker keeps them), and,
  when one of the jobs is on its last attempt, once they are durable: a push made from
  its result may leave at once (the rule of ``broker/egress.py``).
- Read-only calls (``get_jobs``, ``stats``, ``dead_jobs``, ``queues``) return what the
  table holds, changes not yet durable included.
- A call that cannot be carried out because the backend failed raises
  ``BackendError``; the broker must then stop. Bad arguments raise the engine's
  ``InvalidArgument`` (its ``.field`` names the argument) and change nothing, except
  in ``enqueue``, where each job stands alone and its error is its result.

Listeners are told after the change they describe is durable, from the event loop,
and must not raise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..engine import InvalidArgument, Job, NewJob, QueueOpts, QueueStats, SweepResult
from ..store import StoreError

__all__ = [
    "Backend",
    "BackendError",
    "Claim",
    "Claimed",
    "Enqueue",
    "Listener",
    "Report",
]

# A backend's failure is a store's failure: the broker stops on either.
BackendError = StoreError


@dataclass(frozen=True, slots=True)
class Enqueue:
    """One job to enqueue on ``queue`` (``NewJob``'s options, ENQ-2 to ENQ-10)."""

    queue: str
    job: NewJob


@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's request for up to ``n`` jobs of ``queues``, taken in that order (an
    earlier queue's claimable job always goes first: the strict order of ``subscribe``)."""

    worker_id: str
    queues: tuple[str, ...]
    n: int


@dataclass(frozen=True, slots=True)
class Claimed:
    """One job a claim handed out, with what its push carries (CLM-7)."""

    id: str
    queue: str
    lease: str
    payload_json: bytes
    attempt: int
    max_attempts: int
    deadline: float
    priority: int
    visibility_timeout_s: float
    # When the job became claimable for this claim: its ready time, or its enqueue.
    ready_since: float

    @property
    def last_attempt(self) -> bool:
        """Whether this claim is the job's last attempt (it must not start again)."""
        return self.attempt >= self.max_attempts


@dataclass(frozen=True, slots=True)
class Report:
    """A worker's report on one lease: ``retry`` (after ``delay_s``, or the retry curve
    when ``None``) when ``retry``, else ``fail``; ``error`` as HND-4 says."""

    id: str
    lease: str
    retry: bool
    error: str | None = None
    delay_s: float | None = None


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
    returns; each method's docstring names the contract rules it follows."""

    name: str
    # Whether the table outlives the process.
    durable: bool

    def now(self) -> float:
        """The backend's clock (TIM-1): the time its calls see."""
        ...

    def listen(self, listener: Listener) -> None:
        """Tell ``listener`` of every change it should know of, from now on."""
        ...

    async def enqueue(self, jobs: Sequence[Enqueue]) -> list[str | InvalidArgument]:
        """Enqueue each job on its own, in order (the queue made on first use): its id
        (an existing job's for a key still taken, ENQ-10), or why it was refused."""
        ...

    async def enqueue_all(self, queue: str, jobs: Sequence[NewJob]) -> list[str]:
        """Enqueue every job on ``queue`` or none (ENQ-11); their ids, in order. Raises
        ``InvalidArgument`` naming the job (``jobs[3].delay_s``)."""
        ...

    async def claim(self, claims: Sequence[Claim]) -> list[list[Claimed]]:
        """Serve each claim in the order given (CLM-1 to CLM-8): for each, the jobs it
        was handed, at most ``n``, from its queues in their order. Queues that do not
        exist hand out nothing."""
        ...

    async def ack(self, leases: Sequence[tuple[str, str]]) -> list[bool]:
        """Ack each ``(id, lease)`` on its own (HND-5, HND-10): whether it landed."""
        ...

    async def report(self, reports: Sequence[Report]) -> list[bool | InvalidArgument]:
        """Retry (HND-6) or fail (HND-7) each lease on its own: whether it landed, or
        why the report was refused (a bad ``delay_s`` or ``error``, HND-3)."""
        ...

    async def heartbeat(self, leases: Sequence[tuple[str, str]]) -> list[bool]:
        """Extend each valid lease to now plus its job's visibility timeout (HND-8)."""
        ...

    async def lapse(self, leases: Sequence[tuple[str, str]]) -> list[bool]:
        """End each valid lease now, its attempt spent (HND-11): a worker is gone."""
        ...

    async def reattach(self, worker_id: str, leases: Sequence[tuple[str, str]]) -> list[str]:
        """The ids of the jobs among ``leases`` still held by ``worker_id`` under that
        valid lease, each heartbeaten (a worker that reconnected)."""
        ...

    async def held_leases(self) -> list[tuple[str, str, str]]:
        """``(id, lease, worker id)`` of every job under a valid lease now."""
        ...

    async def cancel(self, ids: Sequence[str]) -> list[bool]:
        """Delete each job whatever its state (OPS-2): whether it existed."""
        ...

    async def get_jobs(self, ids: Sequence[str]) -> list[Job | None]:
        """A snapshot of each job, or ``None`` (OPS-3, JOB-4)."""
        ...

    async def set_queue(self, name: str, opts: QueueOpts | None = None) -> None:
        """Make queue ``name`` if it does not exist, and give it ``opts`` (ENQ-3)."""
        ...

    async def queues(self) -> list[str]:
        """The names of every queue."""
        ...

    async def pause(self, queue: str) -> None:
        """Stop hand-outs from ``queue`` (OPS-4), making it if need be."""
        ...

    async def resume(self, queue: str) -> None:
        """Hand out from ``queue`` again (OPS-4)."""
        ...

    async def redrive(self, ids: Sequence[str]) -> list[bool]:
        """Put each dead job back to pending (OPS-5): whether it was dead."""
        ...

    async def purge_dead(self, queue: str) -> int:
        """Delete ``queue``'s dead jobs (OPS-6): how many."""
        ...

    async def dead_jobs(self, queue: str, offset: int = 0, limit: int = 20) -> list[Job]:
        """A page of ``queue``'s dead jobs, the most recent death first."""
        ...

    async def stats(self, queues: Sequence[str] | None = None) -> dict[str, QueueStats]:
        """The counts of each queue named (of every queue for ``None``; CST-4); a name
        with no queue is left out."""
        ...

    async def sweep(self) -> SweepResult:
        """Expire, kill the used-up and purge past retention now (DLQ-3 to DLQ-5)."""
        ...

    async def close(self) -> None:
        """Make every change durable and release the backend. Idempotent."""
        ...
