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
claim after a crash of its own. So a push can be held *early* (``hold_early``): when
the store calls back between a commit's write and its fsync (``--sync full``), the push
is put on the wire there, and the worker starts on it while the disk syncs. For a commit
of claims only, with either ``--sync``, the store calls back before the write, once the
claims are in its claim log (``broker/store/_claim_log.py``): the worker then starts while
the broker writes. Any other commit with nothing after its write (``--sync normal``)
sends it with the other frames.
(Waiting for the fsync cost the 1-worker drain on ``--sync full`` about a fifth of its
rate: the broker's loop did nothing else meanwhile.) A power loss in that window can
forget the claim: the job is then handed out again without that attempt counted, as
after any lost lease. The dispatcher therefore holds a push of a job's last attempt to
the fsync (see ``Dispatcher._push``): once that attempt has gone out, no power loss
hands the job out again (``max_attempts=1`` means at most one start).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from .engine import Changes, JobTable
from .store import Store, StoreError

__all__ = ["CommitGate"]

log = logging.getLogger("conveyor.commit")

Deliver = Callable[[bytes], None]
# An early frame: how to deliver it, its bytes, and the flush that puts it on the wire.
Early = tuple[Deliver, bytes, Callable[[], None]]


class CommitGate:
    """Holds outgoing frames until the engine's changes before them are committed."""

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
        self._held: list[tuple[Deliver, bytes]] = []
        self._early: list[Early] = []  # see hold_early
        self._scheduled = False
        self._inflight: asyncio.Task[None] | None = None
        # --sync full: the fsync of the last commit written, while it is in flight.
        self._syncing: asyncio.Future[None] | None = None
        self._waiting_sync = False  # a flush is to follow that fsync (see _flush)
        self.failed: StoreError | None = None
        self._bound_loop: asyncio.AbstractEventLoop | None = None
        self.batches = 0  # commits made (for metrics)

    def hold(self, deliver: Deliver, data: bytes) -> None:
        """Deliver ``data`` with ``deliver`` once everything changed so far is durable."""
        self._held.append((deliver, data))
        self._schedule()

    def hold_early(self, deliver: Deliver, data: bytes, flush: Callable[[], None]) -> None:
        """Deliver ``data`` with ``deliver`` once everything changed so far is written,
        so that it survives a killed broker but perhaps not a power loss (see the module
        docstring). When an fsync follows that write, ``flush`` is called then too, to
        put the frame on the wire before it (once per distinct ``flush`` in a commit).
        Early frames may overtake frames held before them in the same commit, and those
        of an earlier commit whose fsync is still in flight; never those released
        already."""
        self._early.append((deliver, data, flush))
        self._schedule()

    def poke(self) -> None:
        """The table changed without a frame (a sweep, a timer): commit it soon."""
        if self._table.has_changes:
            self._schedule()

    async def drain(self) -> None:
        """Commit what is left and release every held frame (the broker is stopping)."""
        while (
            self._inflight is not None
            or self._sync_in_flight() is not None
            or self._held
            or self._early
            or self._table.has_changes
        ):
            if self._inflight is not None:
                await asyncio.shield(self._inflight)
            elif (syncing := self._sync_in_flight()) is not None:
                # (_synced, called before this wakes, releases its frames or fails.)
                await asyncio.wait([syncing])
            else:
                self._flush()
            if self.failed is not None:
                return

    def _sync_in_flight(self) -> asyncio.Future[None] | None:
        syncing = self._syncing
        if syncing is not None and syncing.done():
            syncing = self._syncing = None
        return syncing

    def _loop(self) -> asyncio.AbstractEventLoop:
        # The running loop, cached: asyncio.get_running_loop() makes a getpid() system
        # call (CPython's fork check), once per frame held here.
        loop = self._bound_loop
        if loop is None:
            loop = self._bound_loop = asyncio.get_running_loop()
        return loop

    def _schedule(self) -> None:
        if not self._scheduled and self._inflight is None:
            self._scheduled = True
            self._loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self._inflight is not None or self.failed is not None:
            return
        # Let a dispatch pass due this iteration run first, so its pushes ride this commit.
        self._before_flush()
        syncing = self._sync_in_flight()
        if syncing is not None and not self._early:
            # Nothing to push early: wait for the fsync in flight, and then commit what
            # gathered meanwhile in one (a commit, and an fsync, per loop turn cost more
            # CPU per job than the disk saves).
            if not self._waiting_sync:
                self._waiting_sync = True
                syncing.add_done_callback(self._after_sync)
            return
        held, self._held = self._held, []
        early, self._early = self._early, []
        if not self._table.has_changes:
            _release_early(early)
            if syncing is not None:
                syncing.add_done_callback(functools.partial(self._synced, held))
            else:
                _release(held)
            return
        changes = self._table.take_changes()
        try:
            done = self._store.commit_now(changes, lambda: _before_fsync(early))
        except StoreError as exc:
            self._fail(exc)
            return
        if done is False:
            self._inflight = self._loop().create_task(self._commit(changes, early, held))
            return
        self.batches += 1
        _release_early(early)
        if done is True:
            _release(held)
            return
        self._syncing = done
        done.add_done_callback(functools.partial(self._synced, held))

    def _synced(self, held: list[tuple[Deliver, bytes]], syncing: asyncio.Future[None]) -> None:
        """The fsync a commit's frames waited for is back: release them, or stop."""
        if syncing.cancelled():
            return
        exc = syncing.exception()
        if exc is not None:
            if self.failed is None:
                self._fail(exc if isinstance(exc, StoreError) else StoreError(str(exc)))
            return
        if self.failed is None:
            _release(held)

    def _after_sync(self, _: asyncio.Future[None]) -> None:
        self._waiting_sync = False
        self._schedule()

    def _fail(self, exc: StoreError) -> None:
        # Nothing more can be promised: hold every frame back and stop the broker.
        self.failed = exc
        log.critical("the store failed; stopping: %s", exc)
        self._on_failure(exc)

    async def _commit(
        self,
        changes: Changes,
        early: list[Early],
        held: list[tuple[Deliver, bytes]],
    ) -> None:
        try:
            if (syncing := self._sync_in_flight()) is not None:
                await asyncio.wait([syncing])  # first the commits written before this one
                if self.failed is not None:
                    return
            await self._store.commit(changes, lambda: _before_fsync(early))
        except StoreError as exc:
            self._fail(exc)
            return
        finally:
            self._inflight = None
        self.batches += 1
        _release_early(early)
        _release(held)
        if self._held or self._early or self._table.has_changes:
            self._schedule()


def _release(held: list[tuple[Deliver, bytes]]) -> None:
    for deliver, data in held:
        deliver(data)


def _release_early(early: list[Early]) -> None:
    # After the commit: what the store's callback (_before_fsync) did not already send
    # goes with the other frames (the connection writes them all at once).
    for deliver, data, _ in early:
        deliver(data)


def _before_fsync(early: list[Early]) -> None:
    """The store's callback between a commit's write and its fsync: deliver the early
    frames and put them on the wire now, one flush per connection; then they are gone
    from ``early``. Whatever goes wrong with one frame must not stop the commit, nor
    the frames after it."""
    flushes: dict[Callable[[], None], None] = {}
    for deliver, data, flush in early:
        try:
            deliver(data)
        except Exception:
            log.exception("an early frame could not be delivered")
        flushes[flush] = None
    early.clear()
    for flush in flushes:
        try:
            flush()
        except Exception:
            log.exception("an early frame could not be delivered")
