"""Group commit, decided: when to commit, and which held frames each commit releases.

The commit gate's rules as a state machine with no I/O, no clock and no event loop. Its
driver (``broker/commit.py``) tells it what happened (a frame held, the loop turn ended,
a commit written, an fsync done, a failure) and carries out what it answers: a list of
actions (``Release``, ``SendEarly``, ``Commit``, ``SlowCommit``, ``AwaitFsync``,
``Schedule``). Frames are opaque here; so are the keys of the flushes that put early
frames on the wire. Fsyncs are numbered 1, 2, ... in the order of their commits.

The rules:

1. A held frame leaves once every change made before it is durable; an early frame
   once every change made before it is written (``hold``, ``hold_early``).
2. The first frame or change after a flush asks for one at the end of the loop turn
   (``Schedule``); the others ride it. None is asked for while a slow commit is due.
   One is while a flush waits for an fsync: it lets the work due that turn (a dispatch
   pass) run first, and so its pushes are written behind the fsync in the same turn.
3. A flush with no changes releases its early frames at once, and its held frames at
   once too unless an fsync is in flight: then when that fsync ends (they may describe
   what its commit makes durable).
4. A flush with changes commits them (``Commit``). Its early frames go when the commit
   is written (``SendEarly``, before the fsync, each distinct flush once), or else right
   after it; its held frames once it and every commit before it are durable: at once,
   or when its fsync ends (``AwaitFsync``).
5. While an fsync is in flight, a flush without early frames waits for it, and then one
   commit takes all that gathered meanwhile; a flush with early frames commits at once,
   written behind the fsync in flight.
6. Fsyncs end in the order of their commits, and frames are released in that order; an
   fsync that ends makes every commit before it durable too.
7. A commit the store cannot make at once (a checkpoint due) goes by the slow path
   (``SlowCommit``) once the fsync in flight has ended; no flush is made until it is done,
   so at most one is in flight.
8. A failure (a commit's or an fsync's) is final: nothing more is committed or released,
   and the driver stops the broker.
9. Drain: wait while a commit or an fsync is in flight, flush while anything is held or
   changed, then done.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

__all__ = [
    "Action",
    "AwaitFsync",
    "Commit",
    "Drain",
    "GroupCommit",
    "Release",
    "Schedule",
    "SendEarly",
    "SlowCommit",
]

F = TypeVar("F")  # a frame
K = TypeVar("K", bound=Hashable)  # the flush that puts early frames on the wire


@dataclass(slots=True)
class Release(Generic[F]):
    """Deliver these frames now, in this order."""

    frames: list[F]


@dataclass(slots=True)
class SendEarly(Generic[F, K]):
    """Deliver these early frames now and then call each flush once: the commit is
    written and its fsync is to follow. A frame that fails must not stop the others."""

    frames: list[F]
    flushes: list[K]


@dataclass(slots=True)
class Commit:
    """Take the table's changes and write them now (``Store.commit_now``); then report
    ``committed`` (written), ``checkpoint_due`` (nothing written) or ``fail``."""


@dataclass(slots=True)
class SlowCommit:
    """Write the changes taken for the last ``Commit`` by the slow path (``Store.commit``,
    in a task); then report ``slow_committed`` or ``fail``."""


@dataclass(slots=True)
class AwaitFsync:
    """The commit just written is durable when its fsync, number ``n``, ends: report
    ``synced(n)`` then, or ``fail`` if it fails."""

    n: int


@dataclass(slots=True)
class Schedule:
    """Call ``flush`` at the end of this loop turn."""


Action: TypeAlias = Release[F] | SendEarly[F, K] | Commit | SlowCommit | AwaitFsync | Schedule

COMMIT = Commit()
SLOW_COMMIT = SlowCommit()
SCHEDULE = Schedule()


class Drain(enum.Enum):
    """What ``drain`` asks of the driver."""

    DONE = "done"  # nothing is left (or the store failed)
    FLUSH = "flush"  # call flush now
    WAIT = "wait"  # wait for the slow commit, or else the last fsync, to end


class GroupCommit(Generic[F, K]):
    """The commit gate's decisions (see the module docstring for the rules).

    Every event method returns the actions to carry out, in order; ``hold``,
    ``hold_early`` and ``changed`` (one call per frame) return only whether to
    ``Schedule`` a flush."""

    def __init__(self) -> None:
        # Gathered for the next flush.
        self._held: list[F] = []
        self._early: list[F] = []
        self._flushes: dict[K, None] = {}  # distinct, in order
        self._scheduled = False
        # The commit being made: its early frames until written, their flushes, its held.
        self._writing_early: list[F] = []
        self._writing_flushes: list[K] = []
        self._writing_held: list[F] = []
        # The fsyncs in flight, oldest first, with the held frames each releases.
        self._fsyncs: deque[tuple[int, list[F]]] = deque()
        self._last_fsync = 0
        self._flush_after: int | None = None  # a flush waits for this fsync (rule 5)
        self._slow = False  # a slow commit is due or in flight (rule 7)
        self._slow_after: int | None = None  # ... and waits for this fsync first
        self.failed = False
        self.commits = 0  # commits made

    # -- frames and changes: one call each, so no action list -------------------------

    def hold(self, frame: F) -> bool:
        """``frame`` waits until every change so far is durable. Returns whether to
        schedule a flush."""
        self._held.append(frame)
        if self._scheduled or self._slow or self.failed:
            return False
        self._scheduled = True
        return True

    def hold_early(self, frame: F, flush: K) -> bool:
        """``frame`` waits until every change so far is written; ``flush`` puts it on the
        wire before an fsync that follows. Returns whether to schedule a flush."""
        self._early.append(frame)
        self._flushes[flush] = None
        if self._scheduled or self._slow or self.failed:
            return False
        self._scheduled = True
        return True

    def changed(self) -> bool:
        """The table has changes no frame waits for. Returns whether to schedule a flush."""
        if self._scheduled or self._slow or self.failed:
            return False
        self._scheduled = True
        return True

    # -- the loop turn's end ----------------------------------------------------------

    @property
    def may_flush(self) -> bool:
        """Whether a flush now could commit (else it does nothing): the driver lets the
        work due this turn run first only then."""
        return not self._slow and not self.failed

    def flush(self, has_changes: bool) -> list[Action[F, K]]:
        """The loop turn ended (a scheduled flush, or ``drain``'s): the table has
        changes or not."""
        self._scheduled = False
        if self._slow or self.failed:
            return []
        if self._fsyncs and not self._early:
            if has_changes or self._held:  # rule 5: gather behind the fsync in flight
                self._flush_after = self._fsyncs[-1][0]
            return []
        self._flush_after = None
        held, self._held = self._held, []
        early, self._early = self._early, []
        flushes, self._flushes = self._flushes, {}
        if not has_changes:  # rule 3
            if self._fsyncs:
                self._fsyncs[-1][1].extend(held)
                return [Release(early)] if early else []
            frames = early + held
            return [Release(frames)] if frames else []
        self._writing_early = early
        self._writing_flushes = list(flushes)
        self._writing_held = held
        return [COMMIT]

    # -- the commit's course ----------------------------------------------------------

    def written(self) -> list[Action[F, K]]:
        """The store wrote the commit (or put its claims in the claim log) and an fsync
        is to follow: its early frames go now."""
        early, self._writing_early = self._writing_early, []
        flushes, self._writing_flushes = self._writing_flushes, []
        return [SendEarly(early, flushes)] if early else []

    def committed(self, fsync: bool) -> list[Action[F, K]]:
        """The store wrote the commit: durable at once, or when its ``fsync`` ends."""
        self.commits += 1
        early, self._writing_early = self._writing_early, []
        held, self._writing_held = self._writing_held, []
        self._writing_flushes = []
        if fsync:
            self._last_fsync += 1
            self._fsyncs.append((self._last_fsync, held))
            wait = AwaitFsync(self._last_fsync)
            return [Release(early), wait] if early else [wait]
        if self._fsyncs:  # durable, but the commits before it are not yet
            self._fsyncs[-1][1].extend(held)
            held = []
        frames = early + held
        return [Release(frames)] if frames else []

    def checkpoint_due(self) -> list[Action[F, K]]:
        """The store wrote nothing (a checkpoint is due): the slow path, after the fsync
        in flight (rule 7)."""
        self._slow = True
        if self._fsyncs:
            self._slow_after = self._fsyncs[-1][0]
            return []
        return [SLOW_COMMIT]

    def slow_committed(self, has_changes: bool) -> list[Action[F, K]]:
        """The slow commit is durable; the table has changes since, or not."""
        self._slow = False
        self._flush_after = None
        actions = self.committed(fsync=False)
        if (self._held or self._early or has_changes) and not self._scheduled:
            self._scheduled = True
            actions.append(SCHEDULE)
        return actions

    def synced(self, n: int) -> list[Action[F, K]]:
        """Fsync ``n`` ended: it and every commit before it are durable."""
        if self.failed:
            return []
        frames: list[F] = []
        while self._fsyncs and self._fsyncs[0][0] <= n:
            frames += self._fsyncs.popleft()[1]
        actions: list[Action[F, K]] = [Release(frames)] if frames else []
        if self._slow_after is not None and self._slow_after <= n:
            self._slow_after = None
            actions.append(SLOW_COMMIT)
        elif self._flush_after is not None and self._flush_after <= n:
            self._flush_after = None
            if not self._scheduled and not self._slow:
                self._scheduled = True
                actions.append(SCHEDULE)
        return actions

    def fail(self) -> bool:
        """A commit or an fsync failed (rule 8). Returns True the first time: the driver
        stops the broker then."""
        if self.failed:
            return False
        self.failed = True
        # Held back for good: nothing more can be promised.
        self._held, self._early, self._flushes = [], [], {}
        self._writing_early, self._writing_flushes, self._writing_held = [], [], []
        self._fsyncs.clear()
        self._flush_after = self._slow_after = None
        return True

    def drain(self, has_changes: bool) -> Drain:
        """The broker is stopping: what to do next to commit what is left (rule 9)."""
        if self.failed:
            return Drain.DONE
        if self._slow or self._fsyncs:
            return Drain.WAIT
        if self._held or self._early or has_changes:
            return Drain.FLUSH
        return Drain.DONE
