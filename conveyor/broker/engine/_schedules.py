"""The table's schedules: where a ``JobTable`` keeps them, and what a due one does
(``docs/contract.md``, "Schedules", SCH-1 on).

The rules of time (which instants are ticks, which due ticks make a job) are
``_schedule.py``'s, shared with the PostgreSQL backend. This module is the engine's side:

- ``Schedules`` holds every schedule by id (``_Sched``, mutable, private; the outside
  world sees ``ScheduleInfo`` snapshots), the ids in order for paging, and the un-paused
  schedules that still have a tick in a heap keyed ``(next_at, id)``. The table's next
  event is that heap's top beside the queues' (``JobTable.next_event_at``), and a fire
  pops only the schedules due: O(log s) each, nothing for the others, however many.
- Firing a schedule enqueues one job per tick that ``fire`` returns, keyed
  ``tick_key(id, tick)``, and moves the schedule's ``next_at`` on, in the table's one
  journal: a store writes the jobs and the schedule's progress in one transaction, so a
  tick is either fired and recorded or neither (SCH-3).
- A change to a schedule is journaled whole (``SCHEDULE_FIELDS``), a delete as its id.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import replace
from itertools import islice
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

from . import _guards as guard
from ._errors import InvalidArgument
from ._heap import Heap
from ._schedule import (
    ScheduleInfo,
    ScheduleSpec,
    check_timing,
    fire,
    next_tick,
    next_when_set,
)
from ._schedule import tick_key as _tick_key
from ._types import RawJSON

if TYPE_CHECKING:
    from ._table import JobTable, Queue

__all__ = ["MAX_LIST_LIMIT", "SCHEDULE_FIELDS", "Schedules"]

#: The order of a schedule tuple in ``take_changes()`` and ``restore()``: the spec's
#: fields (its payload as encoded JSON bytes), then its progress and times.
SCHEDULE_FIELDS = (
    "id",
    "queue",
    "payload",
    "cron",
    "every_s",
    "tz",
    "start_at",
    "end_at",
    "missed",
    "max_catch_up",
    "paused",
    "priority",
    "max_attempts",
    "visibility_timeout_s",
    "expires_s",
    "backoff_base_s",
    "timeout_s",
    "partition",
    "next_at",
    "last_at",
    "last_job",
    "fired",
    "created_at",
    "updated_at",
)
_N_SPEC = SCHEDULE_FIELDS.index("next_at")

#: The most schedules one ``list_schedules`` page holds.
MAX_LIST_LIMIT = 1000


class _Sched:
    """One schedule and where it stands. ``payload`` is the spec's payload encoded once,
    at ``define``, as every job it makes carries it."""

    __slots__ = (
        "_entry",
        "created_at",
        "fired",
        "last_at",
        "last_job",
        "next_at",
        "payload",
        "spec",
        "updated_at",
    )

    def __init__(self, spec: ScheduleSpec, payload: bytes, now: float) -> None:
        self.spec = spec
        self.payload = payload
        self.next_at: float | None = None
        self.last_at: float | None = None
        self.last_job: str | None = None
        self.fired = 0
        self.created_at = now
        self.updated_at = now
        # Its entry in the heap of next ticks, while it is there (un-paused, a tick left).
        self._entry: tuple[Any, ...] | None = None

    def info(self) -> ScheduleInfo:
        return ScheduleInfo(
            self.spec,
            self.next_at,
            self.last_at,
            self.last_job,
            self.fired,
            self.created_at,
            self.updated_at,
        )

    def as_tuple(self) -> tuple[Any, ...]:
        s = self.spec
        return (
            s.id,
            s.queue,
            self.payload,
            s.cron,
            s.every_s,
            s.tz,
            s.start_at,
            s.end_at,
            s.missed,
            s.max_catch_up,
            s.paused,
            s.priority,
            s.max_attempts,
            s.visibility_timeout_s,
            s.expires_s,
            s.backoff_base_s,
            s.timeout_s,
            s.partition,
            self.next_at,
            self.last_at,
            self.last_job,
            self.fired,
            self.created_at,
            self.updated_at,
        )


class Schedules:
    """The schedules of one ``JobTable`` (the table's methods of the same names call
    these; time is the ``now`` they pass, read once per call)."""

    __slots__ = ("_by_id", "_changed", "_deleted", "_due", "_entries", "_ids", "_table")

    def __init__(self, table: JobTable) -> None:
        self._table = table
        self._by_id: dict[str, _Sched] = {}
        self._ids = SortedList()  # every id, for pages in id order
        self._due = Heap("_entry")  # (next_at, id, n, _Sched): un-paused, a tick left
        # Changed and deleted since the last take(), while the table keeps a journal.
        self._changed: dict[str, _Sched] = {}
        self._deleted: set[str] = set()
        # Entries pushed so far: a tie-break after (next_at, id), since a deleted
        # schedule's stale entry may equal a new one of the same id up to the row itself,
        # which does not compare.
        self._entries = 0

    def __len__(self) -> int:
        return len(self._by_id)

    # -- definitions ----------------------------------------------------------------------

    def define(self, spec: ScheduleSpec, now: float) -> ScheduleInfo:
        """Make or replace a schedule (SCH-1, SCH-4, SCH-5, SCH-6). Every check runs
        before anything changes: ``InvalidArgument`` naming the field."""
        if not isinstance(spec, ScheduleSpec):
            raise InvalidArgument("spec", "must be a ScheduleSpec")
        check_timing(spec)
        guard.queue_name(spec.queue)
        payload = self._check_job(spec)
        # What is kept, and shown, is the JSON value the jobs will carry (a tuple comes
        # back a list; a RawJSON as the value it encodes), alike on every backend.
        try:
            value = json.loads(payload)
        except ValueError:
            raise InvalidArgument("payload", "RawJSON does not hold one JSON value") from None
        spec = replace(spec, payload=value)
        old = self._by_id.get(spec.id)
        # The same definition again changes nothing, not even its times. (The payloads'
        # bytes too: 1 == True == 1.0 in Python, not in JSON.)
        if old is not None and old.spec == spec and old.payload == payload:
            return old.info()
        self._table.queue(spec.queue)  # made now, as an enqueue would (journaled with it)
        if old is None:
            next_at = next_when_set(None, None, spec, now)
            sched = _Sched(spec, payload, now)
            self._by_id[spec.id] = sched
            self._ids.add(spec.id)
        else:
            next_at = next_when_set(old.spec, old.next_at, spec, now)
            sched = old
            sched.spec = spec
            sched.payload = payload
            sched.updated_at = now
        self._place(sched, next_at)
        self._note(sched)
        return sched.info()

    def _check_job(self, spec: ScheduleSpec) -> bytes:
        """The job options checked as an enqueue on ``spec.queue`` would check them (the
        queue's own options as they are now, or a new queue's); the encoded payload."""
        table = self._table
        queue = table._queues.get(spec.queue)
        if queue is None:
            queue = table._detached_queue(spec.queue)
        payload: bytes = _resolve(queue, spec, spec.payload, None)[0]
        return payload

    def delete(self, schedule_id: str) -> bool:
        """Delete a schedule; the jobs it made stay (SCH-9). Whether it existed."""
        sched = self._by_id.pop(schedule_id, None) if isinstance(schedule_id, str) else None
        if sched is None:
            return False
        self._ids.remove(schedule_id)
        if sched._entry is not None:
            self._due.forget(sched)
        if self._table._journal is not None:
            self._changed.pop(schedule_id, None)
            self._deleted.add(schedule_id)
        return True

    def pause(self, schedule_id: str, paused: bool, now: float) -> ScheduleInfo | None:
        """Pause, or resume at the first tick after ``now`` (SCH-6)."""
        if not isinstance(paused, bool):
            raise InvalidArgument("paused", "must be true or false")
        sched = self._by_id.get(schedule_id) if isinstance(schedule_id, str) else None
        if sched is None:
            return None
        if sched.spec.paused == paused:
            return sched.info()
        sched.spec = replace(sched.spec, paused=paused)
        sched.updated_at = now
        self._place(sched, None if paused else next_tick(sched.spec, now))
        self._note(sched)
        return sched.info()

    # -- reading --------------------------------------------------------------------------

    def get(self, schedule_id: str) -> ScheduleInfo | None:
        sched = self._by_id.get(schedule_id) if isinstance(schedule_id, str) else None
        return None if sched is None else sched.info()

    def get_many(self, ids: list[str]) -> list[ScheduleInfo]:
        """The schedules ``ids`` names, in that order; unknown ids left out."""
        by_id = self._by_id
        return [by_id[i].info() for i in ids if isinstance(i, str) and i in by_id]

    def page(self, after: str | None, limit: int) -> list[ScheduleInfo]:
        """Up to ``limit`` schedules in id order, from the first id after ``after``."""
        if after is not None and not isinstance(after, str):
            raise InvalidArgument("after", "must be a schedule id or None")
        guard.positive_int("limit", limit, MAX_LIST_LIMIT)
        start = 0 if after is None else bisect_right(self._ids, after)
        by_id = self._by_id
        return [by_id[i].info() for i in islice(self._ids, start, start + limit)]

    def next_at(self) -> float | None:
        """The earliest tick of any un-paused schedule: O(1) amortised."""
        entry = self._due.top()
        return None if entry is None else float(entry[0])

    # -- firing ---------------------------------------------------------------------------

    def fire_due(self, now: float) -> set[str]:
        """Fire every schedule whose ``next_at`` is at or before ``now`` (SCH-4): the
        names of the queues that got a job. O(log s) per schedule due, plus its jobs."""
        due = self._due
        touched: set[str] = set()
        while True:
            entry = due.top()
            if entry is None or entry[0] > now:
                return touched
            due.pop()
            sched: _Sched = entry[-1]
            assert sched.next_at is not None
            ticks, next_at = fire(sched.spec, sched.next_at, now)
            for tick in ticks:
                if self._make(sched, _tick_key(sched.spec.id, tick), tick, now) is not None:
                    touched.add(sched.spec.queue)
            self._place(sched, next_at)
            self._note(sched)

    def run(self, schedule_id: str, now: float) -> str | None:
        """One job of the schedule now, outside its ticks (SCH-7): its id, or ``None``
        for no such schedule. Raises ``InvalidArgument`` if the queue's options now
        refuse the job (SCH-8)."""
        sched = self._by_id.get(schedule_id) if isinstance(schedule_id, str) else None
        if sched is None:
            return None
        key = f"schedule:{schedule_id}:run:{round(now * 1000)}"
        job_id = self._make(sched, key, now, now, strict=True)
        self._note(sched)
        return job_id

    def _make(
        self, sched: _Sched, key: str, at: float, now: float, *, strict: bool = False
    ) -> str | None:
        """Enqueue the schedule's job under ``key``, counting it for the tick at ``at``.
        A tick whose job the queue's options now refuse (its ``backoff_base_s`` over a
        lowered ``backoff_max_s``) makes none (SCH-8): ``None``, or with ``strict`` the
        ``InvalidArgument``."""
        spec = sched.spec
        table = self._table
        queue = table.queue(spec.queue)
        try:
            resolved = _resolve(queue, spec, RawJSON(sched.payload), key)
        except InvalidArgument:
            if strict:
                raise
            return None
        seq = table._seq
        job_id = queue._insert(resolved, now)
        if table._seq != seq:  # a new job (a key still taken names the job it made before)
            sched.fired += 1
        sched.last_at = at
        sched.last_job = job_id
        return job_id

    # -- the heap and the journal ---------------------------------------------------------

    def _place(self, sched: _Sched, next_at: float | None) -> None:
        """Set ``next_at`` and the schedule's place in the heap of next ticks."""
        if sched._entry is not None:
            if sched._entry[0] == next_at:
                sched.next_at = next_at
                return
            self._due.forget(sched)
        sched.next_at = next_at
        if next_at is not None:
            self._entries += 1
            self._due.push((next_at, sched.spec.id, self._entries, sched))

    def _note(self, sched: _Sched) -> None:
        if self._table._journal is not None:
            self._changed[sched.spec.id] = sched
            self._deleted.discard(sched.spec.id)

    @property
    def has_changes(self) -> bool:
        return bool(self._changed) or bool(self._deleted)

    def take(self) -> tuple[list[tuple[Any, ...]], list[str]]:
        """The schedules changed (``SCHEDULE_FIELDS`` tuples) and the ids deleted since
        the last call; a schedule made and deleted in between comes as a delete."""
        changed = [sched.as_tuple() for sched in self._changed.values()]
        deleted = sorted(self._deleted)
        self._changed = {}
        self._deleted = set()
        return changed, deleted

    def restore(self, rows: Any) -> None:
        """Load ``SCHEDULE_FIELDS`` tuples as a store kept them (heap built in one go)."""
        for values in rows:
            fields = dict(zip(SCHEDULE_FIELDS[:_N_SPEC], values[:_N_SPEC], strict=True))
            payload = bytes(fields["payload"])
            fields["payload"] = json.loads(payload)
            fields["paused"] = bool(fields["paused"])
            spec = ScheduleSpec(**fields)
            next_at, last_at, last_job, fired, created_at, updated_at = values[_N_SPEC:]
            sched = _Sched(spec, payload, created_at)
            sched.next_at = next_at
            sched.last_at = last_at
            sched.last_job = last_job
            sched.fired = int(fired)
            sched.updated_at = updated_at
            self._by_id[spec.id] = sched
            self._ids.add(spec.id)
            if next_at is not None and not spec.paused:
                self._entries += 1
                self._due.append((next_at, spec.id, self._entries, sched))
        self._due.rebuild()


def _resolve(queue: Queue, spec: ScheduleSpec, payload: Any, key: str | None) -> tuple[Any, ...]:
    """A job of ``spec`` on ``queue`` as an enqueue resolves it (the queue's options fill
    what the spec leaves out; ``InvalidArgument`` for what the queue refuses): never a
    delay, ready at once (SCH-4)."""
    return queue.resolve(
        payload,
        spec.priority,
        None,
        None,
        spec.expires_s,
        spec.visibility_timeout_s,
        spec.max_attempts,
        spec.backoff_base_s,
        key,
        spec.timeout_s,
        spec.partition,
    )
