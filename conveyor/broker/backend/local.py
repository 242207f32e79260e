"""The local backend: the engine's table in this process, kept by a store.

The engine (``broker/engine``) decides every change, synchronously; the store
(``broker/store``: memory or SQLite) writes down what it decided; the commit gate
(``broker/commit.py``) groups the changes of one loop turn into one commit. A call here
makes its engine calls at once and its result is there when it returns (``Ready``); a
frame made from it waits in the commit gate (the backend's ``gate``) for what
``broker/egress.py`` says. With the memory store the gate is ``IMMEDIATE``.

Time passes through the injected ``Scheduler``: one timer is kept set for the table's
next event (``JobTable.next_event_at``, looked at once per loop turn that changed the
table, and holding the schedules' next ticks), and when it fires the due schedules fire
(``JobTable.fire_schedules``: their jobs and progress ride the next commit together), the
table is swept, and the listeners are told that work may be waiting.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

from ..commit import CommitGate
from ..egress import IMMEDIATE, Gate
from ..engine import (
    LIST_STATES,
    InvalidArgument,
    Job,
    JobHandle,
    Limits,
    NewJob,
    QueueOpts,
    QueueStats,
    ScheduleInfo,
    ScheduleSpec,
    SweepResult,
)
from ..scheduler import Handle, Scheduler
from ..store import Store, StoreError
from ._base import (
    REDRIVE_CHUNK,
    Backend,
    BackOff,
    Claim,
    Claimed,
    Enqueue,
    Finished,
    JobList,
    Listener,
    Pending,
    Progress,
    Ready,
    Report,
    WatchEvent,
    unknown,
)
from ._listeners import Listeners

__all__ = ["LocalBackend"]

log = logging.getLogger("conveyor.backend")


class LocalBackend:
    """``Backend`` on the engine's table, kept by ``store`` (loaded here: raises
    ``StoreError``). Make it, and call it, on the event loop (``scheduler``'s).

    ``scheduler``'s clock is the table's. ``on_failure`` is called once if the store
    fails; every later call raises ``StoreError`` then.
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
        self.shared = False  # (this process's table alone)
        self._scheduler = scheduler
        self._on_failure = on_failure
        self.table = store.load(
            clock=scheduler.now,
            rng=random.Random() if rng is None else rng,
            max_payload_bytes=max_payload_bytes,
            id_prefix=id_prefix,
        )
        self.failed: StoreError | None = None
        # Called before each commit (the server runs a dispatch pass due this loop turn,
        # so that its claims ride that commit).
        self.before_commit: Callable[[], None] = _nothing
        self.commit_gate: CommitGate | None = None
        self.gate: Gate = IMMEDIATE
        if store.durable:
            self.commit_gate = CommitGate(
                self.table, store, before_flush=lambda: self.before_commit(), on_failure=self._fail
            )
            self.gate = self.commit_gate
        self._settling: set[asyncio.Future[None]] = set()
        self._listeners = Listeners()
        # The callbacks following each live job (RES-5); the table watches the same ids.
        self._followers: dict[str, list[Callable[[Finished], None]]] = {}
        # The callbacks watching each live job (PRG-5): its steps, then its end.
        self._watchers: dict[str, list[Callable[[WatchEvent], None]]] = {}
        self._timer: Handle | None = None
        self._timer_at: float | None = None
        self._rearm_soon = False
        self._closed = False
        # A loaded table may hold timed events already (delays, leases): set the timer.
        self._changed()

    # -- plumbing --------------------------------------------------------------------------

    def now(self) -> float:
        return self._scheduler.now()

    def listen(self, listener: Listener) -> None:
        self._listeners.add(listener)

    def _check(self) -> None:
        if self.failed is not None:
            raise self.failed
        if self._closed:
            raise StoreError("backend: closed")

    def _changed(self) -> None:
        """The table may have changed: commit it soon, and look at its next event once
        this loop turn is over."""
        self.gate.poke()
        if not self._rearm_soon:
            self._rearm_soon = True
            self._scheduler.call_soon(self._rearm)
        freed = self.table.take_freed()
        if freed:  # a slot of a limited queue came free: its waiting workers may claim
            self._listeners.work_waiting(frozenset(freed))
        if self._watchers:
            self._tell_steps()
        if self._followers or self._watchers:
            self._tell_finished()

    def _fail(self, exc: StoreError) -> None:
        self.failed = exc
        for future in self._settling:
            if not future.done():
                future.set_exception(exc)
        self._settling.clear()
        self._on_failure(exc)

    # -- time ------------------------------------------------------------------------------

    def _rearm(self) -> None:
        self._rearm_soon = False
        if not self._closed:
            self._arm_timer()

    def _arm_timer(self) -> None:
        at = self.table.next_event_at()
        if self._timer is not None and self._timer_at is not None:
            if at is not None and self._timer_at <= at:
                # The timer set fires no later than needed (the earliest lease end moves
                # with every ack); an early wake only looks again and re-arms.
                return
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None:
            self._timer = self._scheduler.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self._closed or self.failed is not None:
            return
        at = self.table.next_event_at()
        if at is not None and at <= self._scheduler.now():
            # The ticks due make their jobs (SCH-3, SCH-4) in the journal that the next
            # commit takes whole; the listeners hear of their queues below, with all.
            self.table.fire_schedules()
            self.table.sweep_expired()
            self.gate.poke()
            if self._watchers:
                self._tell_steps()
            if self._followers or self._watchers:
                self._tell_finished()
        self._arm_timer()
        # Which queues gained claimable jobs is not known without asking each one.
        self._listeners.work_waiting(None)

    # -- the job table -----------------------------------------------------------------------

    def enqueue(self, jobs: Sequence[Enqueue]) -> Ready[list[str | Exception]]:
        self._check()
        results = self.table.enqueue_each(jobs)
        # (A refused job's queue too: being told of work that is not there costs a look.)
        touched = {job.queue for job in jobs}
        if not all(result.__class__ is str for result in results):
            for result in results:
                if isinstance(result, Exception) and not isinstance(result, InvalidArgument):
                    log.error("internal error enqueueing a job", exc_info=result)
        if touched:
            self._changed()
            self._listeners.work_waiting(frozenset(touched))
        return Ready(results)

    def enqueue_all(self, queue: str, jobs: Sequence[NewJob]) -> Ready[list[str]]:
        self._check()
        ids = self.table.queue(queue).enqueue_batch(jobs)
        self._changed()
        self._listeners.work_waiting(frozenset([queue]))
        return Ready(ids)

    def enqueue_group(self, jobs: Sequence[Enqueue]) -> Ready[list[str]]:
        self._check()
        ids = self.table.enqueue_group(jobs)
        self._changed()
        self._listeners.work_waiting(frozenset(job.queue for job in jobs))
        return Ready(ids)

    def dependency_results(self, job_id: str) -> Ready[list[tuple[str, bytes | None]] | None]:
        self._check()
        return Ready(self.table.dependency_results(job_id))

    def claim(
        self, claims: Sequence[Claim], *, round_robin: bool = False
    ) -> Ready[list[list[Claimed]]]:
        self._check()
        table = self.table
        results: list[list[Claimed]] = [[] for _ in claims]
        if round_robin:
            # One job each in turn; a claim that got nothing has nothing left to take.
            open_ = [i for i, claim in enumerate(claims) if claim.n > 0]
            while open_:
                still = []
                for i in open_:
                    claim = claims[i]
                    handle = self._claim_one(claim)
                    if handle is None:
                        continue
                    got = results[i]
                    got.append(handle)
                    if len(got) < claim.n:
                        still.append(i)
                open_ = still
        else:
            for i, claim in enumerate(claims):
                got = results[i]
                for name in claim.queues:
                    want = claim.n - len(got)
                    if want <= 0:
                        break
                    queue = table.find_queue(name)
                    if queue is not None:
                        got.extend(queue.claim_batch(claim.worker_id, want))
        self._changed()
        return Ready(results)

    def claim_bound(self, queue: str) -> int | None:
        found = self.table.find_queue(queue)
        return 0 if found is None else found.claimable_bound()

    def _claim_one(self, claim: Claim) -> JobHandle | None:
        table = self.table
        for name in claim.queues:
            queue = table.find_queue(name)
            if queue is not None:
                handle = queue.claim_one(claim.worker_id)
                if handle is not None:
                    return handle
        return None

    def ack(
        self,
        leases: Sequence[tuple[str, str]],
        results: Sequence[bytes | None] | None = None,
    ) -> Ready[list[bool]]:
        self._check()
        landed = self.table.ack_many(leases, results)
        self._changed()
        return Ready(landed)

    def follow(
        self, ids: Sequence[str], on_finished: Callable[[Finished], None]
    ) -> Ready[list[Finished | None]]:
        self._check()
        table = self.table
        known: list[Finished | None] = []
        for job_id in ids:
            found = table.watch(job_id)
            if found is None:
                self._followers.setdefault(job_id, []).append(on_finished)
                known.append(None)
            else:
                known.append(Finished._make(found))
        return Ready(known)

    def unfollow(self, ids: Sequence[str], on_finished: Callable[[Finished], None]) -> None:
        followers = self._followers
        for job_id in ids:
            callbacks = followers.get(job_id)
            if callbacks is None:
                continue
            try:
                callbacks.remove(on_finished)
            except ValueError:
                continue
            if not callbacks:
                del followers[job_id]
                if job_id not in self._watchers:
                    self.table.unwatch(job_id)

    def _tell_finished(self) -> None:
        """Tell each follower and watcher of the followed jobs that finished (RES-5,
        PRG-5), once each."""
        for finish in self.table.take_finished():
            callbacks: list[Callable[[Any], None]] | None = self._followers.pop(finish.id, None)
            watchers = self._watchers.pop(finish.id, None)
            if watchers is not None:
                callbacks = watchers if callbacks is None else [*callbacks, *watchers]
            if callbacks is None:
                continue
            told = Finished._make(finish)
            for callback in callbacks:
                try:
                    callback(told)
                except Exception:  # (a follower's bug must not undo the change told)
                    log.exception("a follower of %s failed", finish.id)

    def progress(self, items: Sequence[Progress]) -> Ready[list[bool | InvalidArgument]]:
        self._check()
        answers = self.table.progress_many(items)
        self._changed()
        return Ready(answers)

    def watch(
        self, ids: Sequence[str], on_event: Callable[[WatchEvent], None]
    ) -> Ready[list[Job | Finished]]:
        self._check()
        table = self.table
        known: list[Job | Finished] = []
        for job_id in ids:
            job = table.observe(job_id)
            if job is None:
                known.append(unknown(job_id))
            elif job.state == "completed":
                known.append(Finished(job_id, job.queue, "completed", job.result_json, None))
            elif job.state == "dead":
                known.append(Finished(job_id, job.queue, "dead", None, job.last_error))
            else:
                self._watchers.setdefault(job_id, []).append(on_event)
                known.append(job)
        return Ready(known)

    def unwatch(self, ids: Sequence[str], on_event: Callable[[WatchEvent], None]) -> None:
        watchers = self._watchers
        for job_id in ids:
            callbacks = watchers.get(job_id)
            if callbacks is None:
                continue
            try:
                callbacks.remove(on_event)
            except ValueError:
                continue
            if not callbacks:
                del watchers[job_id]
                self.table.unobserve(job_id)
                if job_id not in self._followers:
                    self.table.unwatch(job_id)

    def _tell_steps(self) -> None:
        """Tell each watcher of the steps its jobs made (PRG-5), in order."""
        watchers = self._watchers
        for step in self.table.take_steps():
            for callback in watchers.get(step.id, ()):
                try:
                    callback(step)
                except Exception:  # (a watcher's bug must not undo the change told)
                    log.exception("a watcher of %s failed", step.id)

    def report(self, reports: Sequence[Report]) -> Ready[list[bool | InvalidArgument]]:
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
        self._changed()
        self._listeners.work_waiting(frozenset(requeued))
        return Ready(results)

    def back_off(self, items: Sequence[BackOff]) -> Ready[list[bool | InvalidArgument]]:
        self._check()
        table = self.table
        results: list[bool | InvalidArgument] = []
        touched: set[str] = set()
        for item in items:
            try:
                landed = table.back_off(
                    item.id, item.lease, item.delay_s, item.partition, item.whole_queue
                )
            except InvalidArgument as exc:
                results.append(exc)
                continue
            results.append(landed)
            name = table.queue_of(item.id) if landed else None
            if name is not None:
                touched.add(name)
        self._changed()
        if touched:  # the job is ready again (another key's may be claimable now)
            self._listeners.work_waiting(frozenset(touched))
        return Ready(results)

    def heartbeat(self, leases: Sequence[tuple[str, str]]) -> Ready[list[bool]]:
        self._check()
        table = self.table
        landed = [table.heartbeat(job_id, lease) for job_id, lease in leases]
        self._changed()
        return Ready(landed)

    def lapse(self, leases: Sequence[tuple[str, str]]) -> Ready[list[bool]]:
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
        self._changed()
        self._listeners.work_waiting(frozenset(freed))
        return Ready(landed)

    def reattach(
        self, worker_id: str, leases: Sequence[tuple[str, str]]
    ) -> Ready[list[tuple[str, str]]]:
        self._check()
        table = self.table
        held: list[tuple[str, str]] = []
        for job_id, lease in leases:
            job = table.get_job(job_id)
            if job is None or job.worker_id != worker_id:
                continue
            if table.heartbeat(job_id, lease):
                held.append((job_id, lease))
        self._changed()
        return Ready(held)

    def announce(
        self, broker_id: str, info: dict[str, Any], ttl_s: float
    ) -> Ready[list[dict[str, Any]]]:
        self._check()
        return Ready([])  # (this table is this broker's alone)

    def held_leases(self, worker_id: str | None = None) -> Ready[list[tuple[str, str, str]]]:
        self._check()
        held = self.table.held_leases()
        if worker_id is not None:
            held = [entry for entry in held if entry[2] == worker_id]
        return Ready(held)

    def cancel(self, ids: Sequence[str]) -> Ready[list[bool]]:
        self._check()
        table = self.table
        done = [table.cancel(job_id) for job_id in ids]
        self._changed()
        self._listeners.cancelled([job_id for job_id, ok in zip(ids, done, strict=True) if ok])
        return Ready(done)

    def get_jobs(self, ids: Sequence[str]) -> Ready[list[Job | None]]:
        self._check()
        table = self.table
        return Ready([table.get_job(job_id) for job_id in ids])

    def set_queue(self, name: str, opts: QueueOpts | None = None) -> Ready[None]:
        self._check()
        self.table.queue(name, opts)
        self._changed()
        return Ready(None)

    def set_limits(self, name: str, limits: Limits) -> Ready[None]:
        self._check()
        self.table.queue(name).set_limits(limits)
        self._changed()
        return Ready(None)

    def queues(self) -> Ready[list[str]]:
        self._check()
        return Ready(self.table.queues())

    def pause(self, queue: str) -> Ready[None]:
        self._check()
        self.table.queue(queue).pause()
        self._changed()
        return Ready(None)

    def resume(self, queue: str) -> Ready[bool]:
        self._check()
        found = self.table.find_queue(queue)
        if found is None:
            return Ready(False)
        found.resume()
        self._changed()
        self._listeners.work_waiting(frozenset([queue]))
        return Ready(True)

    def redrive(self, ids: Sequence[str]) -> Ready[list[bool]]:
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
        self._changed()
        self._listeners.work_waiting(frozenset(requeued))
        return Ready(done)

    def purge_dead(self, queue: str) -> Ready[int | None]:
        self._check()
        found = self.table.find_queue(queue)
        if found is None:
            return Ready(None)
        purged = found.purge_dead()
        self._changed()
        return Ready(purged)

    def dead_jobs(self, queue: str, offset: int = 0, limit: int = 20) -> Ready[list[Job]]:
        self._check()
        found = self.table.find_queue(queue)
        return Ready([] if found is None else found.dead_jobs(offset, limit))

    def list_jobs(
        self,
        queue: str,
        state: str,
        after: tuple[Any, ...] | None = None,
        limit: int = 50,
        search: str | None = None,
    ) -> Ready[JobList | None]:
        self._check()
        q = self.table.find_queue(queue)
        if q is None:
            if state not in LIST_STATES:  # (a bad state is named before a missing queue)
                raise InvalidArgument("state", f"must be one of {', '.join(LIST_STATES)}")
            return Ready(None)
        jobs, next_key = q.list_jobs(state, after, limit, search)
        return Ready(JobList(jobs, next_key, q.stats().count(state)))

    def redrive_all(self, queue: str) -> Pending[int | None]:
        self._check()
        q = self.table.find_queue(queue)
        if q is None:
            return Ready(None)
        left = q.stats().dead
        if left == 0:
            return Ready(0)
        moved = q.redrive_all(min(left, REDRIVE_CHUNK))
        self._redriven(queue)
        if moved >= left:
            return Ready(moved)

        async def rest() -> int:
            # One chunk per loop turn, each its own commit: the loop (and every other
            # connection) goes on between them.
            done = moved
            while done < left:
                await asyncio.sleep(0)
                self._check()
                step = q.redrive_all(min(left - done, REDRIVE_CHUNK))
                if step == 0:
                    break
                done += step
                self._redriven(queue)
            return done

        return asyncio.get_running_loop().create_task(rest())

    def _redriven(self, queue: str) -> None:
        self._changed()
        self._listeners.work_waiting(frozenset([queue]))

    def stats(self, queues: Sequence[str] | None = None) -> Ready[dict[str, QueueStats]]:
        self._check()
        table = self.table
        if queues is None:
            return Ready({name: table.queue(name).stats() for name in table.queues()})
        found = ((name, table.find_queue(name)) for name in queues)
        return Ready({name: queue.stats() for name, queue in found if queue is not None})

    # -- schedules (SCH-1 on: the engine decides; its timer fires them, see _on_timer) ----

    def set_schedule(self, spec: ScheduleSpec) -> Ready[ScheduleInfo]:
        self._check()
        info = self.table.set_schedule(spec)
        self._changed()
        return Ready(info)

    def delete_schedule(self, schedule_id: str) -> Ready[bool]:
        self._check()
        existed = self.table.delete_schedule(schedule_id)
        self._changed()
        return Ready(existed)

    def pause_schedule(self, schedule_id: str, paused: bool) -> Ready[ScheduleInfo | None]:
        self._check()
        info = self.table.pause_schedule(schedule_id, paused)
        self._changed()
        return Ready(info)

    def run_schedule(self, schedule_id: str) -> Ready[str | None]:
        self._check()
        job_id = self.table.run_schedule(schedule_id)
        if job_id is not None:
            self._changed()
            info = self.table.get_schedule(schedule_id)
            assert info is not None
            self._listeners.work_waiting(frozenset([info.spec.queue]))
        return Ready(job_id)

    def schedules(
        self, ids: Sequence[str] | None = None, after: str | None = None, limit: int = 100
    ) -> Ready[list[ScheduleInfo]]:
        self._check()
        if ids is not None:
            return Ready(self.table.get_schedules(ids))
        return Ready(self.table.list_schedules(after, limit))

    def sweep(self) -> Ready[SweepResult]:
        self._check()
        result = self.table.sweep_expired()
        self._changed()
        return Ready(result)

    async def settle(self) -> None:
        self._check()
        if self.commit_gate is None:
            return
        future = asyncio.get_running_loop().create_future()
        self._settling.add(future)

        def release(_: bytes) -> None:
            self._settling.discard(future)
            if not future.done():
                future.set_result(None)

        self.commit_gate.hold(release, b"")
        await future

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            if self.commit_gate is not None and self.failed is None:
                await self.commit_gate.drain()
        finally:
            self.store.close()


def _nothing() -> None:
    pass


def _is_a_backend(backend: LocalBackend) -> Backend:
    return backend  # (for the type checker: LocalBackend implements Backend)
