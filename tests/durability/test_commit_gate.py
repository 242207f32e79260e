"""The commit gate (``broker/commit.py``) over a store whose fsyncs end when the test says.

With ``--sync full`` the SQLite store writes a commit on the loop and hands back a future
for its fsync, which its helper process makes while the loop goes on. These tests stand
a scripted store in its place, so that each fsync ends exactly when the test resolves
it, and pin what the gate does meanwhile: which frames wait for which fsync, when a
commit may be written behind one in flight, and that commits still group. The decisions
alone, with no loop, are tested in ``test_group_commit.py``; these test the driver.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from conveyor.broker.commit import CommitGate
from conveyor.broker.engine import Changes, JobTable
from conveyor.broker.store import StoreError

WAIT = 5.0


class ScriptedStore:
    """A durable store whose every ``commit_now`` returns a future the test resolves
    (``fsyncs``, in order), or ``False`` while ``checkpoint_due`` is set (then ``commit``
    waits for ``checkpoint_done``)."""

    name = "scripted"
    durable = True
    slow_commits = True

    def __init__(self) -> None:
        self.commits: list[Changes] = []  # every commit written, in order
        self.fsyncs: list[asyncio.Future[None]] = []  # one per commit_now that wrote
        self.checkpoint_due = False
        self.checkpoint_done: asyncio.Event = asyncio.Event()
        self.log: list[str] = []  # "write", "written" (the gate's callback), "checkpoint"

    def commit_now(
        self, changes: Changes, written: Callable[[], None] = lambda: None
    ) -> bool | asyncio.Future[None]:
        if self.checkpoint_due:
            return False
        self.commits.append(changes)
        self.log.append("write")
        written()
        self.log.append("written")
        future = asyncio.get_running_loop().create_future()
        self.fsyncs.append(future)
        return future

    async def commit(self, changes: Changes, written: Callable[[], None] = lambda: None) -> None:
        self.log.append("checkpoint")
        self.commits.append(changes)
        await self.checkpoint_done.wait()

    def close(self) -> None:
        pass


class Setup:
    def __init__(self) -> None:
        self.table = JobTable(clock=lambda: 1000.0, rng=random.Random(0), id_prefix="t")
        self.table.start_journal()
        self.queue = self.table.queue("q")
        self.store = ScriptedStore()
        self.failures: list[StoreError] = []
        self.gate = CommitGate(self.table, self.store, on_failure=self.failures.append)
        self.out: list[bytes] = []  # frames delivered, in order
        self.flushes = 0

    def deliver(self, data: bytes) -> None:
        self.out.append(data)

    def flush(self) -> None:
        self.flushes += 1

    def reply(self, data: bytes) -> None:
        """A change and the reply that confirms it (an enqueue, say)."""
        self.queue.enqueue({"frame": data.decode()})
        self.gate.hold(self.deliver, data)

    def push(self, data: bytes) -> None:
        """A change and a push that needs it written, not fsynced (a claim)."""
        self.queue.enqueue({"frame": data.decode()})
        self.gate.hold_early(self.deliver, data, self.flush)


async def turns(n: int = 3) -> None:
    """Let the loop run ``n`` iterations: the gate flushes at the end of one."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_reply_waits_for_its_fsync_and_a_push_goes_at_the_write() -> None:
    s = Setup()
    s.push(b"push")
    s.reply(b"reply")
    await turns()
    assert len(s.store.commits) == 1 and len(s.store.commits[0].upserts) == 2
    assert s.out == [b"push"] and s.flushes == 1  # on the wire before the fsync
    s.store.fsyncs[0].set_result(None)
    await turns()
    assert s.out == [b"push", b"reply"]


async def test_while_an_fsync_is_in_flight_changes_gather_for_one_commit_after_it() -> None:
    s = Setup()
    s.reply(b"r1")
    await turns()
    assert len(s.store.commits) == 1
    for i in range(2, 6):  # four loop turns' worth of requests while the disk syncs
        s.reply(f"r{i}".encode())
        await turns()
    assert len(s.store.commits) == 1, "nothing more is written until the fsync is back"
    assert s.out == []
    s.store.fsyncs[0].set_result(None)
    await turns()
    assert s.out == [b"r1"]
    assert len(s.store.commits) == 2 and len(s.store.commits[1].upserts) == 4
    s.store.fsyncs[1].set_result(None)
    await turns()
    assert s.out == [b"r1", b"r2", b"r3", b"r4", b"r5"]


async def test_a_push_is_written_behind_the_fsync_in_flight_and_replies_keep_their_order() -> None:
    s = Setup()
    s.reply(b"r1")
    await turns()
    s.reply(b"r2")
    s.push(b"p2")  # a worker is waiting: this commit is written at once
    await turns()
    assert len(s.store.commits) == 2 and len(s.store.commits[1].upserts) == 2
    assert s.out == [b"p2"]  # the push left before either fsync came back
    s.store.fsyncs[0].set_result(None)  # the helper answers in order
    await turns()
    assert s.out == [b"p2", b"r1"]
    s.store.fsyncs[1].set_result(None)
    await turns()
    assert s.out == [b"p2", b"r1", b"r2"]


async def test_a_frame_with_no_change_of_its_own_waits_for_the_fsync_in_flight() -> None:
    # It may describe what that commit makes durable (an idempotent enqueue's reply).
    s = Setup()
    s.reply(b"r1")
    await turns()
    s.gate.hold(s.deliver, b"same-key reply")
    await turns()
    assert s.out == [] and len(s.store.commits) == 1
    s.store.fsyncs[0].set_result(None)
    await turns()
    assert s.out == [b"r1", b"same-key reply"]


async def test_a_checkpointing_commit_waits_for_the_fsync_in_flight() -> None:
    s = Setup()
    s.reply(b"r1")
    await turns()
    s.store.checkpoint_due = True
    s.reply(b"r2")
    s.push(b"p2")
    await turns()
    assert s.store.log == ["write", "written"]  # not yet: the first fsync is out
    s.store.fsyncs[0].set_result(None)
    await turns()
    assert s.store.log == ["write", "written", "checkpoint"]
    assert s.out == [b"r1"]
    s.store.checkpoint_done.set()
    await turns()
    assert s.out == [b"r1", b"p2", b"r2"]


async def test_a_failed_fsync_releases_nothing_after_it_and_stops_the_gate() -> None:
    s = Setup()
    s.reply(b"r1")
    await turns()
    s.reply(b"r2")
    s.push(b"p2")
    await turns()
    assert len(s.store.fsyncs) == 2
    s.store.fsyncs[0].set_exception(StoreError("x.db: cannot fsync the WAL: EIO"))
    s.store.fsyncs[1].set_exception(StoreError("x.db: cannot fsync the WAL: EIO"))
    await turns()
    assert s.out == [b"p2"]  # neither reply: what they confirm may not be on disk
    assert isinstance(s.gate.failed, StoreError) and len(s.failures) == 1
    s.reply(b"r3")
    await turns()
    assert len(s.store.commits) == 2 and s.out == [b"p2"]


async def test_drain_waits_for_the_fsync_in_flight_and_commits_what_is_left() -> None:
    s = Setup()
    s.reply(b"r1")
    await turns()
    s.reply(b"r2")  # gathered behind the fsync in flight
    drained = asyncio.create_task(s.gate.drain())
    await turns()
    assert not drained.done()
    s.store.fsyncs[0].set_result(None)
    await turns()
    assert s.out == [b"r1"] and len(s.store.fsyncs) == 2 and not drained.done()
    s.store.fsyncs[1].set_result(None)
    await asyncio.wait_for(drained, WAIT)
    assert s.out == [b"r1", b"r2"]


@pytest.mark.parametrize("fsyncs_in_flight", [1, 3])
async def test_frames_leave_in_the_order_their_fsyncs_end(fsyncs_in_flight: int) -> None:
    s = Setup()
    for i in range(fsyncs_in_flight):
        s.reply(f"r{i}".encode())
        s.push(f"p{i}".encode())
        await turns()
    assert len(s.store.fsyncs) == fsyncs_in_flight
    pushes = [f"p{i}".encode() for i in range(fsyncs_in_flight)]
    assert s.out == pushes
    for i, fsync in enumerate(s.store.fsyncs):
        fsync.set_result(None)
        await turns()
        assert s.out == pushes + [f"r{j}".encode() for j in range(i + 1)]


async def test_a_cancelled_fsync_counts_as_failed() -> None:
    # Nobody can say whether the commit is on disk: hold its frames back and stop.
    s = Setup()
    s.reply(b"r1")
    await turns()
    s.store.fsyncs[0].cancel()
    await turns()
    assert s.out == [] and isinstance(s.gate.failed, StoreError) and len(s.failures) == 1
    await asyncio.wait_for(s.gate.drain(), WAIT)


async def test_one_flush_is_scheduled_per_batch() -> None:
    s = Setup()
    loop = asyncio.get_running_loop()
    calls = 0
    call_soon = loop.call_soon

    def counting(callback: Callable[..., object], *args: Any, **kwargs: Any) -> asyncio.Handle:
        nonlocal calls
        calls += 1
        return call_soon(callback, *args, **kwargs)

    loop.call_soon = counting  # type: ignore[method-assign, assignment]
    try:
        s.reply(b"r1")
        s.push(b"p1")
        s.reply(b"r2")
        s.gate.poke()
        assert calls == 1
    finally:
        del loop.call_soon
    await turns()
    assert len(s.store.commits) == 1 and s.gate.batches == 1


async def test_a_frame_held_as_an_fsync_ends_still_leaves_after_that_fsyncs_frames() -> None:
    # The fsync's future is done, its callbacks not yet run, and a flush is due first:
    # the frame must not overtake the replies that fsync releases (one connection's
    # replies in order).
    s = Setup()
    s.reply(b"r1")
    await turns()
    s.gate.hold(s.deliver, b"r2")  # no change of its own; a flush is scheduled
    s.store.fsyncs[0].set_result(None)  # its callbacks go after that flush
    await turns()
    assert s.out == [b"r1", b"r2"]
