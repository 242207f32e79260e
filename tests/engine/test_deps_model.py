"""Model-based test of dependencies (docs/contract.md, DEP-1 to DEP-8, DEP-13) in the
engine.

A hypothesis state machine drives the real ``JobTable`` (manual clock) and a naive
model side by side: enqueues and groups naming live, dead, gone and unknown jobs (and
members of their group, cycles included), claims, acks with results, fails, cancels,
redrives and expiries. After every step both must agree on every job's state, its
dependencies, how many it waits for and the results it can read, and on every queue's
waiting count. The model walks everything on every step; the engine must not need to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from conveyor.broker.engine import DependencyCycle, InvalidArgument, JobState, JobTable

pytestmark = pytest.mark.timeout(600)

QUEUES = ("a", "b")
WAITING, PENDING, PROCESSING, DEAD = "waiting", "pending", "processing", "dead"
UNKNOWN = "t-nope"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class MJob:
    queue: str
    state: str
    after: tuple[str, ...]
    expires_at: float | None
    met: dict[str, bytes | None] = field(default_factory=dict)
    last_error: str | None = None


class Model:
    """Jobs by id; a job acked or cancelled is gone (no queue keeps finished jobs)."""

    def __init__(self) -> None:
        self.jobs: dict[str, MJob] = {}

    def link(self, job_id: str) -> None:
        """A new or redriven job: dead at once if a dependency not acked is dead or gone
        (the first in order), else waiting or pending."""
        job = self.jobs[job_id]
        for dep in job.after:
            if dep in job.met:
                continue
            found = self.jobs.get(dep)
            if found is None:
                self.kill(job_id, f"dependency {dep} is gone")
                return
            if found.state == DEAD:
                self.kill(job_id, f"dependency {dep} died: {found.last_error}")
                return
        job.state = WAITING if self.unmet(job) else PENDING

    def unmet(self, job: MJob) -> int:
        return sum(1 for dep in job.after if dep not in job.met)

    def kill(self, job_id: str, error: str) -> None:
        job = self.jobs[job_id]
        job.state, job.last_error = DEAD, error
        for other_id, other in self.jobs.items():
            if other.state == WAITING and job_id in other.after and job_id not in other.met:
                self.kill(other_id, f"dependency {job_id} died: {error}")

    def ack(self, job_id: str, result: bytes) -> None:
        del self.jobs[job_id]
        for other in self.jobs.values():
            if job_id in other.after and job_id not in other.met:
                other.met[job_id] = result
                if other.state == WAITING and not self.unmet(other):
                    other.state = PENDING

    def cancel(self, job_id: str) -> None:
        job = self.jobs.pop(job_id)
        if job.state == DEAD:
            return
        for other_id, other in list(self.jobs.items()):
            if other.state == WAITING and job_id in other.after and job_id not in other.met:
                self.kill(other_id, f"dependency {job_id} was cancelled")


ids_or_unknown = st.lists(st.integers(0, 40), max_size=4)


class DepsVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.table = JobTable(clock=self.clock, id_prefix="t-")
        self.model = Model()
        self.held: dict[str, Any] = {}  # job id -> its claim handle, while processing
        self.ever: list[str] = []  # every id ever made, gone ones included

    def _pick(self, picks: list[int]) -> list[str]:
        """Ids chosen among those ever made (live, dead or gone), or an unknown one."""
        out = []
        for n in picks:
            out.append(self.ever[n % len(self.ever)] if self.ever and n < 36 else UNKNOWN)
        return list(dict.fromkeys(out))

    @rule(queue=st.sampled_from(QUEUES), picks=ids_or_unknown, expires=st.booleans())
    def enqueue(self, queue: str, picks: list[int], expires: bool) -> None:
        after = self._pick(picks)
        expires_s = 5.0 if expires else None
        if any(dep not in self.model.jobs for dep in after):
            with pytest.raises(InvalidArgument) as caught:
                self.table.queue(queue).enqueue(None, after=after, expires_s=expires_s)
            assert caught.value.field.startswith("after[")
            return
        job_id = self.table.queue(queue).enqueue(None, after=after, expires_s=expires_s)
        expires_at = None if expires_s is None else self.clock.now + expires_s
        self.model.jobs[job_id] = MJob(queue, PENDING, tuple(after), expires_at)
        self.ever.append(job_id)
        self.model.link(job_id)

    @rule(
        members=st.lists(
            st.tuples(st.sampled_from(QUEUES), ids_or_unknown, st.lists(st.integers(0, 3))),
            min_size=1,
            max_size=4,
        )
    )
    def group(self, members: list[tuple[str, list[int], list[int]]]) -> None:
        n = len(members)
        specs = []
        for queue, picks, refs in members:
            after: list[str | int] = [*self._pick(picks), *dict.fromkeys(r % n for r in refs)]
            specs.append((queue, None, 0, *([None] * 9), after))
        unknown = any(
            isinstance(dep, str) and dep not in self.model.jobs for s in specs for dep in s[-1]
        )
        if unknown:
            with pytest.raises(InvalidArgument):
                self.table.enqueue_group(specs)
            return
        edges = {i: [d for d in s[-1] if isinstance(d, int)] for i, s in enumerate(specs)}
        if _has_cycle(edges):
            with pytest.raises(DependencyCycle):
                self.table.enqueue_group(specs)
            return
        ids = self.table.enqueue_group(specs)
        done: set[int] = set()
        while len(done) < n:  # each after the members it names
            for i, spec in enumerate(specs):
                if i in done or any(d not in done for d in edges[i]):
                    continue
                after = tuple(ids[d] if isinstance(d, int) else d for d in spec[-1])
                self.model.jobs[ids[i]] = MJob(spec[0], PENDING, after, None)
                self.ever.append(ids[i])
                self.model.link(ids[i])
                done.add(i)

    @rule(queue=st.sampled_from(QUEUES))
    def claim(self, queue: str) -> None:
        handles = self.table.queue(queue).claim_batch("w", 100)
        expected = set()
        now = self.clock.now
        for job_id, job in list(self.model.jobs.items()):
            if job.queue != queue or job.state != PENDING:
                continue
            if job.expires_at is not None and job.expires_at <= now:
                self.model.kill(job_id, "expired")  # a redriven expired job (CLM-4)
            else:
                expected.add(job_id)
        assert {h.id for h in handles} == expected
        for h in handles:
            self.model.jobs[h.id].state = PROCESSING
            self.held[h.id] = h

    @rule(pick=st.integers(0, 100), fail=st.booleans())
    def finish(self, pick: int, fail: bool) -> None:
        if not self.held:
            return
        job_id = sorted(self.held)[pick % len(self.held)]
        handle = self.held.pop(job_id)
        if fail:
            assert handle.fail("boom")
            self.model.kill(job_id, "boom")
        else:
            result = f'"{job_id}"'.encode()
            assert handle.ack(result)
            self.model.ack(job_id, result)

    @rule(queue=st.sampled_from(QUEUES), fail=st.integers(0, 3))
    def drain(self, queue: str, fail: int) -> None:
        """Claim what the queue holds and ack all of it, but one failed (``fail`` 0)."""
        self.claim(queue)
        mine = sorted(i for i in self.held if self.model.jobs[i].queue == queue)
        for n, job_id in enumerate(mine):
            self.finish(sorted(self.held).index(job_id), fail == 0 and n == 0)

    @rule(pick=st.integers(0, 100))
    def cancel(self, pick: int) -> None:
        if not self.ever:
            return
        job_id = self.ever[pick % len(self.ever)]
        assert self.table.cancel(job_id) == (job_id in self.model.jobs)
        if job_id in self.model.jobs:
            self.model.cancel(job_id)
            self.held.pop(job_id, None)

    @rule(pick=st.integers(0, 100))
    def redrive(self, pick: int) -> None:
        if not self.ever:
            return
        job_id = self.ever[pick % len(self.ever)]
        job = self.model.jobs.get(job_id)
        dead = job is not None and job.state == DEAD
        assert self.table.redrive(job_id) == dead
        if dead:
            self.model.link(job_id)

    @rule()
    def expire(self) -> None:
        """Time passes past every expiry (no lease lapses: those last 300 s); the sweep
        kills in expiry order, then enqueue order."""
        self.clock.now += 5.0
        self.table.sweep_expired()
        for job_id in list(self.model.jobs):
            job = self.model.jobs.get(job_id)
            if job is None or job.state == DEAD:
                continue
            if job.expires_at is not None and job.expires_at <= self.clock.now:
                self.model.kill(job_id, "expired")
        for job_id in list(self.held):
            if self.model.jobs[job_id].state == DEAD:
                del self.held[job_id]

    @invariant()
    def every_job_agrees(self) -> None:
        for job_id in self.ever:
            got = self.table.get_job(job_id)
            want = self.model.jobs.get(job_id)
            if want is None:
                assert got is None, job_id
                continue
            assert got is not None, job_id
            assert got.state is JobState(want.state), (job_id, got, want)
            assert got.after == want.after
            assert got.waiting_for == (self.model.unmet(want) if want.state == WAITING else 0)
            results = self.table.dependency_results(job_id)
            assert results == [(d, want.met[d]) for d in want.after if d in want.met]
            if want.state == DEAD:
                # Which dying dependency a job names depends on the walk's order when
                # two die at once; the one it names must be one of its own.
                assert got.last_error is not None
                if got.last_error.startswith("dependency "):
                    assert got.last_error.split()[1] in want.after, got.last_error
                elif got.last_error != "expired":
                    assert got.last_error == want.last_error

    @invariant()
    def waiting_counts_agree(self) -> None:
        for queue in QUEUES:
            want = sum(
                1 for j in self.model.jobs.values() if j.queue == queue and j.state == WAITING
            )
            assert self.table.queue(queue).stats().waiting == want

    @invariant()
    def nothing_waits_on_a_dead_or_gone_job(self) -> None:
        for job in self.model.jobs.values():
            if job.state == WAITING:
                for dep in job.after:
                    if dep not in job.met:
                        assert dep in self.model.jobs and self.model.jobs[dep].state != DEAD


def _has_cycle(edges: dict[int, list[int]]) -> bool:
    state: dict[int, int] = {}

    def visit(i: int) -> bool:
        if state.get(i) == 1:
            return True
        if state.get(i) == 2:
            return False
        state[i] = 1
        if any(visit(j) for j in edges[i]):
            return True
        state[i] = 2
        return False

    return any(visit(i) for i in edges)


DepsVsModel.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDepsVsModel = DepsVsModel.TestCase
