"""Flow control's state for one queue: slots held, rate buckets, back-offs, and the turns
partition keys take (``docs/contract.md``, FLW-1 to FLW-10). Pure: time comes in as
``now``, and ``Queue`` (``_table.py``) calls in at each transition.

Theory of operation
-------------------
A ready job with a partition key waits in its key's ``Part``: a heap of its rows in
claim order (CLM-6). A part that may give a job now (it has one, and none of its limits
or back-offs holds it) has one entry in ``Flow.turns``, keyed ``(-priority of its first
row, turn)``: a claim takes the smallest, so priority comes first and, within one
priority, the key served longest ago (each claim gives the part a new, larger turn:
FLW-5). A part that a limit holds is in no heap while it waits for a slot (a release
puts it back), or in ``Flow.waking`` keyed by the time its bucket or back-off lets it go,
which ``wake(now)`` looks at. So a claim, a release or a wake costs O(log k) for k parts,
and nothing ever walks the parts (FLW-10).

Rows of no key stay in the queue's own ready structures; they take turns with the parts
as one more part would, through ``Flow.plain_turn``.

A part lives while it has rows, slots held, or a bucket or back-off not yet run out: a
part made afresh starts with a full bucket, so dropping one earlier would let a key go
faster than its rate.
"""

from __future__ import annotations

from itertools import count
from typing import Any

from ._heap import Heap
from ._types import Limits

__all__ = ["NEVER", "Bucket", "Flow", "Part"]

NEVER = float("-inf")
_NEVER = NEVER


class Bucket:
    """A token bucket as the generic cell rate algorithm: one number, ``tat`` (FLW-4)."""

    __slots__ = ("interval", "tat", "tolerance")

    def __init__(self, rate: int, per_s: float, burst: int | None) -> None:
        self.interval = per_s / rate
        self.tolerance = ((burst or 1) - 1) * self.interval
        self.tat = _NEVER  # full

    def allows(self, now: float) -> bool:
        """Whether a claim at ``now`` passes."""
        return now >= self.tat - self.tolerance

    def take(self, now: float) -> None:
        """Count a claim at ``now`` (call only when ``allows(now)``)."""
        tat = self.tat
        self.tat = (tat if tat > now else now) + self.interval

    def next_at(self) -> float:
        """The earliest time a claim passes."""
        return self.tat - self.tolerance

    def full_at(self) -> float:
        """When the bucket is full again (from then on it remembers nothing)."""
        return self.tat


class Part:
    """One partition key's ready rows, slots held, bucket and back-off."""

    __slots__ = (
        "_entry",
        "_wake_entry",
        "blocked",
        "bucket",
        "held",
        "n_ready",
        "name",
        "order",
        "ready",
        "turn",
        "until",
    )

    def __init__(self, name: str, order: int, turn: int, bucket: Bucket | None) -> None:
        self.name = name
        self.order = order  # a tie-break for the wake heap
        self.turn = turn
        # Rows as (-priority, ready_at, seq, row): pending ones, and lapsed leases
        # waiting for their reclaim (as in the queue's own ready heap).
        self.ready = Heap("_entry")
        self.n_ready = 0  # the pending rows of ``ready``
        self.held = 0  # slots its leases hold (FLW-2)
        self.bucket = bucket
        self.until = _NEVER  # back-off end (FLW-6)
        # Whether it has rows that a limit holds back (counted in Flow.n_limited).
        self.blocked = False
        self._entry: tuple[Any, ...] | None = None  # in Flow.turns
        self._wake_entry: tuple[Any, ...] | None = None  # in Flow.waking

    def __repr__(self) -> str:
        return f"<Part {self.name!r} ready={self.n_ready} held={self.held}>"


class Flow:
    """A queue's flow control. ``Queue`` owns one and keeps it told of every transition."""

    __slots__ = (
        "_counter",
        "bucket",
        "held",
        "limits",
        "n_busy",
        "n_limited",
        "parts",
        "plain_turn",
        "turns",
        "until",
        "waking",
    )

    def __init__(self) -> None:
        self.limits = Limits()
        self.bucket: Bucket | None = None  # the queue's own rate
        self.until = _NEVER  # the queue's back-off end
        self.held = 0  # slots the queue's leases hold
        self.parts: dict[str, Part] = {}
        self.turns = Heap("_entry")  # (-priority, turn, part)
        self.waking = Heap("_wake_entry")  # (time, order, part)
        self._counter = count(1)
        self.plain_turn = 0  # the turn of the rows of no key
        self.n_limited = 0  # pending rows of blocked parts
        self.n_busy = 0  # parts with pending rows

    # -- the queue as a whole -------------------------------------------------------------

    def set_limits(self, limits: Limits, now: float) -> None:
        """Take ``limits`` (checked) in place of the old ones; buckets start afresh
        (FLW-9). O(k log k): every part is filed again (an operator's call, not a hot
        path)."""
        self.limits = limits
        self.bucket = (
            None if limits.rate is None else Bucket(limits.rate, limits.per_s, limits.burst)
        )
        for part in list(self.parts.values()):
            part.bucket = self._part_bucket()
            self.refile(part, now)

    def _part_bucket(self) -> Bucket | None:
        limits = self.limits
        if limits.partition_rate is None:
            return None
        return Bucket(limits.partition_rate, limits.partition_per_s, limits.partition_burst)

    @property
    def gated(self) -> bool:
        """Whether the queue's own limits or a back-off may stop a claim."""
        return (
            self.limits.concurrency is not None or self.bucket is not None or self.until != _NEVER
        )

    def opens_at(self, now: float) -> float | None:
        """``None`` when the queue's own limits let a claim through at ``now``; else when
        they will (``inf``: when a slot frees)."""
        cap = self.limits.concurrency
        at = self.until
        bucket = self.bucket
        if bucket is not None:
            # Bucket.next_at and Bucket.take, written out here and in took: a claim
            # calls both once per job it hands out, and the calls showed in a drain.
            ready_at = bucket.tat - bucket.tolerance
            if ready_at > at:
                at = ready_at
        if cap is not None and self.held >= cap:
            return float("inf")
        return at if at > now else None

    def took(self, now: float) -> None:
        """A claim of the queue passed its own limits."""
        self.held += 1
        bucket = self.bucket
        if bucket is not None:
            tat = bucket.tat
            bucket.tat = (tat if tat > now else now) + bucket.interval

    # -- parts ----------------------------------------------------------------------------

    def part(self, name: str) -> Part:
        """The part of key ``name``, made when missing (it joins the turns last)."""
        part = self.parts.get(name)
        if part is None:
            turn = next(self._counter)
            part = self.parts[name] = Part(name, turn, turn, self._part_bucket())
        return part

    def next_turn(self) -> int:
        return next(self._counter)

    def count(self, part: Part, delta: int) -> None:
        """``part`` gained (``delta`` 1) or lost (-1) a pending row."""
        before = part.n_ready
        part.n_ready = after = before + delta
        if part.blocked:
            self.n_limited += delta
        if before == 0 and after > 0:
            self.n_busy += 1
        elif before > 0 and after == 0:
            self.n_busy -= 1

    def holds_at(self, part: Part, now: float) -> float | None:
        """``None`` when ``part``'s limits let a claim through at ``now``; else when they
        will (``inf``: when one of its slots frees)."""
        cap = self.limits.partition_concurrency
        if cap is not None and part.held >= cap:
            return float("inf")
        at = part.until
        bucket = part.bucket
        if bucket is not None:
            ready_at = bucket.next_at()
            if ready_at > at:
                at = ready_at
        return at if at > now else None

    def refile(self, part: Part, now: float) -> None:
        """Put ``part`` where its state says: in the turns, waiting to wake, waiting for a
        slot, or gone (see the module docstring)."""
        if part._entry is not None:
            self.turns.forget(part)
        if part._wake_entry is not None:
            self.waking.forget(part)
        top = part.ready.top()
        if top is None:
            self._set_blocked(part, False)
            self._retire(part, now)
            return
        at = self.holds_at(part, now)
        if at is None:
            self._set_blocked(part, False)
            self.turns.push((top[0], part.turn, part))
            return
        self._set_blocked(part, True)
        if at != float("inf"):
            self.waking.push((at, part.order, part))

    def _set_blocked(self, part: Part, blocked: bool) -> None:
        if part.blocked is not blocked:
            part.blocked = blocked
            self.n_limited += part.n_ready if blocked else -part.n_ready

    def _retire(self, part: Part, now: float) -> None:
        """Drop a part with no rows once nothing of it is left to remember."""
        if part.held:
            return
        end = part.until
        bucket = part.bucket
        if bucket is not None and bucket.full_at() > end:
            end = bucket.full_at()
        if end > now:
            self.waking.push((end, part.order, part))
        else:
            del self.parts[part.name]

    def added(self, part: Part, entry: tuple[Any, ...], now: float) -> None:
        """A row's ``entry`` joined ``part.ready``: file the part if it was waiting for
        work, or move its turn up if the row outranks its first."""
        current = part._entry
        if current is None:
            if not part.blocked:
                self.refile(part, now)
        elif entry[0] < current[0]:
            self.turns.forget(part)
            self.turns.push((entry[0], part.turn, part))

    def top(self) -> Part | None:
        """The part whose turn it is, its heap entry brought up to date, or ``None``."""
        turns = self.turns
        while (entry := turns.top()) is not None:
            part: Part = entry[-1]
            first = part.ready.top()
            if first is None:  # its rows were cancelled or expired meanwhile
                turns.pop()
                self._retire(part, _NEVER)
                continue
            if first[0] != entry[0]:  # its first row changed: re-key
                turns.pop()
                turns.push((first[0], part.turn, part))
                continue
            return part
        return None

    def released(self, part: Part, now: float) -> None:
        """One of ``part``'s slots freed."""
        part.held -= 1
        if part.blocked or (part._entry is None and part._wake_entry is None):
            self.refile(part, now)

    def back_off(self, part: Part | None, until: float, now: float) -> None:
        """Hold ``part`` (the queue when ``None``) until ``until``; never shortens one."""
        if part is None:
            if until > self.until:
                self.until = until
            return
        if until > part.until:
            part.until = until
            self.refile(part, now)

    def wake(self, now: float) -> None:
        """File again every part whose wait has run out by ``now``."""
        waking = self.waking
        while (entry := waking.top()) is not None and entry[0] <= now:
            waking.pop()
            self.refile(entry[-1], now)
        if self.until != _NEVER and self.until <= now:
            self.until = _NEVER

    def next_at(self) -> float | None:
        """The earliest time a part wakes, ``None`` when none waits on time."""
        entry = self.waking.top()
        return None if entry is None else float(entry[0])
