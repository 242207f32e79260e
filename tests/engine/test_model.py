"""Model-based test of the in-memory engine.

A hypothesis state machine drives the real ``JobTable`` (manual clock, seeded rng) and a
small reference model of ``docs/contract.md`` side by side, and after every step checks that
both agree on every job, every count, every lease and every claim order.

The model is deliberately naive: plain objects in a dict, linear scans, a sort per claim.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import random
from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from conveyor.broker.engine import InvalidArgument, JobTable, NewJob, QueueOpts

# A passing run takes a few seconds; shrinking a failure to a short sequence can take
# minutes, and the project's 60 s default would cut it off before it prints the example.
pytestmark = pytest.mark.timeout(600)

START = 1_000.0
QUEUES = ("q1", "q2")
WORKERS = ("w1", "w2")
PENDING, PROCESSING, DEAD = "pending", "processing", "dead"
EXPIRED, EXHAUSTED, FAILED = "expired", "max attempts exceeded", "failed"
MAX_HANDLES = 24  # stale handles beyond this are forgotten (valid ones never are)

FIELDS = (
    "queue",
    "state",
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
    "last_error",
    "died_at",
    "key",
    "progress_json",
)
get_fields = operator.attrgetter(*FIELDS)


class ManualClock:
    """The engine's clock: stands still until a test moves it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --------------------------------------------------------------------------- the model


@dataclass
class MJob:
    """A live row: the job fields of JOB-3, plus the current lease and the engine's seq."""

    id: str
    queue: str
    seq: int
    engine_seq: int
    payload: Any
    priority: int
    max_attempts: int
    visibility_timeout_s: float
    backoff_base_s: float
    backoff_max_s: float
    enqueued_at: float
    ready_at: float
    expires_at: float | None
    key: str | None
    state: str = PENDING
    attempts: int = 0
    worker_id: str | None = None
    deadline: float | None = None
    lease: str | None = None
    last_error: str | None = None
    died_at: float | None = None
    progress_json: bytes | None = None  # PRG-1, PRG-4: kept through retries


@dataclass
class MQueue:
    """A queue's options and pause switch, and its running totals.

    The contract does not define the totals; these are the engine's ``QueueTotals`` as
    read plainly: enqueued = new rows (not key hits), completed = acks that landed,
    retried = retries that went back to pending, dead = every death, expired = deaths by
    expiry, cancelled = cancels that found the job.
    """

    opts: QueueOpts
    paused: bool = False
    totals: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("enqueued", "completed", "retried", "dead", "expired", "cancelled"), 0
        )
    )


class Model:
    """``docs/contract.md``, written as plainly as possible."""

    def __init__(self, seed: int, opts: dict[str, QueueOpts]) -> None:
        self.now = START
        self.rng = random.Random(seed)  # drawn exactly once per curve retry, like the engine's
        self.queues = {name: MQueue(o) for name, o in opts.items()}
        self.jobs: dict[str, MJob] = {}  # live rows (any state); gone rows are simply absent
        self.seq = 0

    # -- predicates

    def expired(self, j: MJob) -> bool:
        return j.expires_at is not None and self.now >= j.expires_at

    def valid(self, job_id: str, lease: str, queue: str | None = None) -> bool:
        j = self.jobs.get(job_id)
        return (
            j is not None
            and (queue is None or j.queue == queue)
            and j.state == PROCESSING
            and j.lease == lease
            and j.deadline is not None
            and self.now < j.deadline
        )

    def find_key(self, queue: str, key: str | None) -> MJob | None:
        if key is None:
            return None
        for j in self.jobs.values():
            if j.queue == queue and j.key == key:
                return j
        return None

    # -- transitions

    def die(self, j: MJob, error: str) -> None:
        j.state = DEAD
        j.died_at = self.now
        j.worker_id = j.deadline = j.lease = None
        j.last_error = error
        totals = self.queues[j.queue].totals
        totals["dead"] += 1
        if error == EXPIRED:
            totals["expired"] += 1

    def enqueue(self, queue: str, job_id: str, engine_seq: int, payload: Any, spec: dict) -> None:
        opts = self.queues[queue].opts
        now = self.now

        def pick(name: str) -> Any:
            return spec[name] if spec[name] is not None else getattr(opts, name)

        if spec["delay_s"] is not None:
            ready_at = now + spec["delay_s"]
        elif spec["run_at"] is not None:
            ready_at = max(now, spec["run_at"])
        else:
            ready_at = now
        expires_s = pick("expires_s")
        self.seq += 1
        self.jobs[job_id] = MJob(
            id=job_id,
            queue=queue,
            seq=self.seq,
            engine_seq=engine_seq,
            payload=payload,
            priority=spec["priority"],
            max_attempts=pick("max_attempts"),
            visibility_timeout_s=pick("visibility_timeout_s"),
            backoff_base_s=pick("backoff_base_s"),
            backoff_max_s=opts.backoff_max_s,
            enqueued_at=now,
            ready_at=ready_at,
            expires_at=None if expires_s is None else now + expires_s,
            key=spec["key"],
        )
        self.queues[queue].totals["enqueued"] += 1

    def claim(self, queue: str, worker: str, n: int) -> list[str]:
        """The ids handed out, in order; rows met on the way die here. Leases are set later.

        Claimable rows (CLM-2) sorted by priority desc, ready time (a reclaim's is its
        lapsed deadline), seq (CLM-6); an expired or used-up row the claim meets before it
        has its n jobs dies in it, later rows wait for a sweep (CLM-3 to CLM-5).
        """
        if n <= 0 or self.queues[queue].paused:
            return []  # a paused queue hands out nothing, so its claim meets no row
        now = self.now
        rows: list[tuple[int, float, int, MJob]] = []
        for j in self.jobs.values():
            if j.queue != queue:
                continue
            if j.state == PENDING and j.ready_at <= now:
                rows.append((-j.priority, j.ready_at, j.seq, j))
            elif j.state == PROCESSING and j.deadline is not None and j.deadline <= now:
                rows.append((-j.priority, j.deadline, j.seq, j))  # a reclaim: ready at deadline
        rows.sort(key=lambda r: r[:3])
        out: list[str] = []
        for _, _, _, j in rows:
            if len(out) >= n:
                break  # rows after this one were not met: they wait for the sweep
            if self.expired(j):
                self.die(j, EXPIRED)
            elif j.state == PROCESSING and j.attempts >= j.max_attempts:
                self.die(j, EXHAUSTED)
            else:
                j.state = PROCESSING
                j.attempts += 1
                j.worker_id = worker
                j.deadline = now + j.visibility_timeout_s
                j.lease = None
                out.append(j.id)
        return out

    def ack(self, job_id: str, lease: str, queue: str | None = None) -> bool:
        if not self.valid(job_id, lease, queue):
            return False
        j = self.jobs.pop(job_id)
        self.queues[j.queue].totals["completed"] += 1
        return True

    def retry(self, job_id: str, lease: str, error: str | None, delay_s: float | None) -> bool:
        if not self.valid(job_id, lease):
            return False
        j = self.jobs[job_id]
        if j.attempts >= j.max_attempts:
            self.die(j, error or EXHAUSTED)
            return True
        if delay_s is None:
            exp = min(j.backoff_max_s, j.backoff_base_s * 2 ** (j.attempts - 1))
            delay = exp / 2 + self.rng.random() * (exp / 2)
        else:
            delay = delay_s
        j.state = PENDING
        j.ready_at = self.now + delay
        if error:  # None or "" means "no error given": the last one is kept
            j.last_error = error
        j.worker_id = j.deadline = j.lease = None
        self.queues[j.queue].totals["retried"] += 1
        return True

    def fail(self, job_id: str, lease: str, error: str | None) -> bool:
        if not self.valid(job_id, lease):
            return False
        self.die(self.jobs[job_id], error or FAILED)
        return True

    def heartbeat(self, job_id: str, lease: str) -> bool:
        if not self.valid(job_id, lease):
            return False
        j = self.jobs[job_id]
        j.deadline = self.now + j.visibility_timeout_s
        return True

    def lapse(self, job_id: str, lease: str) -> bool:
        if not self.valid(job_id, lease):
            return False
        self.jobs[job_id].deadline = self.now
        return True

    def progress(self, job_id: str, lease: str, value: bytes) -> bool:
        if not self.valid(job_id, lease):
            return False
        self.jobs[job_id].progress_json = value
        return True

    def cancel(self, job_id: str, queue: str | None) -> bool:
        j = self.jobs.get(job_id)
        if j is None or (queue is not None and j.queue != queue):
            return False
        del self.jobs[job_id]
        self.queues[j.queue].totals["cancelled"] += 1
        return True

    def redrive(self, job_id: str, queue: str | None) -> bool:
        j = self.jobs.get(job_id)
        if j is None or (queue is not None and j.queue != queue) or j.state != DEAD:
            return False
        j.state = PENDING
        j.attempts = 0
        j.ready_at = self.now
        j.died_at = None
        return True

    def purge_dead(self, queue: str) -> int:
        gone = [j.id for j in self.jobs.values() if j.queue == queue and j.state == DEAD]
        for job_id in gone:
            del self.jobs[job_id]
        return len(gone)

    def sweep(self, queue: str | None) -> tuple[int, int, int]:
        """The sweep (DLQ-3 to DLQ-5): expired, then used-up lapsed, then retention."""
        now = self.now
        expired = exhausted = purged = 0
        mine = [j for j in self.jobs.values() if queue is None or j.queue == queue]
        for j in mine:
            if j.state == DEAD:
                continue
            if j.expires_at is not None and j.expires_at <= now:
                self.die(j, EXPIRED)
                expired += 1
            elif (
                j.state == PROCESSING
                and j.deadline is not None
                and j.deadline <= now
                and j.attempts >= j.max_attempts
            ):
                self.die(j, EXHAUSTED)
                exhausted += 1
        for j in mine:
            retention = self.queues[j.queue].opts.dead_letter_retention_s
            if j.state == DEAD and retention is not None:
                assert j.died_at is not None
                if j.died_at + retention <= now:
                    del self.jobs[j.id]
                    purged += 1
        return expired, exhausted, purged

    # -- reads

    def stats(self, queue: str) -> dict[str, int]:
        counts = dict.fromkeys(("ready", "scheduled", PROCESSING, DEAD), 0)
        for j in self.jobs.values():
            if j.queue != queue:
                continue
            if j.state == PENDING:
                counts["ready" if j.ready_at <= self.now else "scheduled"] += 1
            else:
                counts[j.state] += 1
        return counts

    def next_event(self) -> tuple[bool, float | None]:
        """(a sweep is due now, the earliest future timed event or None).

        As the engine API puts ``next_event_at()``: a scheduled job maturing, a lease
        lapsing, a job expiring, a dead row's retention ending; a value <= now means a
        sweep is due. A lapsed lease with attempts left is not an event (a claim takes it);
        one with its attempts used up waits for a sweep, so it is due.
        """
        now = self.now
        due = False
        future: list[float] = []

        def at(t: float) -> None:
            nonlocal due
            if t <= now:
                due = True
            else:
                future.append(t)

        for j in self.jobs.values():
            if j.state == DEAD:
                retention = self.queues[j.queue].opts.dead_letter_retention_s
                if retention is not None:
                    assert j.died_at is not None
                    at(j.died_at + retention)
                continue
            if j.expires_at is not None:
                at(j.expires_at)
            if j.state == PENDING and j.ready_at > now:
                future.append(j.ready_at)
            if j.state == PROCESSING:
                assert j.deadline is not None
                if j.deadline > now:
                    future.append(j.deadline)
                elif j.attempts >= j.max_attempts:
                    due = True
        return due, (min(future) if future else None)


# --------------------------------------------------------------------------- the machine


@dataclass
class Held:
    """A lease some worker got from a claim; it may since have gone stale."""

    id: str
    lease: str
    queue: str
    handle: Any


job_specs = st.fixed_dictionaries(
    {
        "priority": st.sampled_from([0, 0, 3, -1]),
        "delay_s": st.sampled_from([None, None, None, 0.0, 1.5, 5.0]),
        "run_at": st.sampled_from([None, None, None, -2.0, 0.0, 3.0]),  # relative to now
        "expires_s": st.sampled_from([None, None, None, None, 3.0, 9.0]),
        "max_attempts": st.sampled_from([None, None, 1, 2, 3]),
        "visibility_timeout_s": st.sampled_from([None, 2.0, 5.0]),
        "backoff_base_s": st.sampled_from([None, 0.0, 2.0]),
        "key": st.sampled_from([None, None, "a", "b"]),
    }
)
indexes = st.integers(0, 63)
ops = st.sampled_from(["ack", "retry", "retry", "retry", "fail", "heartbeat", "heartbeat", "lapse"])
errors = st.sampled_from([None, "", "boom", "oops"])
retry_delays = st.sampled_from([None, None, None, 0.0, 2.5])
claim_sizes = st.sampled_from([-1, 0, 1, 1, 2, 2, 3, 3])
CHURN = 70  # rows per churn step: more than the engine's heaps leave stale before compacting
PLAIN_SPEC = dict.fromkeys(
    (
        "priority",
        "delay_s",
        "run_at",
        "expires_s",
        "max_attempts",
        "visibility_timeout_s",
        "backoff_base_s",
        "key",
    )
)
BAD_OPTIONS = [  # (field, value) that a guard must refuse
    ("priority", 2**31),
    ("priority", True),
    ("delay_s", -1.0),
    ("expires_s", 0.0),
    ("max_attempts", 0),
    ("visibility_timeout_s", math.nan),
    ("backoff_base_s", math.inf),
]

enqueue_args = {
    "queue": st.sampled_from(QUEUES),
    "specs": st.lists(job_specs, min_size=1, max_size=4),
    "batch": st.booleans(),
}

claim_args = {
    "queue": st.sampled_from(QUEUES),
    "worker": st.sampled_from(WORKERS),
    "n": claim_sizes,
    "one": st.booleans(),
}

op_args = {
    "i": indexes,
    "op": ops,
    "via_table": st.booleans(),
    "error": errors,
    "delay_s": retry_delays,
}


class EngineVsModel(RuleBasedStateMachine):
    """Two queues (q2 with dead-letter retention and maybe an expiry default), two workers.

    Every rule does one thing to the engine and the same to the model and compares the
    answers; the invariants then compare every job, the stats, the valid leases and
    ``next_event_at()``. Handles are kept after they go stale, to be tried again.
    """

    @initialize(
        seed=st.integers(0, 2**32 - 1),
        retention=st.sampled_from([0.0, 3.0, 7.5]),
        q2_expires=st.sampled_from([None, 30.0]),
        prefill=st.lists(st.tuples(st.sampled_from(QUEUES), job_specs), max_size=6),
    )
    def setup(
        self,
        seed: int,
        retention: float,
        q2_expires: float | None,
        prefill: list[tuple[str, dict]],
    ) -> None:
        opts = {
            "q1": QueueOpts(
                visibility_timeout_s=10.0, max_attempts=3, backoff_base_s=1.0, backoff_max_s=3.0
            ),
            "q2": QueueOpts(
                visibility_timeout_s=4.0,
                max_attempts=3,
                backoff_base_s=0.5,
                backoff_max_s=60.0,
                expires_s=q2_expires,
                dead_letter_retention_s=retention,
            ),
        }
        self.clock = ManualClock(START)
        self.table = JobTable(clock=self.clock, rng=random.Random(seed))
        self.q = {name: self.table.queue(name, o) for name, o in opts.items()}
        self.model = Model(seed, opts)
        self.held: list[Held] = []
        self.ids: list[str] = []  # every id ever handed out by enqueue
        self.seen_gone: set[str] = set()
        self.leases: set[str] = set()  # every lease ever issued
        self.last_seq: int | None = None
        self.payloads = 0
        for queue, spec in prefill:
            self.enqueue(queue, [spec], batch=False)

    # -- helpers

    def other(self, queue: str) -> str:
        return "q2" if queue == "q1" else "q1"

    def valid_held(self) -> list[Held]:
        return [h for h in self.held if self.model.valid(h.id, h.lease)]

    def forget_stale(self) -> None:
        stale = [h for h in self.held if not self.model.valid(h.id, h.lease)]
        for h in stale[: max(0, len(self.held) - MAX_HANDLES)]:
            self.held.remove(h)

    def check_job(self, job: Any, m: MJob, where: str, *, payload: bool = False) -> None:
        if get_fields(job) == get_fields(m) and job.seq == m.engine_seq and job.id == m.id:
            if not payload or job.payload == m.payload:
                return
        diff = {
            name: (getattr(m, name), getattr(job, name))
            for name in FIELDS
            if getattr(job, name) != getattr(m, name)
        }
        if job.seq != m.engine_seq:
            diff["seq"] = (m.engine_seq, job.seq)
        if job.id != m.id:
            diff["id"] = (m.id, job.id)
        if payload and job.payload != m.payload:
            diff["payload"] = (m.payload, job.payload)
        raise AssertionError(f"{where} {m.id}: field: (model, engine) {diff}")

    # -- enqueue

    def prepare(self, spec: dict) -> tuple[Any, dict]:
        self.payloads += 1
        kwargs = dict(spec)
        if kwargs["run_at"] is not None:
            kwargs["run_at"] = self.model.now + kwargs["run_at"]
        return {"n": self.payloads}, kwargs

    def after_enqueue(self, queue: str, job_id: str, payload: Any, spec: dict) -> None:
        existing = self.model.find_key(queue, spec["key"])
        if existing is not None:
            assert job_id == existing.id, "same key on same queue must return the existing id"
            return
        assert job_id not in self.ids, (
            f"enqueue with key {spec['key']!r} returned {job_id}, an id already issued, "
            "though no live job of the queue has that key"
        )
        job = self.table.get_job(job_id)
        assert job is not None
        job.payload["n"] = -1  # a snapshot is a copy: changing it changes nothing
        if self.last_seq is not None:
            assert job.seq > self.last_seq, "seq must grow with each enqueue"
        self.last_seq = job.seq
        self.ids.append(job_id)
        self.model.enqueue(queue, job_id, job.seq, payload, spec)
        self.check_job(job, self.model.jobs[job_id], "enqueued", payload=True)

    @rule(**enqueue_args)
    def enqueue(self, queue: str, specs: list[dict], batch: bool) -> None:
        if batch:
            self.enqueue_batch(queue, specs)
            return
        for spec in specs:
            payload, kwargs = self.prepare(spec)
            job_id = self.q[queue].enqueue(payload, **kwargs)
            self.after_enqueue(queue, job_id, payload, kwargs)

    @rule(**enqueue_args)
    def enqueue_more(self, queue: str, specs: list[dict], batch: bool) -> None:
        self.enqueue(queue, specs, batch)  # a second rule, to weight enqueues double

    def enqueue_batch(self, queue: str, specs: list[dict]) -> None:
        seen: set[str] = set()
        prepared = []
        for spec in specs:
            if spec["key"] in seen:  # a key repeated inside one batch is left unspecified
                spec = {**spec, "key": None}
            if spec["key"] is not None:
                seen.add(spec["key"])
            prepared.append(self.prepare(spec))
        ids = self.q[queue].enqueue_batch([NewJob(p, **kw) for p, kw in prepared])
        assert len(ids) == len(prepared)
        for job_id, (payload, kwargs) in zip(ids, prepared, strict=True):
            self.after_enqueue(queue, job_id, payload, kwargs)

    @rule(
        queue=st.sampled_from(QUEUES),
        specs=st.lists(job_specs, min_size=1, max_size=3),
        i=indexes,
        bad=st.sampled_from(BAD_OPTIONS),
    )
    def enqueue_bad_batch(self, queue: str, specs: list[dict], i: int, bad: tuple) -> None:
        """A batch with one bad job is rejected whole, naming the job and field."""
        name, value = bad
        index = i % len(specs)
        jobs = [NewJob({"bad": k}, **self.prepare(spec)[1]) for k, spec in enumerate(specs)]
        jobs[index] = dataclasses.replace(jobs[index], **{name: value})
        with pytest.raises(InvalidArgument) as exc:
            self.q[queue].enqueue_batch(jobs)
        assert exc.value.field == f"jobs[{index}].{name}"

    @rule(queue=st.sampled_from(QUEUES), claim=st.booleans())
    def churn(self, queue: str, claim: bool) -> None:
        """Enough rows come and go in one step that the engine compacts its indexes.

        CHURN top-priority jobs (with an expiry, scheduled unless ``claim``) are enqueued,
        then claimed and acked, or cancelled. They go first in claim order, so the claim
        meets no other row; the other rows must come out of the compaction unharmed.
        """
        q, m = self.q[queue], self.model
        spec = {
            **PLAIN_SPEC,
            "priority": 10,
            "expires_s": 50.0,
            "delay_s": None if claim else 1.0,
        }
        payloads = [{"churn": k} for k in range(CHURN)]
        ids = q.enqueue_batch([NewJob(p, **spec) for p in payloads])
        for job_id, payload in zip(ids, payloads, strict=True):
            job = q.get_job(job_id)
            assert job is not None
            m.enqueue(queue, job_id, job.seq, payload, spec)
        handles = q.claim_batch("w1", CHURN) if claim else []
        want = m.claim(queue, "w1", CHURN) if claim else []
        assert [h.id for h in handles] == want == (ids if want else [])
        for h in handles:
            m.jobs[h.id].lease = h.lease
        landed = q.ack_batch([(h.id, h.lease) for h in handles])
        assert landed == sum(m.ack(h.id, h.lease, queue) for h in handles) == len(handles)
        for job_id in ids:
            if job_id in m.jobs:
                assert q.cancel(job_id) is m.cancel(job_id, queue) is True
            assert self.table.get_job(job_id) is None

    # -- claims

    @rule(**claim_args)
    def claim_more(self, queue: str, worker: str, n: int, one: bool) -> None:
        self.claim(queue, worker, n, one)  # a second rule, to weight claims double

    @rule(**claim_args)
    def claim(self, queue: str, worker: str, n: int, one: bool) -> None:
        if one and n == 1:
            h = self.q[queue].claim_one(worker)
            handles = [] if h is None else [h]
        else:
            handles = self.q[queue].claim_batch(worker, n)
        want = self.model.claim(queue, worker, n)
        got = [h.id for h in handles]
        assert got == want, f"claim_batch({worker!r}, {n}) on {queue}: model {want}, engine {got}"
        for h in handles:
            assert h.lease not in self.leases, "a claim must issue a new lease"
            self.leases.add(h.lease)
            m = self.model.jobs[h.id]
            m.lease = h.lease
            self.check_job(h.job, m, "claim snapshot", payload=True)
            self.held.append(Held(h.id, h.lease, queue, h))
        self.forget_stale()

    # -- handle operations

    def handle_op(
        self, h: Held, op: str, via_table: bool, error: str | None, delay_s: float | None
    ) -> None:
        t, m = self.table, self.model
        if op == "ack":
            got = t.ack(h.id, h.lease) if via_table else h.handle.ack()
            want = m.ack(h.id, h.lease)
        elif op == "retry":
            if via_table:
                got = t.retry(h.id, h.lease, error=error, delay_s=delay_s)
            else:
                got = h.handle.retry(error=error, delay_s=delay_s)
            want = m.retry(h.id, h.lease, error, delay_s)
        elif op == "fail":
            got = t.fail(h.id, h.lease, error=error) if via_table else h.handle.fail(error=error)
            want = m.fail(h.id, h.lease, error)
        elif op == "heartbeat":
            got = t.heartbeat(h.id, h.lease) if via_table else h.handle.heartbeat()
            want = m.heartbeat(h.id, h.lease)
        else:
            got = t.lapse(h.id, h.lease)
            want = m.lapse(h.id, h.lease)
        assert got is want, f"{op} on {h.id}: model {want}, engine {got}"

    @precondition(lambda self: bool(self.valid_held()))
    @rule(**op_args)
    def op_on_valid_lease(
        self, i: int, op: str, via_table: bool, error: str | None, delay_s: float | None
    ) -> None:
        live = self.valid_held()
        self.handle_op(live[i % len(live)], op, via_table, error, delay_s)

    @precondition(lambda self: bool(self.valid_held()))
    @rule(**op_args)
    def op_on_valid_lease_more(
        self, i: int, op: str, via_table: bool, error: str | None, delay_s: float | None
    ) -> None:
        self.op_on_valid_lease(i, op, via_table, error, delay_s)  # weighted double

    @precondition(lambda self: bool(self.held))
    @rule(**op_args)
    def op_on_any_lease(
        self, i: int, op: str, via_table: bool, error: str | None, delay_s: float | None
    ) -> None:
        self.handle_op(self.held[i % len(self.held)], op, via_table, error, delay_s)

    @precondition(lambda self: bool(self.held))
    @rule(picks=st.lists(indexes, min_size=1, max_size=4), n=st.integers(0, 99))
    def progress(self, picks: list[int], n: int) -> None:
        """PRG-1, PRG-2: stored under a valid lease only, the latest winning."""
        chosen = [self.held[i % len(self.held)] for i in picks]
        items = [(h.id, h.lease, str(n + k).encode()) for k, h in enumerate(chosen)]
        got = self.table.progress_many(items)
        want = [self.model.progress(*item) for item in items]
        assert got == want, f"progress {items}: model {want}, engine {got}"

    @rule(
        queue=st.sampled_from(QUEUES),
        picks=st.lists(indexes, max_size=4),
        junk=st.booleans(),
    )
    def ack_batch(self, queue: str, picks: list[int], junk: bool) -> None:
        chosen = [self.held[i % len(self.held)] for i in picks] if self.held else []
        entries = [(h.id, h.lease) for h in chosen]
        if junk:
            entries.append(("no-such-id", "no-such-lease"))
            if self.ids:
                entries.append((self.ids[-1], "forged-lease"))
        got = self.q[queue].ack_batch(entries)
        want = sum(self.model.ack(job_id, lease, queue) for job_id, lease in entries)
        assert got == want, f"ack_batch on {queue} {entries}: model {want}, engine {got}"

    @precondition(lambda self: bool(self.held))
    @rule(i=indexes, via_table=st.booleans(), delay_s=st.sampled_from([-1.0, math.inf, math.nan]))
    def retry_with_bad_delay(self, i: int, via_table: bool, delay_s: float) -> None:
        """A bad delay_s raises on any lease, valid or stale, and changes nothing."""
        h = self.held[i % len(self.held)]
        with pytest.raises(InvalidArgument) as exc:
            if via_table:
                self.table.retry(h.id, h.lease, error="bad", delay_s=delay_s)
            else:
                h.handle.retry(error="bad", delay_s=delay_s)
        assert exc.value.field == "delay_s"

    # -- operator actions

    def pick_id(self, i: int, action: str) -> str:
        """Often a dead job for a redrive, else any id ever issued (maybe gone), or none."""
        if i >= 60 or not self.ids:
            return "no-such-id"
        if action == "redrive" and i < 40:
            dead = [j.id for j in self.model.jobs.values() if j.state == DEAD]
            if dead:
                return dead[i % len(dead)]
        return self.ids[i % len(self.ids)]

    @rule(
        action=st.sampled_from(
            ["cancel", "cancel", "redrive", "redrive", "pause", "resume", "purge"]
        ),
        i=indexes,
        via=st.sampled_from([None, *QUEUES]),
    )
    def operator(self, action: str, i: int, via: str | None) -> None:
        """Cancel or redrive (by table or by queue), pause, resume, purge_dead."""
        if action in ("cancel", "redrive"):
            job_id = self.pick_id(i, action)
            target = self.table if via is None else self.q[via]
            got = getattr(target, action)(job_id)
            want = getattr(self.model, action)(job_id, via)
            assert got is want, f"{action}({job_id}) via {via}: model {want}, engine {got}"
            return
        queue = via or QUEUES[i % 2]
        if action == "purge":
            got_n = self.q[queue].purge_dead()
            want_n = self.model.purge_dead(queue)
            assert got_n == want_n, f"purge_dead on {queue}: model {want_n}, engine {got_n}"
        elif action == "pause":
            self.q[queue].pause()
            self.model.queues[queue].paused = True
        else:
            self.q[queue].resume()
            self.model.queues[queue].paused = False

    @rule(via=st.sampled_from([None, *QUEUES]))
    def sweep(self, via: str | None) -> None:
        r = self.table.sweep_expired() if via is None else self.q[via].sweep_expired()
        got = (r.expired, r.exhausted, r.purged)
        want = self.model.sweep(via)
        assert got == want, f"sweep via {via}: (expired, exhausted, purged) model {want}, got {got}"

    # -- time

    def set_now(self, t: float) -> None:
        assert t >= self.model.now
        self.clock.now = self.model.now = t

    @rule(dt=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.5, 7.0]))
    def advance(self, dt: float) -> None:
        self.set_now(self.model.now + dt)

    @rule(use_engine=st.booleans())
    def advance_to_next_event(self, use_engine: bool) -> None:
        t = self.table.next_event_at() if use_engine else self.model.next_event()[1]
        if t is not None and t > self.model.now:
            self.set_now(t)

    # -- invariants

    @invariant()
    def jobs_agree(self) -> None:
        for job_id in self.ids:
            m = self.model.jobs.get(job_id)
            job = self.table.get_job(job_id)
            if m is None:
                assert job is None, f"{job_id} should be gone, engine has it as {job.state}"
                if job_id not in self.seen_gone:
                    self.seen_gone.add(job_id)
                    for q in self.q.values():
                        assert q.get_job(job_id) is None
                continue
            assert job is not None, f"{job_id} should be {m.state}, engine lost it"
            self.check_job(job, m, "table.get_job")
            self.check_job(self.q[m.queue].get_job(job_id), m, "queue.get_job")
            assert self.q[self.other(m.queue)].get_job(job_id) is None

    @invariant()
    def stats_agree(self) -> None:
        for name, q in self.q.items():
            s = q.stats()
            mq = self.model.queues[name]
            want = self.model.stats(name)
            got = {"ready": s.ready, "scheduled": s.scheduled, PROCESSING: s.processing}
            got[DEAD] = s.dead
            assert got == want, f"stats of {name}: model {want}, engine {got}"
            assert s.pending == want["ready"] + want["scheduled"]
            assert s.paused is mq.paused and q.paused is mq.paused
            totals = {k: getattr(s.totals, k) for k in mq.totals}
            assert totals == mq.totals, f"totals of {name}: model {mq.totals}, engine {totals}"

    @invariant()
    def leases_agree(self) -> None:
        """The engine accepts exactly the leases the model calls valid.

        ``held_leases()`` must list exactly the model's valid leases. The model holds at
        most one valid lease per job, by construction. Every lease it calls invalid must be
        refused by the engine (a refused heartbeat changes nothing), so the engine never
        has two valid leases on one job either. A valid lease whose deadline is exactly
        now + visibility (no time has passed since its claim or last heartbeat) is probed
        too: a heartbeat then writes the deadline it already has.
        """
        now = self.model.now
        valid = self.valid_held()
        assert len({h.id for h in valid}) == len(valid)
        want = {
            (j.id, j.lease, j.worker_id)
            for j in self.model.jobs.values()
            if j.state == PROCESSING and j.deadline is not None and now < j.deadline
        }
        got = set(self.table.held_leases())
        assert got == want, f"held_leases: model {sorted(want)}, engine {sorted(got)}"
        for h in self.held:
            m = self.model.jobs.get(h.id)
            if h in valid:
                assert m is not None and m.deadline is not None
                if m.deadline == now + m.visibility_timeout_s:
                    assert self.table.heartbeat(h.id, h.lease) is True, (
                        f"valid lease of {h.id} refused"
                    )
            else:
                assert self.table.heartbeat(h.id, h.lease) is False, (
                    f"stale lease of {h.id} still accepted"
                )

    @invariant()
    def lease_index_holds_only_live_claims(self) -> None:
        """The table's index of its claims by lease (the acks' fast path) names only rows
        still processing under that lease, by their own id: an entry left behind would
        be a leak, and could land a report on a job the lease was not issued for."""
        leased = self.table._leased
        for lease, (job_id, row) in leased.items():
            assert row.state == PROCESSING and row.lease == lease, (lease, job_id, row.state)
            assert self.table._lookup(job_id) is row, (lease, job_id)
        assert len(leased) <= sum(q.stats().processing for q in self.q.values())

    @invariant()
    def next_event_agrees(self) -> None:
        due, future = self.model.next_event()
        got = self.table.next_event_at()
        if due:
            assert got is not None and got <= self.model.now, (
                f"a sweep is due at {self.model.now}, engine next_event_at {got}"
            )
        else:
            assert got == future, f"next_event_at: model {future}, engine {got}"


EngineVsModel.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineVsModel = EngineVsModel.TestCase
