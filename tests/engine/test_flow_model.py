"""Model-based test of flow control (``docs/contract.md``, FLW-1 to FLW-8).

A hypothesis state machine drives one queue of the real ``JobTable`` (manual clock)
through random enqueues over a few partition keys and priorities, claims, acks, retries,
fails, cancels, heartbeats, lapses, back-offs, limit changes, pauses, sweeps and clock
steps. Job states are read back from the engine (``tests/engine/test_model.py`` checks
those transitions against a model of their own); what this machine keeps itself is what
flow control promises: the slots held, a token bucket per queue and per key computed by
the formula of FLW-4, and the back-offs. Every claim is checked against them:

* it hands out only claimable jobs, none that another valid lease holds, and never
  more than the slots free in the queue and in each key: none while a limit lowered
  below the slots held is not yet under (FLW-2);
* each job it hands out passes the queue's and its key's bucket at that instant, and
  over the claims made since the limits last changed no stretch of ``t`` seconds holds
  more than ``burst + t / T`` (FLW-4); nothing of a backed-off key or queue (FLW-6), and
  nothing at all from a paused queue (FLW-7);
* it is short only when every claimable job left is held back by a limit (FLW-5: a key
  at its limit is skipped, not waited for); a single claim takes the highest priority the
  limits let through, and the first job of its key in claim order (FLW-5, CLM-6).

After every step the queue's stats must match counts taken from the jobs and the limits
(FLW-8). At the end the queue is drained: each claim's jobs acked, the clock moved to
``next_event_at()`` whenever nothing is claimable, until every job is handed out or dead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conveyor.broker.engine import Job, JobHandle, JobState, JobTable, Limits, QueueOpts

pytestmark = pytest.mark.timeout(600)  # shrinking a failure takes longer than a pass

START = 1_000.0
KEYS = ("a", "b", "c")
EPS = 1e-9
MAX_JOBS = 40  # enqueues stop here, to keep each step's look at every job cheap
DRAIN_STEPS = 2_000

PENDING, PROCESSING, DEAD = JobState.PENDING, JobState.PROCESSING, JobState.DEAD

LIMITS = [
    Limits(),
    Limits(concurrency=1),
    Limits(concurrency=3),
    Limits(partition_concurrency=1),
    Limits(partition_concurrency=2),
    Limits(concurrency=2, partition_concurrency=1),
    Limits(rate=2, per_s=1.0, burst=3),
    Limits(rate=1, per_s=0.5),
    Limits(partition_rate=1, partition_per_s=1.0),
    Limits(partition_rate=3, partition_per_s=2.0, partition_burst=2),
    Limits(concurrency=4, rate=4, per_s=1.0, burst=2, partition_concurrency=1),
    Limits(partition_concurrency=2, partition_rate=2, partition_per_s=1.0, partition_burst=2),
]


class ManualClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Bucket:
    """FLW-4 as written: interval ``T``, bucket time ``tat`` (start: now, i.e. full)."""

    interval: float
    tolerance: float
    burst: int
    tat: float = -math.inf
    times: list[float] = field(default_factory=list)  # claims since the limits changed

    @classmethod
    def of(cls, rate: int | None, per_s: float, burst: int | None) -> Bucket | None:
        if rate is None:
            return None
        interval = per_s / rate
        return cls(interval, ((burst or 1) - 1) * interval, burst or 1)

    def allows(self, now: float) -> bool:
        return now >= self.tat - self.tolerance

    def take(self, now: float) -> None:
        self.tat = max(self.tat, now) + self.interval
        self.times.append(now)
        # In any stretch of t seconds at most burst + t / T claims: check every stretch
        # that ends with this claim.
        for i, start in enumerate(self.times):
            within = len(self.times) - i
            assert within <= self.burst + (now - start) / self.interval + EPS, (
                f"{within} claims in {now - start} s: over burst {self.burst} + t / T"
            )


@dataclass
class Flow:
    """What the machine keeps of the queue's flow control."""

    limits: Limits = field(default_factory=Limits)
    bucket: Bucket | None = None
    key_buckets: dict[str, Bucket] = field(default_factory=dict)
    until: float = -math.inf
    key_until: dict[str, float] = field(default_factory=dict)
    paused: bool = False
    # The most slots that may be held (a limit lowered below those held allows them).
    allowance: int | None = None
    key_allowance: dict[str, int] = field(default_factory=dict)

    def key_bucket(self, key: str) -> Bucket | None:
        bucket = self.key_buckets.get(key)
        if bucket is None:
            lim = self.limits
            made = Bucket.of(lim.partition_rate, lim.partition_per_s, lim.partition_burst)
            if made is None:
                return None
            bucket = self.key_buckets[key] = made
        return bucket

    def queue_blocked(self, held: int, now: float) -> bool:
        cap = self.limits.concurrency
        return (
            (cap is not None and held >= cap)
            or (self.bucket is not None and not self.bucket.allows(now))
            or self.until > now
        )

    def key_blocked(self, key: str, held: int, now: float) -> bool:
        cap = self.limits.partition_concurrency
        bucket = self.key_bucket(key)
        return (
            (cap is not None and held >= cap)
            or (bucket is not None and not bucket.allows(now))
            or self.key_until.get(key, -math.inf) > now
        )


def claimable(job: Job, now: float) -> bool:
    """CLM-2: ready and pending, or under a lease that lapsed."""
    if job.state is PENDING:
        return job.ready_at <= now
    return job.state is PROCESSING and job.deadline is not None and job.deadline <= now


def valid(job: Job, now: float) -> bool:
    return job.state is PROCESSING and job.deadline is not None and now < job.deadline


def dies_when_met(job: Job, now: float) -> bool:
    """A claimable job a claim kills instead of handing out (CLM-3, CLM-4)."""
    expired = job.expires_at is not None and now >= job.expires_at
    used_up = job.state is PROCESSING and job.attempts >= job.max_attempts
    return expired or used_up


def claim_order(job: Job) -> tuple[int, float, int]:
    """CLM-6; a reclaim is ready from its lapsed deadline."""
    ready = job.deadline if job.state is PROCESSING else job.ready_at
    assert ready is not None
    return (-job.priority, ready, job.seq)


@dataclass
class Held:
    id: str
    lease: str
    handle: JobHandle


job_specs = st.fixed_dictionaries(
    {
        "partition": st.sampled_from([None, "a", "a", "b", "c"]),
        "priority": st.sampled_from([0, 0, 0, 1, -1]),
        "delay_s": st.sampled_from([None, None, None, 0.5, 2.0]),
        "expires_s": st.sampled_from([None, None, None, None, 3.0]),
        "max_attempts": st.sampled_from([1, 3, 3]),
    }
)
indexes = st.integers(0, 63)
steps = st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 3.0])
delays = st.sampled_from([0.0, 0.5, 2.0, 5.0])


class FlowMachine(RuleBasedStateMachine):
    @initialize(limits=st.sampled_from(LIMITS), first=st.lists(job_specs, max_size=8))
    def setup(self, limits: Limits, first: list[dict[str, Any]]) -> None:
        self.clock = ManualClock(START)
        self.table = JobTable(clock=self.clock, id_prefix="t")
        self.q = self.table.queue("q", QueueOpts(visibility_timeout_s=2.0, backoff_base_s=0.5))
        self.flow = Flow()
        self.ids: list[str] = []
        self.held: list[Held] = []  # every lease handed out, valid or not
        self.lease_of: dict[str, str] = {}  # each job's latest lease
        self.set_limits(limits)
        for spec in first:
            self.enqueue(spec)

    # -- reading the engine

    @property
    def now(self) -> float:
        return self.clock.now

    def jobs(self) -> dict[str, Job]:
        """Every live job, as the engine has it now."""
        out = {}
        for job_id in self.ids:
            job = self.q.get_job(job_id)
            if job is not None:
                out[job_id] = job
        return out

    def held_counts(self, jobs: dict[str, Job]) -> tuple[int, dict[str, int]]:
        """Valid leases of the queue and of each key (FLW-2: the slots held)."""
        total = 0
        per_key: dict[str, int] = {}
        for job in jobs.values():
            if valid(job, self.now):
                total += 1
                if job.partition is not None:
                    per_key[job.partition] = per_key.get(job.partition, 0) + 1
        return total, per_key

    def blocked(self, job: Job, held: int, per_key: dict[str, int]) -> bool:
        """Whether the limits, back-offs or pause hold ``job`` back now."""
        flow, now = self.flow, self.now
        if flow.paused or flow.queue_blocked(held, now):
            return True
        key = job.partition
        return key is not None and flow.key_blocked(key, per_key.get(key, 0), now)

    # -- rules: work in

    def enqueue(self, spec: dict[str, Any]) -> None:
        if len(self.ids) < MAX_JOBS:
            self.ids.append(self.q.enqueue({"n": len(self.ids)}, **spec))

    @rule(specs=st.lists(job_specs, min_size=1, max_size=3))
    def enqueue_some(self, specs: list[dict[str, Any]]) -> None:
        for spec in specs:
            self.enqueue(spec)

    # -- rules: claims

    def claim(self, n: int, one: bool) -> list[JobHandle]:
        before = self.jobs()
        held, per_key = self.held_counts(before)
        flow, now = self.flow, self.now
        rivals = self.let_through(before, held, per_key) if n == 1 else []
        if one:
            h = self.q.claim_one("w")
            handles = [] if h is None else [h]
        else:
            handles = self.q.claim_batch("w", n)
        if flow.paused:
            assert handles == [], "a paused queue handed out a job"
        assert len({h.id for h in handles}) == len(handles), "a job twice in one claim"
        for h in handles:
            job = before.get(h.id)
            assert job is not None, f"{h.id}: not a live job of the queue"
            assert claimable(job, now), f"{h.id} handed out while {job.state}, not claimable"
            assert not dies_when_met(job, now), f"{h.id} handed out expired or used up"
            key = job.partition
            assert h.partition == key
            cap = flow.limits.concurrency
            assert cap is None or held < cap, f"claim over concurrency {cap} ({held} held)"
            assert flow.until <= now, "a claim during the queue's back-off"
            if flow.bucket is not None:
                assert flow.bucket.allows(now), "a claim the queue's bucket refuses"
                flow.bucket.take(now)
            held += 1
            if key is not None:
                pcap = flow.limits.partition_concurrency
                key_held = per_key.get(key, 0)
                assert pcap is None or key_held < pcap, (
                    f"claim over partition_concurrency {pcap} of {key!r} ({key_held} held)"
                )
                assert flow.key_until.get(key, -math.inf) <= now, f"{key!r} is backed off"
                bucket = flow.key_bucket(key)
                if bucket is not None:
                    assert bucket.allows(now), f"a claim the bucket of {key!r} refuses"
                    bucket.take(now)
                per_key[key] = key_held + 1
            self.lease_of[h.id] = h.lease
            self.held.append(Held(h.id, h.lease, h))
        if n == 1 and handles:
            self.check_order(before[handles[0].id], rivals)
        if len(handles) < n and not flow.paused:
            self.check_short(held, per_key)
        return handles

    def let_through(self, jobs: dict[str, Job], held: int, per_key: dict[str, int]) -> list[Job]:
        """The jobs a claim may hand out now (none that it would kill on meeting)."""
        return [
            job
            for job in jobs.values()
            if claimable(job, self.now)
            and not dies_when_met(job, self.now)
            and not self.blocked(job, held, per_key)
        ]

    def check_order(self, got: Job, rivals: list[Job]) -> None:
        """A single claim took the highest priority let through, and its key's first."""
        top = max(job.priority for job in rivals)
        assert got.priority == top, f"{got.id} of priority {got.priority}; {top} was let through"
        same = [job for job in rivals if job.partition == got.partition]
        first = min(same, key=claim_order)
        assert first.id == got.id, f"{got.id} handed out before {first.id} of its key"

    def check_short(self, held: int, per_key: dict[str, int]) -> None:
        """A claim that came back short left only jobs a limit holds back."""
        for job in self.jobs().values():
            if claimable(job, self.now):
                assert self.blocked(job, held, per_key), (
                    f"{job.id} ({job.partition!r}) claimable and let through, not handed out"
                )

    @rule(n=st.integers(1, 4), one=st.booleans())
    def claim_some(self, n: int, one: bool) -> None:
        self.claim(n, one and n == 1)

    @rule(n=st.integers(1, 4))
    def claim_more(self, n: int) -> None:
        self.claim(n, n == 1)

    # -- rules: lease operations

    def live(self) -> list[Held]:
        jobs = self.jobs()
        return [
            h
            for h in self.held
            if h.id in jobs and valid(jobs[h.id], self.now) and self.lease_of[h.id] == h.lease
        ]

    @precondition(lambda self: bool(self.live()))
    @rule(
        i=indexes,
        op=st.sampled_from(
            ["ack", "ack", "retry", "fail", "cancel", "heartbeat", "lapse", "back_off"]
        ),
        delay=delays,
        partition=st.sampled_from([None, None, None, "a", "b"]),
        whole=st.sampled_from([False, False, False, True]),
    )
    def on_valid_lease(
        self, i: int, op: str, delay: float, partition: str | None, whole: bool
    ) -> None:
        live = self.live()
        h = live[i % len(live)]
        t = self.table
        if op == "ack":
            assert t.ack(h.id, h.lease) is True
        elif op == "retry":
            assert t.retry(h.id, h.lease, "again", delay_s=delay) is True
        elif op == "fail":
            assert t.fail(h.id, h.lease, "boom") is True
        elif op == "cancel":
            assert t.cancel(h.id) is True
        elif op == "heartbeat":
            assert t.heartbeat(h.id, h.lease) is True
        elif op == "lapse":
            assert t.lapse(h.id, h.lease) is True
        else:
            before = self.q.get_job(h.id)
            assert before is not None
            assert t.back_off(h.id, h.lease, delay, partition, whole) is True
            after = self.q.get_job(h.id)
            assert after is not None
            assert after.state is PENDING and after.attempts == before.attempts - 1
            assert after.ready_at == before.ready_at and after.deadline is None
            key = None if whole else partition if partition is not None else before.partition
            self.hold(key, delay)

    @precondition(lambda self: bool(self.held))
    @rule(i=indexes, op=st.sampled_from(["ack", "back_off", "heartbeat"]))
    def on_any_lease(self, i: int, op: str) -> None:
        """A lease no longer valid changes nothing (a valid one is used as above)."""
        h = self.held[i % len(self.held)]
        if h in self.live():
            return
        t = self.table
        if op == "ack":
            assert t.ack(h.id, h.lease) is False
        elif op == "heartbeat":
            assert t.heartbeat(h.id, h.lease) is False
        else:
            assert t.back_off(h.id, h.lease, 5.0, None, True) is False

    def hold(self, key: str | None, delay: float) -> None:
        """A back-off of ``key`` (the queue when ``None``): extends, never shortens."""
        until = self.now + delay
        flow = self.flow
        if key is None:
            flow.until = max(flow.until, until)
        else:
            flow.key_until[key] = max(flow.key_until.get(key, -math.inf), until)

    @rule(partition=st.sampled_from([None, *KEYS]), delay=delays)
    def back_off_by_operator(self, partition: str | None, delay: float) -> None:
        self.q.back_off(partition, delay)
        self.hold(partition, delay)

    # -- rules: operator

    @rule(i=indexes)
    def cancel_any(self, i: int) -> None:
        if self.ids:
            job_id = self.ids[i % len(self.ids)]
            live = job_id in self.jobs()
            assert self.q.cancel(job_id) is live

    @rule(limits=st.sampled_from(LIMITS))
    def set_limits(self, limits: Limits) -> None:
        self.q.set_limits(limits)
        flow = self.flow
        flow.limits = limits
        flow.bucket = Bucket.of(limits.rate, limits.per_s, limits.burst)
        flow.key_buckets = {}  # buckets start afresh (FLW-9); back-offs stand
        held, per_key = self.held_counts(self.jobs())
        flow.allowance = None if limits.concurrency is None else max(limits.concurrency, held)
        pcap = limits.partition_concurrency
        flow.key_allowance = {} if pcap is None else {k: max(pcap, n) for k, n in per_key.items()}

    @rule(pause=st.booleans())
    def pause_or_resume(self, pause: bool) -> None:
        if pause:
            self.q.pause()
        else:
            self.q.resume()
        self.flow.paused = pause

    @rule()
    def sweep(self) -> None:
        self.table.sweep_expired()

    # -- rules: time

    @rule(dt=steps)
    def advance(self, dt: float) -> None:
        self.clock.now += dt

    @rule()
    def advance_to_next_event(self) -> None:
        t = self.table.next_event_at()
        if t is not None and t > self.now:
            self.clock.now = t

    # -- invariants

    @invariant()
    def slots_within_limits(self) -> None:
        """Valid leases never exceed a limit, but for those held when it was lowered."""
        flow = self.flow
        held, per_key = self.held_counts(self.jobs())
        cap = flow.limits.concurrency
        if cap is not None:
            assert flow.allowance is not None
            assert held <= flow.allowance, f"{held} held, concurrency {cap}"
            flow.allowance = max(cap, min(flow.allowance, held))
        pcap = flow.limits.partition_concurrency
        if pcap is not None:
            for key, n in per_key.items():
                allowed = flow.key_allowance.get(key, pcap)
                assert n <= allowed, f"{n} held of {key!r}, partition_concurrency {pcap}"
                flow.key_allowance[key] = max(pcap, min(allowed, n))
            for key in list(flow.key_allowance):
                if key not in per_key:
                    del flow.key_allowance[key]

    @invariant()
    def stats_agree(self) -> None:
        """The queue's stats, counted from its jobs and the limits (FLW-8)."""
        now = self.now
        jobs = self.jobs()
        held, per_key = self.held_counts(jobs)
        ready = [j for j in jobs.values() if j.state is PENDING and j.ready_at <= now]
        flow = self.flow
        if flow.queue_blocked(held, now):
            limited = len(ready)
        else:
            limited = sum(
                1
                for j in ready
                if j.partition is not None
                and flow.key_blocked(j.partition, per_key.get(j.partition, 0), now)
            )
        s = self.q.stats()
        want = {
            "ready": len(ready),
            "scheduled": sum(1 for j in jobs.values() if j.state is PENDING) - len(ready),
            "processing": sum(1 for j in jobs.values() if j.state is PROCESSING),
            "dead": sum(1 for j in jobs.values() if j.state is DEAD),
            "limited": limited,
            "partitions": len({j.partition for j in ready if j.partition is not None}),
            "backoff_until": flow.until if flow.until > now else None,
            "limits": flow.limits,
            "paused": flow.paused,
        }
        got = {name: getattr(s, name) for name in want}
        assert got == want, f"stats: want {want}, engine {got}"
        assert len(self.table.held_leases()) == held

    # -- the end: drain

    def teardown(self) -> None:
        """Liveness: with the queue resumed, claiming and acking whatever comes, and the
        clock moved to ``next_event_at()`` whenever nothing does, every job is handed
        out or dies (expired, or out of attempts), and nothing is left."""
        if not hasattr(self, "q"):
            return
        self.pause_or_resume(False)
        handed: set[str] = set()
        idle = 0
        for _ in range(DRAIN_STEPS):
            got = self.claim(1_000, False)
            for h in got:
                handed.add(h.id)
                assert h.ack() is True
            if got:
                idle = 0
                continue
            t = self.table.next_event_at()
            if t is None:
                break
            if t > self.now:
                self.clock.now = t
                idle = 0
            else:
                self.table.sweep_expired()
                idle += 1
                assert idle < 3, f"next_event_at {t} is due at {self.now}, and nothing moves"
        else:
            raise AssertionError("the drain did not end")
        left = self.jobs()
        assert all(job.state is DEAD for job in left.values()), {
            job_id: job.state for job_id, job in left.items() if job.state is not DEAD
        }
        s = self.q.stats()
        assert (s.ready, s.scheduled, s.processing, s.limited, s.partitions) == (0, 0, 0, 0, 0)
        assert self.q._flow.parts == {}, "keys with nothing left are still kept"


FlowMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFlowMachine = FlowMachine.TestCase
