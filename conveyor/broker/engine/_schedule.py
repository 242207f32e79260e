"""Schedules: what a periodic job is, and when it fires (``docs/contract.md``, SCH-1 on).

The pure rules of a schedule's time, shared by every backend: the engine's table and the
PostgreSQL backend both ask these functions and decide nothing about time themselves.

- A schedule's *ticks* are the instants its timing names: a cron expression's matches in
  its time zone (``cronsim``, which follows Debian's cron through daylight-saving changes:
  a time that a spring-forward skips fires once just after the jump; in an hour that a
  fall-back repeats a fixed time fires once, a wildcard minute or hour in both), or
  every ``every_s`` seconds counted from ``start_at`` (from the Unix epoch when there is
  none, so that "every 300 s" falls on whole five minutes). No tick is before
  ``start_at`` or after ``end_at``.
- ``next_tick(spec, after)`` is the first tick strictly after ``after``.
- When a schedule is looked at, at ``now``, every tick from its ``next_at`` up to ``now``
  is *due*. The latest due tick is *on time* when ``now`` is less than ``MISSED_GRACE_S``
  past it; every other due tick was missed (the broker was down, or busy). ``fire``
  says which due ticks make a job, by the schedule's ``missed`` policy:

  * ``skip``: only an on-time tick makes a job; missed ticks make none.
  * ``once``: the due ticks make one job between them, for the latest of them.
  * ``each``: each due tick makes a job, oldest first, the latest ``max_catch_up`` of
    them when more are due.

  and the schedule's next tick is the first after ``now``.

No I/O and no clock: time is always an argument (``now``, ``after``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ._errors import InvalidArgument

__all__ = [
    "MAX_CATCH_UP",
    "MAX_SCHEDULE_ID_LEN",
    "MISSED_GRACE_S",
    "MISSED_POLICIES",
    "ScheduleInfo",
    "ScheduleSpec",
    "check_timing",
    "fire",
    "next_tick",
    "next_when_set",
    "same_timing",
    "tick_key",
]

#: A due tick this many seconds late or less is on time; an older one was missed.
MISSED_GRACE_S = 60.0
MISSED_POLICIES = ("skip", "once", "each")
#: The most ticks a ``each`` schedule catches up on at once.
MAX_CATCH_UP = 10_000
MAX_SCHEDULE_ID_LEN = 128
#: The shortest interval: a tick per millisecond is already more than any broker serves.
MIN_EVERY_S = 0.001

# The usual names, as the five fields they stand for (@reboot has no meaning here).
_NAMED = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule as its owner defines it (SCH-1): every tick of its timing enqueues one
    job of ``payload`` on ``queue`` with these job options (``NewJob``'s meanings).

    Timing: exactly one of ``cron`` (five fields, or ``@hourly``-style names, read in
    ``tz``, an IANA zone) and ``every_s``; ticks from ``start_at`` to ``end_at`` (Unix
    seconds, either ``None``: open). ``missed`` is the policy for ticks missed while the
    broker was down (``skip``, ``once``, ``each`` with at most ``max_catch_up`` of them).
    A ``paused`` schedule makes no job until resumed; the ticks meanwhile are skipped.
    """

    id: str
    queue: str
    payload: Any = None
    cron: str | None = None
    every_s: float | None = None
    tz: str = "UTC"
    start_at: float | None = None
    end_at: float | None = None
    missed: str = "once"
    max_catch_up: int = 100
    paused: bool = False
    priority: int = 0
    max_attempts: int | None = None
    visibility_timeout_s: float | None = None
    expires_s: float | None = None
    backoff_base_s: float | None = None
    timeout_s: float | None = None
    partition: str | None = None


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule and where it stands (SCH-2): its definition; ``next_at``, the tick it
    fires at next (``None`` while paused or once its ticks have ended); ``last_at`` and
    ``last_job``, when it last made a job (the tick's time, or a run-now's) and that
    job's id; ``fired``, the jobs it made in all; when it was made and last changed."""

    spec: ScheduleSpec
    next_at: float | None
    last_at: float | None
    last_job: str | None
    fired: int
    created_at: float
    updated_at: float


@lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _cron_text(cron: str) -> str:
    return _NAMED.get(cron.strip().lower(), cron)


def check_timing(spec: ScheduleSpec) -> None:
    """Raise ``InvalidArgument`` naming the field unless ``spec``'s id and timing are
    good: an id of 1 to ``MAX_SCHEDULE_ID_LEN`` characters of ``[A-Za-z0-9._:-]``;
    exactly one of ``cron`` (that cronsim parses) and ``every_s`` (finite, at least
    ``MIN_EVERY_S``); a known zone; finite bounds with ``end_at`` after ``start_at``;
    a known ``missed`` policy; ``max_catch_up`` from 1 to ``MAX_CATCH_UP``. The job
    options are the table's to check, as an enqueue's."""
    from ._guards import queue_name

    try:
        queue_name(spec.id)
    except InvalidArgument as exc:
        raise InvalidArgument("id", exc.problem) from None
    if spec.cron is None and spec.every_s is None:
        raise InvalidArgument("cron", "is required when every_s is not given")
    if spec.cron is not None and spec.every_s is not None:
        raise InvalidArgument("every_s", "cannot be given with cron: choose one")
    if not isinstance(spec.tz, str) or not spec.tz:
        raise InvalidArgument("tz", "must be an IANA time zone name, such as 'Europe/Paris'")
    try:
        _zone(spec.tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidArgument("tz", f"{spec.tz[:64]!r} is not a known time zone") from None
    if spec.cron is not None:
        if not isinstance(spec.cron, str) or len(spec.cron) > 256:
            raise InvalidArgument("cron", "must be a cron expression of at most 256 characters")
        try:
            CronSim(_cron_text(spec.cron), datetime(2000, 1, 1, tzinfo=UTC))
        except CronSimError as exc:
            raise InvalidArgument(
                "cron", f"{spec.cron[:64]!r} is not a cron expression: {exc}"
            ) from None
    else:
        every = spec.every_s
        if (
            isinstance(every, bool)
            or not isinstance(every, int | float)
            or not math.isfinite(every)
        ):
            raise InvalidArgument("every_s", "must be a finite number of seconds")
        if every < MIN_EVERY_S:
            raise InvalidArgument("every_s", f"must be at least {MIN_EVERY_S}")
    for field in ("start_at", "end_at"):
        value = getattr(spec, field)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise InvalidArgument(field, "must be a finite time in Unix seconds")
    if spec.start_at is not None and spec.end_at is not None and spec.end_at <= spec.start_at:
        raise InvalidArgument("end_at", "must be after start_at")
    if spec.missed not in MISSED_POLICIES:
        raise InvalidArgument("missed", "must be one of 'skip', 'once', 'each'")
    catch_up = spec.max_catch_up
    if (
        isinstance(catch_up, bool)
        or not isinstance(catch_up, int)
        or not 1 <= catch_up <= MAX_CATCH_UP
    ):
        raise InvalidArgument("max_catch_up", f"must be an integer from 1 to {MAX_CATCH_UP}")
    if not isinstance(spec.paused, bool):
        raise InvalidArgument("paused", "must be true or false")


def same_timing(a: ScheduleSpec, b: ScheduleSpec) -> bool:
    """Whether ``a`` and ``b`` name the same ticks (a change that keeps them keeps the
    schedule's progress, SCH-5)."""
    return (a.cron, a.every_s, a.tz, a.start_at, a.end_at) == (
        b.cron,
        b.every_s,
        b.tz,
        b.start_at,
        b.end_at,
    )


def next_when_set(
    old: ScheduleSpec | None, old_next: float | None, new: ScheduleSpec, now: float
) -> float | None:
    """The ``next_at`` of a schedule defined as ``new`` at ``now``, where ``old`` (with
    its ``old_next``) was its definition before (``None``: a new schedule). SCH-5 and
    SCH-6: a paused schedule has none; one that keeps a running definition's timing keeps
    its next tick; any other fires next at its first tick after ``now``."""
    if new.paused:
        return None
    if old is not None and not old.paused and same_timing(old, new):
        return old_next
    return next_tick(new, now)


def _cron_after(spec: ScheduleSpec, after: float) -> float | None:
    """The first cron match strictly after ``after``. cronsim reads its start as a local
    time's first occurrence (it ignores ``fold``): in the hour a fall-back repeats, a
    start in the second one is read an hour early, and its first matches may be at or
    before ``after``. Those are skipped (at most an hour's worth, once a year)."""
    assert spec.cron is not None
    start = datetime.fromtimestamp(after, _zone(spec.tz))
    # (The walk ends with StopIteration at cronsim's horizon, 50 years on: no match.)
    for match in CronSim(_cron_text(spec.cron), start):
        tick = match.timestamp()
        if tick > after:
            return tick
    return None


def _cron_at_or_before(spec: ScheduleSpec, at: float) -> float | None:
    """The latest cron match at or before ``at`` (cronsim's reverse walk is strict, and
    works in whole seconds: start it just past ``at``'s second). The start is made from
    the Unix time, not by adding a second to a local time: that sum drops ``fold``. And
    since cronsim reads a start in the second occurrence of a repeated hour as the first
    (an hour early, which would skip the matches in between), such a start is moved on
    by the offset's change, and the matches after ``at`` are skipped."""
    assert spec.cron is not None
    zone = _zone(spec.tz)
    first = math.floor(at) + 1
    start = datetime.fromtimestamp(first, zone)
    if start.fold:
        early, late = start.replace(fold=0).utcoffset(), start.utcoffset()
        if early is not None and late is not None and early > late:
            start = datetime.fromtimestamp(first + (early - late).total_seconds(), zone)
    for match in CronSim(_cron_text(spec.cron), start, reverse=True):
        tick = match.timestamp()
        if tick <= at:
            return tick
    return None


def next_tick(spec: ScheduleSpec, after: float) -> float | None:
    """The first tick of ``spec`` strictly after ``after`` (and not before its
    ``start_at``); ``None`` when no tick is left before its ``end_at``."""
    if spec.start_at is not None and after < spec.start_at:
        # The first tick at or after start_at: look from just before it.
        after = math.nextafter(spec.start_at, -math.inf)
    if spec.cron is not None:
        tick = _cron_after(spec, after)
    else:
        assert spec.every_s is not None
        anchor = spec.start_at if spec.start_at is not None else 0.0
        k = math.floor((after - anchor) / spec.every_s) + 1
        tick = anchor + k * spec.every_s
        while tick <= after:  # (float rounding)
            k += 1
            tick = anchor + k * spec.every_s
    if tick is None or (spec.end_at is not None and tick > spec.end_at):
        return None
    return float(tick)


def _ticks_back(spec: ScheduleSpec, first: float, now: float, n: int) -> list[float]:
    """The latest ``n`` ticks in ``[first, now]``, oldest first."""
    found: list[float] = []
    if spec.every_s is not None:
        anchor = spec.start_at if spec.start_at is not None else 0.0
        # One step past the quotient: it may round down across a tick that ``next_tick``
        # computed as ``anchor + k * every_s`` exactly (a tick looked at on the dot).
        k = math.floor((now - anchor) / spec.every_s) + 1
        while len(found) < n:
            tick = anchor + k * spec.every_s
            if tick < first:
                break
            if tick <= now:
                found.append(float(tick))
            k -= 1
    else:
        at = now
        while len(found) < n:
            match = _cron_at_or_before(spec, at)
            if match is None or match < first:
                break
            found.append(match)
            at = math.nextafter(match, -math.inf)
    found.reverse()
    return found


def fire(spec: ScheduleSpec, next_at: float, now: float) -> tuple[list[float], float | None]:
    """The ticks that make a job when ``spec``, whose next tick is ``next_at``, is looked
    at ``now`` (see the module docstring for the policies), oldest first; and its next
    tick after that. Nothing is due while ``now < next_at``: ``([], next_at)``.

    Cost: O(ticks made), never O(ticks missed) (a schedule of every second down for a
    month is not walked second by second)."""
    if now < next_at:
        return [], next_at
    keep = spec.max_catch_up if spec.missed == "each" else 1
    last = now if spec.end_at is None else min(now, spec.end_at)
    ticks = _ticks_back(spec, next_at, last, keep)
    if ticks and spec.missed == "skip" and now - ticks[-1] >= MISSED_GRACE_S:
        ticks = []
    return ticks, next_tick(spec, now)


def tick_key(schedule_id: str, tick: float) -> str:
    """The idempotency key of the job a tick makes (SCH-3): the same for the same
    schedule and tick wherever it is computed, so that no tick is enqueued twice."""
    return f"schedule:{schedule_id}:{round(tick * 1000)}"
