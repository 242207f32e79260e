"""Group commit: frames wait until the changes made before them are on disk.

With a durable store, a reply must not leave before what it confirms is durable
(publisher confirms), and a pushed job should not carry a lease the broker would
forget in a crash of its own (see *early* frames below). So every outgoing frame is
*held* here. At the end of each loop iteration the gate takes everything the engine
changed since the last commit (``JobTable.take_changes()``), writes it in one
transaction on the store's thread, and releases the frames held meanwhile when that
transaction returns. While one commit is in flight, new changes and frames gather for
the next, so the busier the broker, the larger (and cheaper per job) each commit.

A commit the store can make at once (``Store.commit_now``: any but a checkpointing one)
is written right here. With ``--sync normal`` its frames go out in the same turn, with
no task and no extra loop turn per commit. With ``--sync full`` the store hands back a
future for the commit's fsync, made by a helper process, and the frames wait for it
while the loop goes on: the next requests are read and handled meanwhile, and a commit
with frames to push early is written at once, behind the fsync in flight; the other
changes wait for that fsync to come back and then go in one commit, so that commits
still group while the disk is busy. The fsyncs end in the order of their commits, and so
are the held frames released. A checkpointing commit goes in a task, after the fsync in
flight, while the loop goes on; no commit is made until it is done.

Frames held while nothing changed are released at once, unless a commit is in flight:
then they wait for it, since they may describe state that commit makes durable (an
idempotent enqueue answered with the id of a job not yet on disk, say).

A pushed job confirms nothing to anyone; what it needs is that the broker remembers its
claim after a crash of its own. So a push can be held *early* (``hold_early``): when the
store calls back between a commit's write and its fsync (``--sync full``), the push is
put on the wire there, and the worker starts on it while the disk syncs. For a commit of
claims only, with either ``--sync``, the store calls back before the write, once the
claims are in its claim log (``broker/store/_claim_log.py``): the worker then starts
while the broker writes. Any other commit with nothing after its write
(``--sync normal``) sends it with the other frames. (Waiting for the fsync would leave a
lone worker idle while the disk syncs.) A power loss in that window can forget the
claim: the job is then handed out again without that attempt counted, as after any lost
lease. The dispatcher therefore holds a push of a job's last attempt to the fsync (see
``Dispatcher._push``): once that attempt has gone out, no power loss hands the job out
again (``max_attempts=1`` means at most one start).

The decisions above are ``GroupCommit``'s (``broker/group_commit.py``: a state machine
with no I/O, whose docstring lists the rules); ``CommitGate`` here is its asyncio driver,
which tells it the loop's events and carries out its answers with the table, the store
and the loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from .engine import Changes, JobTable
from .group_commit import (
    Action,
    AwaitFsync,
    Commit,
    Drain,
    GroupCommit,
    Release,
    Schedule,
    SendEarly,
    SlowCommit,
)
from .store import Store, StoreError

__all__ = ["CommitGate"]

log = logging.getLogger("conveyor.commit")

Deliver = Callable[[bytes], None]
Flush = Callable[[], None]
# A frame held here: how to deliver it, and its bytes.
Frame = tuple[Deliver, bytes]


class CommitGate:
    """Holds outgoing frames until the engine's changes before them are committed.

    The decisions are ``GroupCommit``'s (``broker/group_commit.py``, where the rules
    are listed); this driver feeds it the loop's events and carries out its actions
    with the table, the store and the loop."""

    def __init__(
        self,
        table: JobTable,
        store: Store,
        *,
        before_flush: Callable[[], None] = lambda: None,
        on_failure: Callable[[StoreError], None] = lambda exc: None,
    ) -> None:
        self._table = table
        self._store = store
        self._before_flush = before_flush
        self._on_failure = on_failure
        self._core: GroupCommit[Frame, Flush] = GroupCommit()
        self._fsync: asyncio.Future[None] | None = None  # the last commit's fsync
        self._slow_changes: Changes | None = None  # taken for a commit the store deferred
        self._slow: asyncio.Task[None] | None = None
        self.failed: StoreError | None = None
        self._bound_loop: asyncio.AbstractEventLoop | None = None

    @property
    def batches(self) -> int:
        """Commits made (for metrics)."""
        return self._core.commits

    def hold(self, deliver: Deliver, data: bytes) -> None:
        """Deliver ``data`` with ``deliver`` once everything changed so far is durable."""
        if self._core.hold((deliver, data)):
            self._loop().call_soon(self._flush)

    def hold_early(self, deliver: Deliver, data: bytes, flush: Flush) -> None:
        """Deliver ``data`` with ``deliver`` once everything changed so far is written,
        so that it survives a killed broker but perhaps not a power loss (see the module
        docstring). When an fsync follows that write, ``flush`` is called then too, to
        put the frame on the wire before it (once per distinct ``flush`` in a commit).
        Early frames may overtake frames held before them in the same commit, and those
        of an earlier commit whose fsync is still in flight; never those released
        already."""
        if self._core.hold_early((deliver, data), flush):
            self._loop().call_soon(self._flush)

    def poke(self) -> None:
        """The table changed without a frame (a sweep, a timer): commit it soon."""
        if self._table.has_changes and self._core.changed():
            self._loop().call_soon(self._flush)

    async def drain(self) -> None:
        """Commit what is left and release every held frame (the broker is stopping)."""
        while (step := self._core.drain(self._table.has_changes)) is not Drain.DONE:
            if step is Drain.FLUSH:
                self._flush()
            elif self._slow is not None:
                await asyncio.shield(self._slow)
            else:
                assert self._fsync is not None
                # (_synced, called before this wakes, releases its frames or fails.)
                await asyncio.wait([self._fsync])

    def _loop(self) -> asyncio.AbstractEventLoop:
        # The running loop, cached: asyncio.get_running_loop() makes a getpid() system
        # call (CPython's fork check), once per frame held here.
        loop = self._bound_loop
        if loop is None:
            loop = self._bound_loop = asyncio.get_running_loop()
        return loop

    def _flush(self) -> None:
        core = self._core
        if core.may_flush:
            # Let a dispatch pass due this iteration run first, so its pushes ride this
            # commit (its frames find the flush still scheduled, and ask for no other).
            self._before_flush()
        self._do(core.flush(self._table.has_changes))

    def _do(self, actions: list[Action[Frame, Flush]]) -> None:
        for action in actions:  # (the common actions first)
            if isinstance(action, Release):
                for deliver, data in action.frames:
                    deliver(data)
            elif isinstance(action, Commit):
                self._commit_now()
            elif isinstance(action, AwaitFsync):
                assert self._fsync is not None
                self._fsync.add_done_callback(functools.partial(self._synced, action.n))
            elif isinstance(action, SendEarly):
                _send_early(action.frames, action.flushes)
            elif isinstance(action, Schedule):
                self._loop().call_soon(self._flush)
            elif isinstance(action, SlowCommit):
                changes, self._slow_changes = self._slow_changes, None
                assert changes is not None
                self._slow = self._loop().create_task(self._commit(changes))

    def _commit_now(self) -> None:
        changes = self._table.take_changes()
        try:
            done = self._store.commit_now(changes, self._written)
        except StoreError as exc:
            self._fail(exc)
            return
        if done is False:
            self._slow_changes = changes
            self._do(self._core.checkpoint_due())
        elif done is True:
            self._do(self._core.committed(fsync=False))
        else:
            self._fsync = done
            self._do(self._core.committed(fsync=True))

    def _written(self) -> None:
        """The store's callback between a commit's write and its fsync."""
        self._do(self._core.written())

    def _synced(self, n: int, fsync: asyncio.Future[None]) -> None:
        """Fsync ``n`` is back: release what waited for it, or stop."""
        if fsync.cancelled():
            # Nobody can say what is on disk: as a failed fsync.
            self._fail(StoreError("an fsync was cancelled"))
            return
        exc = fsync.exception()
        if exc is not None:
            self._fail(exc if isinstance(exc, StoreError) else StoreError(str(exc)))
            return
        self._do(self._core.synced(n))

    async def _commit(self, changes: Changes) -> None:
        """The slow path: a checkpointing commit, after the fsync in flight."""
        try:
            await self._store.commit(changes, self._written)
        except StoreError as exc:
            self._fail(exc)
            return
        finally:
            self._slow = None
        self._do(self._core.slow_committed(self._table.has_changes))

    def _fail(self, exc: StoreError) -> None:
        if self._core.fail():
            # Nothing more can be promised: every frame is held back; stop the broker.
            self.failed = exc
            log.critical("the store failed; stopping: %s", exc)
            self._on_failure(exc)


def _send_early(frames: list[Frame], flushes: list[Flush]) -> None:
    """Deliver early frames and put them on the wire before the fsync, one flush per
    connection. Whatever goes wrong with one frame must not stop the commit (this runs
    in the store's callback), nor the frames after it."""
    for deliver, data in frames:
        try:
            deliver(data)
        except Exception:
            log.exception("an early frame could not be delivered")
    for flush in flushes:
        try:
            flush()
        except Exception:
            log.exception("an early frame could not be delivered")
