"""The dispatcher: which subscribed worker gets which claimable job, and when.

It sits between the server (connections, frames) and the backend (the job table,
``broker/backend``). It owns no job state: it claims through the backend and remembers
only which connection holds which lease, so that it can honour ``prefetch``, tell a
worker its job was cancelled, and let a dropped worker's jobs lapse after the
disconnect grace. It is the backend's ``Listener``: the backend tells it when work may
be waiting (an enqueue, a retry, a resume, time passing) and when a job was cancelled.

Theory of operation
-------------------
Work happens in *passes*. Anything that may make a job claimable or free a worker's
slot (an enqueue, an ack, a subscribe, a resume, a timer) records what changed and
calls ``kick()``, which schedules one pass with ``call_soon``; everything that
happened meanwhile is handled by that single pass, and every worker gets at most one
``jobs`` frame per pass (split only to keep frames small).

A pass serves, in this order:

1. Workers that just gained free slots: each is filled from its queues in its strict
   order (docs/protocol.md, "subscribe"), in one ``claim`` call for them all.
2. Queues that may have gained claimable jobs: the hungry workers waiting on such a
   queue are served one job at a time, round-robin (one ``claim`` call with
   ``round_robin``), until the queue runs dry or nobody waits. A worker is always
   filled from its own ordered list, so an earlier queue's job still goes first.

A backend that answers later (a database server) is served the same way: a claim's
result is handed out when it comes, and until then the slots it asked for are
reserved (``Subscription.claiming``), so that no later pass claims them again.

Hungry workers wait in one ordered set per queue, so a pass costs O(jobs handed out
+ queues touched), never O(connected workers): 10,000 idle workers cost nothing
until work arrives. Timed events (a delayed job maturing, a lease lapsing) are the
backend's: it says when one may have made work claimable, without polling.

The dispatcher reads no clock and touches no event loop: time and callbacks come from
the injected ``Scheduler`` (broker/scheduler.py), whose clock is the backend's, so that
tests drive leases, graces and timers on a manual clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from itertools import groupby, islice
from operator import attrgetter
from typing import Any, NamedTuple

from ..sdk._wire import cancelled_push, jobs_push, pushed_job
from .backend import Backend, Claim, Claimed, Pending, Ready, then
from .egress import Out
from .engine import SweepResult
from .scheduler import Handle, Scheduler

__all__ = ["Dispatcher", "Held", "Subscription", "logged"]

log = logging.getLogger("conveyor.dispatch")

_queue_of = attrgetter("queue")

# Split a worker's jobs frame once its payloads pass this many bytes, so that no frame
# comes near a client's frame-size limit (1 MiB by default in most WebSocket clients).
_FRAME_PAYLOAD_BUDGET = 256 * 1024

# The most of a queue's waiting line one pass asks when the backend cannot bound what the
# queue holds (a shared table): the rest of the line is asked in the passes after, while
# each worker asked gets a job, so that a pass costs the same beside 10 or 10,000 workers.
_LINE_PER_PASS = 256


class Held(NamedTuple):
    """A job a subscription holds, as the dispatcher knows it (the dashboard shows it).

    ``since`` is when its lease was taken (the claim's time, by the backend's clock), or,
    for a lease the worker re-attached, when it did: ``reattached`` then, and ``queue``
    and ``attempt`` are ``None`` (a re-attach names only the job and the lease).
    """

    id: str
    queue: str | None
    attempt: int | None
    since: float
    reattached: bool = False


class Subscription:
    """One worker connection's subscription: its queues, its window, its leases."""

    __slots__ = (
        "claiming",
        "congested",
        "emit",
        "flush",
        "in_flight",
        "owner",
        "prefetch",
        "queues",
        "worker_id",
    )

    def __init__(
        self,
        worker_id: str,
        queues: Sequence[str],
        prefetch: int,
        emit: Callable[[Out, dict[str, Any]], None],
        owner: object = None,
        flush: Callable[[], None] = lambda: None,
    ) -> None:
        self.worker_id = worker_id
        self.owner = owner  # the server's connection, opaque here (the dashboard reads it)
        self.queues = tuple(queues)  # their names, in the worker's strict order
        self.prefetch = prefetch
        # Queues one frame, tagged with what it is (broker/egress.py decides when it
        # leaves), on the connection; never blocks.
        self.emit = emit
        # Writes what emit queued now, rather than at the loop's next turn; never blocks.
        self.flush = flush
        # lease -> the job it holds, in the order they came (so the oldest first)
        self.in_flight: dict[str, Held] = {}
        # Its connection has too many bytes unsent: it gets nothing until they are out.
        self.congested = False
        # Slots asked for in claims (or re-attaches) whose result has not come yet.
        self.claiming = 0

    @property
    def free(self) -> int:
        return self.prefetch - len(self.in_flight) - self.claiming

    def __repr__(self) -> str:
        return f"<Subscription {self.worker_id} {len(self.in_flight)}/{self.prefetch}>"


class Dispatcher:
    """Pushes claimable jobs to subscriptions.

    ``scheduler`` runs its passes and timers and tells the time; its clock must be the
    one ``backend`` reads. Call its methods from the scheduler's thread only (the event
    loop's, for a ``LoopScheduler``). It listens to ``backend`` from the start.
    """

    def __init__(self, backend: Backend, *, grace_s: float, scheduler: Scheduler) -> None:
        """A dropped worker's leases lapse after ``grace_s`` unless it re-attaches them;
        on a table shared with other brokers (``backend.shared``) they run to their
        deadline instead, like a silent worker's: the worker may be back through another
        broker, its leases re-attached there."""
        self.backend = backend
        backend.listen(self)
        self.grace_s = grace_s
        self._scheduler = scheduler
        self._waiting: dict[str, dict[Subscription, None]] = {}
        self._hungry: dict[Subscription, None] = {}
        self.subscriptions: dict[Subscription, None] = {}  # every live one, in arrival order
        # worker id -> its live subscriptions (a worker may have several connections)
        self.by_worker: dict[str, dict[Subscription, None]] = {}
        self._dirty: set[str] = set()
        # The claims whose result has not come yet, each with the news that came while it
        # ran (it may have been made before that news): looked at again when it is back.
        self._running: set[_News] = set()
        self._holders: dict[str, tuple[Subscription, str]] = {}  # job id -> (holder, lease)
        # Every lease some subscription's window counts -> that subscription. A job's
        # earlier, lapsed lease stays here (and takes its slot) until it is reported.
        self._lease_owners: dict[str, Subscription] = {}
        # worker id -> (lease -> job id, grace timer) for workers whose connection ended
        self._orphans: dict[str, tuple[dict[str, str], Handle]] = {}
        self._pass_scheduled = False
        self.pushed = 0  # jobs pushed since start (for metrics)
        # Told (queue, seconds each job of it waited from claimable to push) per push.
        self.push_latency: Callable[[str, list[float]], None] | None = None
        # Told (queue, outcome, seconds from push to report) of each report that landed
        # for a job this broker pushed on a connection still holding it (the metrics).
        self.job_duration: Callable[[str, str, list[float]], None] | None = None
        # Push a full window in frames of half the prefetch (see _push).
        self.split_windows = True
        # Jobs handed out in the pass running now, pushed at its end (see _handed).
        self._out: dict[Subscription, list[Claimed]] | None = None

    def claimed_at(self, job_id: str) -> float | None:
        """When the lease a worker on this broker holds of ``job_id`` was taken (the
        claim's time, by the backend's clock); ``None`` when no worker here holds it, or
        when its holder re-attached the lease (the claim was made before, maybe by
        another broker). O(1): what ``list_jobs`` adds to a processing job."""
        holder = self._holders.get(job_id)
        if holder is None:
            return None
        held = holder[0].in_flight.get(holder[1])
        return None if held is None or held.reattached else held.since

    # -- what the server tells the dispatcher ---------------------------------------------

    def subscribe(self, sub: Subscription, leases: list[tuple[str, str]]) -> Pending[list[str]]:
        """Register ``sub``; re-attach the ``(job id, lease)`` pairs it still holds.

        A lease re-attaches when its job is still held by the same ``worker_id`` under a
        valid lease (a reconnect within the grace, or after a broker restart with a
        durable store, or through another broker on a shared database); re-attaching
        counts as a heartbeat. The result: the re-attached ids. Until it comes, the
        slots of the leases offered are reserved, so that the window is never overfilled.
        """
        for name in sub.queues:
            self._waiting.setdefault(name, {})
        self.subscriptions[sub] = None
        self.by_worker.setdefault(sub.worker_id, {})[sub] = None
        if not leases:
            self._release_unoffered(sub)
            self._set_hungry(sub)
            return Ready([])
        sub.claiming += len(leases)

        def came(pairs: list[tuple[str, str]]) -> list[str]:
            sub.claiming -= len(leases)
            return self._reattached(sub, pairs)

        return then(self.backend.reattach(sub.worker_id, leases), came)

    def _reattached(self, sub: Subscription, pairs: list[tuple[str, str]]) -> list[str]:
        if sub not in self.subscriptions:  # its connection ended meanwhile
            if pairs:
                self._orphan(sub.worker_id, {lease: job_id for job_id, lease in pairs})
            return []
        orphans = self._orphans.get(sub.worker_id)
        reattached = []
        now = self._scheduler.now()
        for job_id, lease in pairs:
            previous = self._holders.get(job_id)
            if previous is not None and previous[0] is not sub:
                # The old connection is not known dead yet; it loses the job (and the slot).
                previous[0].in_flight.pop(previous[1], None)
            sub.in_flight[lease] = Held(job_id, None, None, now, reattached=True)
            self._lease_owners[lease] = sub
            self._holders[job_id] = (sub, lease)
            reattached.append(job_id)
            if orphans is not None:
                orphans[0].pop(lease, None)
        if orphans is not None and not orphans[0]:
            orphans[1].cancel()
            del self._orphans[sub.worker_id]
        self._release_unoffered(sub)
        self._set_hungry(sub)
        return reattached

    def _release_unoffered(self, sub: Subscription) -> None:
        """On a table shared with other brokers, lapse the leases ``sub``'s worker holds
        in the table but did not offer to re-attach: jobs pushed to a connection of its
        that ended (a broker that died with the push unsent), which it never got. (On a
        table of its own, the disconnect grace does this: ``_orphan``.) Asked before any
        claim for ``sub`` is made, so that none of those is among them."""
        if not self.backend.shared:
            return
        mine = set(sub.in_flight)

        def came(held: Pending[list[tuple[str, str, str]]]) -> None:
            try:
                rows = held.result()
            except Exception as exc:
                log.warning("looking up a worker's leases failed: %s", exc)
                return
            lost = [(job_id, lease) for job_id, lease, _ in rows if lease not in mine]
            if lost:
                logged(self.backend.lapse(lost), "lapse")

        self.backend.held_leases(sub.worker_id).add_done_callback(came)

    def unsubscribe(self, sub: Subscription) -> None:
        """The subscription's connection ended: its jobs lapse after the grace."""
        self.subscriptions.pop(sub, None)
        same = self.by_worker.get(sub.worker_id)
        if same is not None:
            same.pop(sub, None)
            if not same:
                del self.by_worker[sub.worker_id]
        self._hungry.pop(sub, None)
        for name in sub.queues:
            waiting = self._waiting.get(name)
            if waiting is not None:
                waiting.pop(sub, None)
        held = {}
        for lease, job in sub.in_flight.items():
            job_id = job.id
            if self._holders.get(job_id) == (sub, lease):
                del self._holders[job_id]
            if self._lease_owners.get(lease) is sub:
                del self._lease_owners[lease]
            held[lease] = job_id
        sub.in_flight.clear()
        if held:
            self._orphan(sub.worker_id, held)

    def adopt(self, held: list[tuple[str, str, str]]) -> None:
        """Leases that outlived a restart (``(job id, lease, worker id)``): like a dropped
        worker's, each waits the grace for its worker to re-attach it, then lapses."""
        by_worker: dict[str, dict[str, str]] = {}
        for job_id, lease, worker_id in held:
            by_worker.setdefault(worker_id, {})[lease] = job_id
        for worker_id, leases in by_worker.items():
            self._orphan(worker_id, leases)

    def _orphan(self, worker_id: str, held: dict[str, str]) -> None:
        """``held`` (lease -> job id) waits the grace for ``worker_id`` to re-attach it,
        together with what the worker left before, then lapses (at once with no grace)."""
        if self.backend.shared:
            return
        if self.grace_s <= 0:
            self._lapse(held)
            return
        entry = self._orphans.get(worker_id)
        if entry is not None:
            entry[1].cancel()
            held.update(entry[0])
        scheduler = self._scheduler
        timer = scheduler.call_at(scheduler.now() + self.grace_s, self._end_grace, worker_id)
        self._orphans[worker_id] = (held, timer)

    def drain(self, sub: Subscription) -> int:
        """Push nothing more to ``sub``; the jobs it holds stay held. Returns how many."""
        sub.prefetch = 0
        self._hungry.pop(sub, None)
        self._file(sub)
        return len(sub.in_flight)

    def finished(
        self, sub: Subscription | None, job_id: str, lease: str, outcome: str | None = None
    ) -> None:
        """The worker answered for a job (ack, retry or fail, landed or not): free its slot.

        ``sub`` is the reporting connection's subscription, if any. Reports are accepted
        on any connection (the lease is the credential), so a report of the current lease
        made elsewhere frees the holder's slot. ``outcome`` (``ok``, ``retry``, ``dead``)
        when the report landed: its time since the claim goes to ``job_duration``.
        """
        self.finished_many(sub, [(job_id, lease)], outcome, (outcome is not None,))

    def finished_many(
        self,
        sub: Subscription | None,
        pairs: Iterable[tuple[str, str]],
        outcome: str | None = None,
        landed: Sequence[bool] = (),
    ) -> None:
        """``finished`` for each ``(job_id, lease)`` a connection answered for at once
        (``outcome`` for each whose ``landed`` is true); each subscription that got slots
        back is offered jobs once."""
        # Each lease is freed as _free frees one, inlined: this runs for every acked job.
        # On the way, how long each job whose report landed ran since its claim goes to
        # ``job_duration``, by queue: one clock read and one call per queue for the whole
        # answer. Jobs whose lease was re-attached after a reconnect are not timed (their
        # claim is unknown), nor those this broker did not hand out.
        observe = self.job_duration if outcome is not None else None
        timed = observe is not None and any(landed)
        now = self._scheduler.now() if timed else 0.0
        spans: dict[str, list[float]] = {}
        owners, holders = self._lease_owners, self._holders
        freed: dict[Subscription, None] = {}
        for i, (job_id, lease) in enumerate(pairs):
            owner = owners.get(lease)
            if owner is None:
                continue
            held = owner.in_flight.get(lease)
            if held is None or held.id != job_id:
                if owner is not sub:
                    continue  # another connection's lease for another job: not this one's
            elif timed and held.queue is not None and i < len(landed) and landed[i]:
                spans.setdefault(held.queue, []).append(now - held.since)
            del owners[lease]
            if held is not None:
                del owner.in_flight[lease]
            if holders.get(job_id) == (owner, lease):
                del holders[job_id]
            freed[owner] = None
        if observe is not None and outcome is not None:
            for queue, seconds in spans.items():
                observe(queue, outcome, seconds)
        for each in freed:
            self._set_hungry(each)

    def _free(self, sub: Subscription | None, job_id: str, lease: str) -> Subscription | None:
        """Free the slot the lease took; returns whose it was (``None``: nobody's).

        The reporting connection's own lease frees its slot whatever job it names (the
        report did not land); a lease another connection holds frees that one's slot
        when the job matches too: the current lease, or an earlier one that lapsed.
        """
        owner = self._lease_owners.get(lease)
        if owner is None:
            return None
        if owner is not sub:
            held = owner.in_flight.get(lease)
            if held is None or held.id != job_id:
                return None
        del self._lease_owners[lease]
        owner.in_flight.pop(lease, None)
        if self._holders.get(job_id) == (owner, lease):
            del self._holders[job_id]
        return owner

    # -- what the backend tells the dispatcher (it is the backend's Listener) --------------

    def cancelled(self, job_ids: Sequence[str]) -> None:
        """These jobs were cancelled: tell each holder (if any) and free its slot."""
        for job_id in job_ids:
            holder = self._holders.get(job_id)
            sub = None if holder is None else self._free(holder[0], job_id, holder[1])
            if sub is None:
                continue
            sub.emit(Out.NOTICE, cancelled_push([job_id]))
            self._set_hungry(sub)

    def work_waiting(self, queues: frozenset[str] | None) -> None:
        """Jobs of ``queues`` (``None``: of any queue) may have become claimable."""
        for news in self._running:
            if queues is None:
                news.anything = True
            else:
                news.queues.update(queues)
        self._mark(queues)

    def _mark(self, queues: frozenset[str] | None) -> None:
        """Look at ``queues`` (``None``: every queue someone waits on) in the next pass."""
        if queues is None:
            # Which queues gained claimable jobs is not known without asking each one;
            # asking costs O(queues with waiting workers), once per timed event.
            self._dirty.update(name for name, waiting in self._waiting.items() if waiting)
        else:
            self._dirty.update(name for name in queues if name in self._waiting)
        if self._dirty:
            self.kick()

    def holder(self, job_id: str) -> str | None:
        """The worker id the broker pushed this job to, if it still holds it."""
        holder = self._holders.get(job_id)
        return None if holder is None else holder[0].worker_id

    def kick(self) -> None:
        """Schedule one pass (once, however often it is called before the pass runs)."""
        if not self._pass_scheduled:
            self._pass_scheduled = True
            self._scheduler.call_soon(self._run_pass)

    def close(self) -> None:
        """Cancel every timer (the broker is stopping)."""
        for _, timer in self._orphans.values():
            timer.cancel()
        self._orphans.clear()

    # -- the pass -------------------------------------------------------------------------

    def congested(self, sub: Subscription, congested: bool) -> None:
        """``sub``'s connection has too many bytes unsent (``True``): push nothing more to
        it; or it has written them (``False``): fill its free slots again."""
        sub.congested = congested
        if sub not in self.subscriptions:
            return  # not subscribed (yet, or any more)
        if congested:
            self._hungry.pop(sub, None)
            self._file(sub)
        else:
            self._set_hungry(sub)

    def _set_hungry(self, sub: Subscription) -> None:
        if sub.free > 0 and not sub.congested:
            self._hungry[sub] = None
            self.kick()

    def run_pending(self) -> None:
        """Run the pass scheduled for this loop iteration now, if there is one."""
        self._run_pass()

    def _run_pass(self) -> None:
        if not self._pass_scheduled:
            return  # already run early by run_pending()
        self._pass_scheduled = False
        try:
            self._pass()
        except Exception:  # a bug here must not stop every later pass
            log.exception("dispatch pass failed")

    def _pass(self) -> None:
        self._out = {}
        try:
            hungry = [
                sub for sub in self._hungry if sub.free > 0 and not sub.congested
            ]  # (each fills from its own queues, in one call for them all)
            self._hungry = {}
            if hungry:
                self._claim(hungry, None)
            dirty, self._dirty = self._dirty, set()
            for name in dirty:
                waiting = self._waiting.get(name)
                if not waiting:
                    continue
                bound = self.backend.claim_bound(name)
                if bound is None:
                    bound = _LINE_PER_PASS
                room = (sub for sub in waiting if sub.free > 0)  # (not those reserved full)
                # Round-robin hands at most one job to each in turn: no more of the line
                # than there are jobs can get one from this queue, however long it is.
                line = list(islice(room, bound))
                if line:
                    cut = len(line) == bound < len(waiting)
                    self._claim(line, waiting, name if cut else None)
        finally:
            out, self._out = self._out, None
            self._send(out)

    def _claim(
        self,
        subs: list[Subscription],
        line: dict[Subscription, None] | None,
        cut: str | None = None,
    ) -> None:
        """Claim for ``subs`` (for the waiting ``line`` of one queue, round-robin), their
        slots reserved until the result comes; hand out what it brings. ``cut``: the
        queue whose line was cut short at ``subs``; it is looked at again in another
        pass if each of them got a job (the rest of its line may get some too)."""
        claims = [Claim(sub.worker_id, sub.queues, sub.free) for sub in subs]
        for sub, claim in zip(subs, claims, strict=True):
            sub.claiming += claim.n
        pending = self.backend.claim(claims, round_robin=line is not None)
        if pending.done():  # the local backend: handed out in this pass
            self._handed(subs, claims, line, pending, None, cut)
            return
        news = _News()
        self._running.add(news)
        pending.add_done_callback(lambda came: self._handed(subs, claims, line, came, news, cut))

    def _handed(
        self,
        subs: list[Subscription],
        claims: list[Claim],
        line: dict[Subscription, None] | None,
        came: Pending[list[list[Claimed]]],
        news: _News | None,
        cut: str | None = None,
    ) -> None:
        """A claim's result: give each subscription its jobs (pushed at the end of the
        pass running now, or at once when the result came after its pass)."""
        for sub, claim in zip(subs, claims, strict=True):
            sub.claiming -= claim.n
        try:
            got_each = came.result()
        except Exception as exc:  # the backend is unavailable: it says when to try again
            log.warning("a claim failed: %s", exc)
            got_each = [[] for _ in subs]
        now = self._out is None
        out: dict[Subscription, list[Claimed]] = {} if self._out is None else self._out
        for sub, got in zip(subs, got_each, strict=True):
            if sub not in self.subscriptions:  # its connection ended while the claim ran
                if got:
                    self._orphan(sub.worker_id, {job.lease: job.id for job in got})
                continue
            if got:
                self._give(sub, got, out)
                if line is not None:
                    line.pop(sub, None)  # back at the end of the line, or off it when full
            if line is None or got:
                self._file(sub)
        if now:
            self._send(out)
        if cut is not None and all(got_each):
            self._mark(frozenset([cut]))  # (a sub may have taken from its other queues)
        if news is not None:
            self._running.discard(news)
            if news.anything:
                self._mark(None)
            elif news.queues:
                self._mark(frozenset(news.queues))

    def _send(self, out: dict[Subscription, list[Claimed]]) -> None:
        for sub, claimed in out.items():
            self._push(sub, claimed)
        # Pushes go out now, ahead of the replies queued in the same turn: a job waiting
        # for a worker is the latency that counts (a reply's sender is already busy).
        for sub in out:
            sub.flush()

    def _give(
        self, sub: Subscription, claimed: list[Claimed], out: dict[Subscription, list[Claimed]]
    ) -> None:
        owners = self._lease_owners
        for job in claimed:
            # The lease was taken when the claim ran: its deadline less its length.
            since = job.deadline - job.visibility_timeout_s
            sub.in_flight[job.lease] = Held(job.id, job.queue, job.attempt, since)
            owners[job.lease] = sub
            self._holders[job.id] = (sub, job.lease)
        out.setdefault(sub, []).extend(claimed)

    def _file(self, sub: Subscription) -> None:
        """Put ``sub`` at the end of its queues' waiting lines if it has room, else off them."""
        hungry = sub.free > 0 and not sub.congested
        for name in sub.queues:
            waiting = self._waiting[name]
            waiting.pop(sub, None)
            if hungry:
                waiting[sub] = None

    def _push(self, sub: Subscription, handles: list[Claimed]) -> None:
        """Send ``handles`` to ``sub`` in ``jobs`` frames of at most half its prefetch
        (``split_windows``, the default), or of its whole prefetch.

        Halves: a worker that acks each frame as it finishes it (the SDK acks what ended
        in one loop iteration) has the other half to work on while the broker takes its
        acks and refills. With one frame for the whole window, worker and broker took
        turns, each idle while the other worked. But with a durable store every frame
        costs a commit, and halves double the commits per window; and since a refill's
        pushes leave before its commit is written (the SQLite store's claim log), the
        worker is busy while the broker writes anyway. So the broker turns halves off
        for a durable store (the drains measured both ways: docs/benchmarks.md).

        A frame is a ``PUSH`` unless it holds a job's last attempt: then a ``LAST_PUSH``
        (``broker/egress.py`` says what each waits for).
        """
        observe = self.push_latency
        if observe is not None:
            now = self._scheduler.now()
            # One call per run of consecutive jobs of one queue, not one per job.
            for queue, run in groupby(handles, key=_queue_of):
                observe(queue, [now - handle.ready_since for handle in run])
        per_frame = max(1, (sub.prefetch + 1) // 2) if self.split_windows else sub.prefetch
        frame: list[dict[str, Any]] = []
        size = 0
        last = False  # whether the frame holds a job's last attempt
        for handle in handles:
            frame.append(pushed_job(handle))
            size += len(handle.payload_json)
            if handle.attempt >= handle.max_attempts:
                last = True
            if size >= _FRAME_PAYLOAD_BUDGET or len(frame) >= per_frame:
                sub.emit(Out.LAST_PUSH if last else Out.PUSH, jobs_push(frame))
                frame, size, last = [], 0, False
        if frame:
            sub.emit(Out.LAST_PUSH if last else Out.PUSH, jobs_push(frame))
        self.pushed += len(handles)

    def sweep(self) -> Pending[dict[str, int]]:
        """Run the backend's sweep now; its counts."""
        return then(self.backend.sweep(), _sweep_counts)

    # -- grace ----------------------------------------------------------------------------

    def _end_grace(self, worker_id: str) -> None:
        entry = self._orphans.pop(worker_id, None)
        if entry is not None:
            self._lapse(entry[0])

    def _lapse(self, held: dict[str, str]) -> None:
        # The backend tells (work_waiting) which queues got their jobs back.
        logged(self.backend.lapse([(job_id, lease) for lease, job_id in held.items()]), "lapse")


class _News:
    """What was heard while one claim ran: of these queues, or (``anything``) of any."""

    __slots__ = ("anything", "queues")

    def __init__(self) -> None:
        self.anything = False
        self.queues: set[str] = set()


def _sweep_counts(done: SweepResult) -> dict[str, int]:
    return {"expired": done.expired, "exhausted": done.exhausted, "purged": done.purged}


def logged(pending: Pending[Any], what: str) -> None:
    """A call whose result nobody waits for: its failure is logged, not lost."""

    def came(done: Pending[Any]) -> None:
        try:
            done.result()
        except Exception as exc:
            log.warning("%s failed: %s", what, exc)

    pending.add_done_callback(came)
