"""The local backend: the engine's table in this process, kept by a store.

The engine (``broker/engine``) decides every change, synchronously; the store
(``broker/store``: memory or SQLite) writes down what it decided; the commit gate
(``broker/commit.py``) groups the changes of one loop turn into one commit. A call here
makes its engine calls at once and then waits, on the gate, for what
``broker/egress.py`` says its result waits for: a change for its commit to be durable,
a claim for its commit to be written (durable when it holds a last attempt). With the
memory store nothing waits.

Time passes through the injected ``Scheduler``: one timer is kept set for the table's
next event (``JobTable.next_event_at``), and when it fires the table is swept and the
listeners are told that work of any queue may be waiting.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence

from ..commit import CommitGate
from ..egress import IMMEDIATE, Gate, Out, Wait, wait_for
from ..engine import (
    InvalidArgument,
    Job,
    JobHandle,
    NewJob,
    QueueOpts,
    QueueStats,
    SweepResult,
)
from ..scheduler import Handle, Scheduler
from ..store import Store, StoreError
from ._base import Claim, Claimed, Enqueue, Listener, Report

__all__ = ["LocalBackend"]

log = logging.getLogger("conveyor.backend")


def _claimed(handle: JobHandle) -> Claimed:
    return Claimed(
        id=handle.id,
        queue=handle.queue,
        lease=handle.lease,
        payload_json=handle.payload_json,
        attempt=handle.attempt,
        max_attempts=handle.max_attempts,
        deadline=handle.deadline,
        priority=handle.priority,
        visibility_timeout_s=handle.visibility_timeout_s,
        ready_since=handle.ready_since,
    )


class LocalBackend:
    """``Backend`` on the engine's table, kept by ``store`` (loaded here: raises
    ``StoreError``). Make it, and call it, on the running event loop.

    ``scheduler``'s clock is the table's. ``on_failure`` is called once if the store
    fails; every call waiting then raises ``StoreError``, and so does every later one.
    """

    def __init__(
        self,
        store: Store,
        scheduler: Scheduler,
        *,
        max_payload_bytes: int,
        rng: random.Random | None = None,
        id_prefix: str | None = None,
        on_failure: Callable[[StoreError], None] = lambda exc: None,
    ) -> None:
        self.store = store
        self.name = store.name
        self.durable = store.durable
        self._scheduler = scheduler
        self._on_failure = on_failure
        self.table = store.load(
            clock=scheduler.now,
            rng=random.Random() if rng is None else rng,
            max_payload_bytes=max_payload_bytes,
            id_prefix=id_prefix,
        )
        self.failed: StoreError | None = None
        self.gate: CommitGate | None = None
        self._gate: Gate = IMMEDIATE
        # Called before each commit (the server runs a dispatch pass due this loop turn,
        # so that its claims ride that commit).
        self.before_commit: Callable[[], None] = _nothing
        if store.durable:
            self.gate = CommitGate(
                self.table, store, before_flush=lambda: self.before_commit(), on_failure=self._fail
            )
            self._gate = self.gate
        self._waiting: set[asyncio.Future[None]] = set()
        self._listeners: list[Listener] = []
        self._timer: Handle | None = None
        self._timer_at: float | None = None
        self._closed = False

    # -- plumbing --------------------------------------------------------------------------

    def now(self) -> float:
        return self._scheduler.now()

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _check(self) -> None:
        if self.failed is not None:
            raise self.failed
        if self._closed:
            raise StoreError("backend: closed")

    def _fail(self, exc: StoreError) -> None:
        self.failed = exc
        for future in self._waiting:
            if not future.done():
                future.set_exception(exc)
        self._waiting.clear()
        self._on_failure(exc)

    async def _settled(self, out: Out) -> None:
        """Return once what changed so far meets the wait of a frame of kind ``out``
        (``broker/egress.py``); re-arm the timer for the table's next event."""
        self._arm_timer()
        wait = wait_for(out, subscribed=True)
        if wait is Wait.NOTHING or self._gate is IMMEDIATE:
            self._gate.poke()
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting.add(future)

        def release(_: bytes) -> None:
            self._waiting.discard(future)
            if not future.done():
                future.set_result(None)

        if wait is Wait.WRITTEN:
            self._gate.hold_early(release, b"", _nothing)
        else:
            self._gate.hold(release, b"")
        await future

    def _tell_work(self, queues: frozenset[str] | None) -> None:
        if queues is None or queues:
            self._tell(lambda listener: listener.work_waiting(queues))

    def _tell_cancelled(self, ids: list[str]) -> None:
        if ids:
            self._tell(lambda listener: listener.cancelled(ids))

    def _tell(self, news: Callable[[Listener], None]) -> None:
        for listener in self._listeners:
            try:
                news(listener)
            except Exception:  # one listener's bug must not keep news from the others
                log.exception("a listener failed")

    # -- time ------------------------------------------------------------------------------

    def _arm_timer(self) -> None:
        at = self.table.next_event_at()
        if self._timer is not None and self._timer_at is not None:
            if at is not None and self._timer_at <= at:
                return  # the timer set fires no later than needed; an early one re-arms
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None and not self._closed:
            self._timer = self._scheduler.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self._closed or self.failed is not None:
            return
        at = self.table.next_event_at()
        if at is not None and at <= self._scheduler.now():
            self.table.sweep_expired()
            self._gate.poke()
        self._arm_timer()
        # Which queues gained claimable jobs is not known without asking each one.
        self._tell_work(None)

    # -- the job table -----------------------------------------------------------------------

    async def enqueue(self, jobs: Sequence[Enqueue]) -> list[str | InvalidArgument]:
        self._check()
        table = self.table
        results: list[str | InvalidArgument] = []
        touched: set[str] = set()
        for item in jobs:
            job = item.job
            try:
                job_id = table.queue(item.queue).enqueue(
                    job.payload,
                    priority=job.priority,
                    delay_s=job.delay_s,
                    run_at=job.run_at,
                    expires_s=job.expires_s,
                    visibility_timeout_s=job.visibility_timeout_s,
                    max_attempts=job.max_attempts,
                    backoff_base_s=job.backoff_base_s,
                    key=job.key,
                )
            except InvalidArgument as exc:
                results.append(exc)
                continue
            results.append(job_id)
            touched.add(item.queue)
        await self._settled(Out.REPLY)
        self._tell_work(frozenset(touched))
        return results

    async def enqueue_all(self, queue: str, jobs: Sequence[NewJob]) -> list[str]:
        self._check()
        ids = self.table.queue(queue).enqueue_batch(jobs)
        await self._settled(Out.REPLY)
        self._tell_work(frozenset([queue]))
        return ids

    async def claim(self, claims: Sequence[Claim]) -> list[list[Claimed]]:
        self._check()
        table = self.table
        known = set(table.queues())
        results: list[list[Claimed]] = []
        last = False
        for claim in claims:
            got: list[Claimed] = []
            for name in claim.queues:
                want = claim.n - len(got)
                if want <= 0:
                    break
                if name not in known:
                    continue
                for handle in table.queue(name).claim_batch(claim.worker_id, want):
                    got.append(_claimed(handle))
                    last = last or handle.attempt >= handle.max_attempts
            results.append(got)
        await self._settled(Out.LAST_PUSH if last else Out.PUSH)
        return results

    async def ack(self, leases: Sequence[tuple[str, str]]) -> list[bool]:
        self._check()
        landed = self.table.ack_many(leases)
        await self._settled(Out.REPLY)
        return landed

    async def report(self, reports: Sequence[Report]) -> list[bool | InvalidArgument]:
        self._check()
        table = self.table
        results: list[bool | InvalidArgument] = []
        requeued: set[str] = set()
        for item in reports:
            try:
                if item.retry:
                    landed = table.retry(item.id, item.lease, item.error, item.delay_s)
                    name = table.queue_of(item.id) if landed else None
                    if name is not None:
                        requeued.add(name)
                else:
                    landed = table.fail(item.id, item.lease, item.error)
            except InvalidArgument as exc:
                results.append(exc)
                continue
            results.append(landed)
        await self._settled(Out.REPLY)
        self._tell_work(frozenset(requeued))
        return results

    async def heartbeat(self, leases: Sequence[tuple[str, str]]) -> list[bool]:
        self._check()
        table = self.table
        landed = [table.heartbeat(job_id, lease) for job_id, lease in leases]
        await self._settled(Out.REPLY)
        return landed

    async def lapse(self, leases: Sequence[tuple[str, str]]) -> list[bool]:
        self._check()
        table = self.table
        landed: list[bool] = []
        freed: set[str] = set()
        for job_id, lease in leases:
            name = table.queue_of(job_id)
            ok = name is not None and table.lapse(job_id, lease)
            landed.append(ok)
            if ok and name is not None:
                freed.add(name)
        await self._settled(Out.REPLY)
        self._tell_work(frozenset(freed))
        return landed

    async def reattach(self, worker_id: str, leases: Sequence[tuple[str, str]]) -> list[str]:
        self._check()
        table = self.table
        ids: list[str] = []
        for job_id, lease in leases:
            job = table.get_job(job_id)
            if job is None or job.worker_id != worker_id:
                continue
            if table.heartbeat(job_id, lease):
                ids.append(job_id)
        await self._settled(Out.REPLY)
        return ids

    async def held_leases(self) -> list[tuple[str, str, str]]:
        self._check()
        return self.table.held_leases()

    async def cancel(self, ids: Sequence[str]) -> list[bool]:
        self._check()
        table = self.table
        done = [table.cancel(job_id) for job_id in ids]
        await self._settled(Out.NOTICE)
        self._tell_cancelled([job_id for job_id, ok in zip(ids, done, strict=True) if ok])
        return done

    async def get_jobs(self, ids: Sequence[str]) -> list[Job | None]:
        self._check()
        return [self.table.get_job(job_id) for job_id in ids]

    async def set_queue(self, name: str, opts: QueueOpts | None = None) -> None:
        self._check()
        self.table.queue(name, opts)
        await self._settled(Out.REPLY)

    async def queues(self) -> list[str]:
        self._check()
        return self.table.queues()

    async def pause(self, queue: str) -> None:
        self._check()
        self.table.queue(queue).pause()
        await self._settled(Out.REPLY)

    async def resume(self, queue: str) -> None:
        self._check()
        self.table.queue(queue).resume()
        await self._settled(Out.REPLY)
        self._tell_work(frozenset([queue]))

    async def redrive(self, ids: Sequence[str]) -> list[bool]:
        self._check()
        table = self.table
        done: list[bool] = []
        requeued: set[str] = set()
        for job_id in ids:
            ok = table.redrive(job_id)
            done.append(ok)
            name = table.queue_of(job_id) if ok else None
            if name is not None:
                requeued.add(name)
        await self._settled(Out.REPLY)
        self._tell_work(frozenset(requeued))
        return done

    async def purge_dead(self, queue: str) -> int:
        self._check()
        if queue not in self.table.queues():
            return 0
        purged = self.table.queue(queue).purge_dead()
        await self._settled(Out.REPLY)
        return purged

    async def dead_jobs(self, queue: str, offset: int = 0, limit: int = 20) -> list[Job]:
        self._check()
        if queue not in self.table.queues():
            return []
        return self.table.queue(queue).dead_jobs(offset, limit)

    async def stats(self, queues: Sequence[str] | None = None) -> dict[str, QueueStats]:
        self._check()
        table = self.table
        names = table.queues()
        if queues is not None:
            known = set(names)
            names = [name for name in queues if name in known]
        return {name: table.queue(name).stats() for name in names}

    async def sweep(self) -> SweepResult:
        self._check()
        result = self.table.sweep_expired()
        await self._settled(Out.REPLY)
        return result

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            if self.gate is not None and self.failed is None:
                await self.gate.drain()
        finally:
            self.store.close()


def _nothing() -> None:
    pass
