"""The order in which one loop turn's frames reach the sockets, and where the fsync of
``--sync full`` falls among them.

Memory store (no commit gate): a job waiting for a worker is the latency a user sees, so
the push it makes goes out before the reply to the enqueue that made it.

SQLite store with ``--sync full``: a reply waits for the fsync of what it confirms. A push
waits only until its claim is written (it then survives a killed broker), so the worker
starts while the disk syncs, unless it carries a job's last attempt: that one waits for
the fsync, so that once a job's last attempt has gone out no power loss hands it out
again (``max_attempts`` 1 means at most one start).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from conveyor.broker import connection
from conveyor.broker.server import Broker
from conveyor.broker.store import SqliteStore
from conveyor.broker.store import sqlite as sqlite_store

from .conftest import ClientFactory, RawClient, record_writes, with_config


def kinds_of(written: list[bytes]) -> list[str]:
    return [
        "fsync"
        if frame == FSYNC
        else "write"
        if frame == WRITE
        else "checkpoint"
        if frame == CHECKPOINT
        else "push"
        if frame.startswith(b'{"push"')
        else "reply"
        for frame in written
    ]


FSYNC = b"<fsync>"
WRITE = b"<write to sqlite>"  # noted by tests that watch the store's writes
CHECKPOINT = b"<checkpoint>"  # noted by tests that watch the store's whole checkpoints


def record_fsyncs(monkeypatch: pytest.MonkeyPatch, written: list[bytes], broker: Broker) -> None:
    """Note each fsync of the WAL in ``written``, where it falls among the frames: each
    answer of the store's fsync helper as the loop reads it (before any frame waiting
    for it is let go), and each fsync on the writer thread (a checkpointing commit)."""
    store = broker.backend.store
    assert isinstance(store, SqliteStore) and store._syncer is not None
    syncer = store._syncer
    answered, fdatasync = syncer._answered, os.fdatasync

    def noting_answers() -> None:
        before = syncer.syncs
        answered()
        written.extend([FSYNC] * (syncer.syncs - before))

    def noting(fd: int) -> None:
        fdatasync(fd)
        written.append(FSYNC)

    monkeypatch.setattr(syncer, "_answered", noting_answers)
    monkeypatch.setattr(os, "fdatasync", noting)


async def subscribed(
    broker: Broker, client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> tuple[RawClient, RawClient, list[bytes]]:
    """A publisher and a worker subscribed to ``order`` (prefetch 4); then every frame
    written and, with ``--sync full``, every fsync of the WAL from now on, in order (see
    ``kinds_of``)."""
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w", queues=["order"], prefetch=4)
    written = record_writes(monkeypatch)
    if isinstance(broker.backend.store, SqliteStore) and broker.backend.store.sync == "full":
        record_fsyncs(monkeypatch, written, broker)
    return publisher, worker, written


async def test_a_push_is_written_before_the_reply_that_made_it(
    broker: Broker, client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher, worker, written = await subscribed(broker, client, monkeypatch)
    await publisher.call("enqueue", queue="order", payload=1)
    await worker.jobs(1)
    kinds = ["push" if frame.startswith(b'{"push"') else "reply" for frame in written]
    assert kinds == ["push", "reply"]


@pytest.mark.parametrize("store_kind", ["sqlite"])
async def test_with_fsync_a_push_leaves_before_the_fsync_and_the_reply_after_it(
    broker: Broker, client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher, worker, written = await subscribed(broker, client, monkeypatch)
    await publisher.call("enqueue", queue="order", payload=1, max_attempts=2)
    [job] = await worker.jobs(1)
    # One commit holds the job and its claim: the push is out once it is written.
    assert kinds_of(written) == ["push", "fsync", "reply"]
    written.clear()
    await worker.call("ack", id=job["id"], lease=job["lease"])
    assert kinds_of(written) == ["fsync", "reply"]


@pytest.mark.parametrize("store_kind", ["sqlite"])
async def test_with_fsync_a_jobs_last_attempt_waits_for_the_fsync(
    broker: Broker, client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher, worker, written = await subscribed(broker, client, monkeypatch)
    await publisher.call("enqueue", queue="order", payload=1, max_attempts=1)
    await worker.jobs(1)
    kinds = kinds_of(written)
    assert kinds.count("fsync") == 1
    assert kinds.index("fsync") < kinds.index("push")
    # The same when the frame's other jobs have attempts left: one such job holds it.
    written.clear()
    await worker.call("pause", queue="order")
    await publisher.call(
        "enqueue_batch",
        queue="order",
        jobs=[{"payload": 2, "max_attempts": 3}, {"payload": 3, "max_attempts": 1}],
    )
    await worker.call("resume", queue="order")
    jobs = await worker.jobs(2)
    assert sorted(job["payload"] for job in jobs) == [2, 3]
    kinds = kinds_of(written)
    assert kinds.index("fsync") < kinds.index("push")


@pytest.mark.parametrize("store_kind", ["sqlite"])
@with_config(sync="normal")
async def test_without_fsync_a_push_and_its_reply_leave_once_written(
    broker: Broker, client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher, worker, written = await subscribed(broker, client, monkeypatch)
    await publisher.call("enqueue", queue="order", payload=1)
    await worker.jobs(1)
    assert sorted(kinds_of(written)) == ["push", "reply"]


def note_checkpoints(monkeypatch: pytest.MonkeyPatch, written: list[bytes], broker: Broker) -> None:
    """Make every checkpointing commit a whole one, and note each whole checkpoint in
    ``written`` when it ends (on the writer thread, before the commit's replies go)."""
    store = broker.backend.store
    assert isinstance(store, SqliteStore)
    monkeypatch.setattr(sqlite_store, "_CHECKPOINT_EVERY_FULL", 1)
    monkeypatch.setattr(sqlite_store, "_CHECKPOINT_EVERY", 1)
    monkeypatch.setattr(sqlite_store, "_RESTART_FRAMES", -1)  # normal: the WAL must restart
    checkpoint = store._sync_and_checkpoint

    def noting() -> None:
        checkpoint()
        written.append(CHECKPOINT)

    monkeypatch.setattr(store, "_sync_and_checkpoint", noting)


@pytest.mark.parametrize("store_kind", ["sqlite"])
async def test_a_checkpointing_commits_push_leaves_before_its_fsync_and_checkpoint(
    broker: Broker, client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A whole checkpoint: its commit is written on the loop, then fsynced and
    # checkpointed on the writer thread while the commits behind it wait. Its push
    # leaves once it is written (a push held for the whole checkpoint set the p99 of
    # --sync full); its reply waits for both.
    publisher, worker, written = await subscribed(broker, client, monkeypatch)
    note_checkpoints(monkeypatch, written, broker)
    await publisher.call("enqueue", queue="order", payload=1, max_attempts=2)
    [job] = await worker.jobs(1)
    assert kinds_of(written) == ["push", "fsync", "checkpoint", "reply"]
    # A job's last attempt still waits for the fsync, checkpoint or not.
    written.clear()
    await worker.call("ack", id=job["id"], lease=job["lease"])
    written.clear()
    await publisher.call("enqueue", queue="order", payload=2, max_attempts=1)
    await worker.jobs(1)
    kinds = kinds_of(written)
    assert kinds.index("fsync") < kinds.index("push")


@pytest.mark.parametrize("store_kind", ["sqlite"])
@with_config(sync="normal")
async def test_without_fsync_a_whole_checkpoints_push_leaves_before_the_checkpoint(
    broker: Broker, client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --sync normal makes a whole checkpoint only when the WAL must restart; its push,
    # too, leaves once the commit is written, and its reply after the checkpoint.
    publisher, worker, written = await subscribed(broker, client, monkeypatch)
    note_checkpoints(monkeypatch, written, broker)
    await publisher.call("enqueue", queue="order", payload=1)
    await worker.jobs(1)
    assert kinds_of(written) == ["push", "checkpoint", "reply"]


@pytest.mark.parametrize("store_kind", ["sqlite"])
async def test_with_fsync_the_reply_to_subscribe_still_comes_before_any_push(
    broker: Broker, client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher = await client()
    await publisher.call("enqueue_batch", queue="order", jobs=[{"payload": i} for i in range(3)])
    worker = await client()
    written = record_writes(monkeypatch)
    record_fsyncs(monkeypatch, written, broker)
    await worker.send(
        {"op": "subscribe", "rid": "s", "worker_id": "w", "queues": ["order"], "prefetch": 4}
    )
    first: dict[str, Any] = await worker.recv()
    assert first.get("rid") == "s", first
    # The claims made at subscribe are one commit; its pushes waited for the reply.
    assert kinds_of(written) == ["fsync", "reply", "push"]
    assert len(await worker.jobs(3)) == 3
    # Later pushes on this connection leave before their fsync again.
    written.clear()
    await publisher.call("enqueue", queue="order", payload=9)
    await worker.jobs(1)
    assert kinds_of(written) == ["push", "fsync", "reply"]


@pytest.mark.parametrize("store_kind", ["sqlite"])
async def test_an_early_frame_that_cannot_be_delivered_stops_neither_commit_nor_reply(
    broker: Broker,
    client: ClientFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    publisher, _worker, _ = await subscribed(broker, client, monkeypatch)

    def broken() -> None:
        raise RuntimeError("a bug in one connection's write path")

    [subscription] = broker.dispatcher.subscriptions
    assert isinstance(subscription.owner, connection.Connection)
    monkeypatch.setattr(subscription.owner, "flush_now", broken)
    reply = await publisher.call("enqueue", queue="order", payload=1)
    assert reply["id"]
    assert "an early frame could not be delivered" in caplog.text
    stats = await publisher.call("stats", queue="order")
    assert stats["queues"]["order"]["processing"] == 1  # the claim was committed all the same


@pytest.mark.parametrize("store_kind", ["sqlite"])
@pytest.mark.parametrize("config_changes", [{"sync": "full"}, {"sync": "normal"}])
async def test_a_refill_push_leaves_before_its_claims_are_written_to_sqlite(
    broker: Broker, client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A commit of claims only (the ack's refill) goes to the claim log first, so the push
    # is out before SQLite writes the commit, and the ack's reply after the write (with
    # full, after its fsync).
    publisher, worker, written = await subscribed(broker, client, monkeypatch)
    await publisher.call("enqueue_batch", queue="order", jobs=[{"payload": i} for i in range(5)])
    jobs = await worker.jobs(4)  # its prefetch: the fifth waits
    store = broker.backend.store
    assert isinstance(store, SqliteStore)
    write = store.write

    def noting(changes: Any, packed: Any = None) -> None:
        written.append(WRITE)
        write(changes, packed)

    monkeypatch.setattr(store, "write", noting)
    written.clear()
    await worker.send({"op": "ack", "rid": "a", "id": jobs[0]["id"], "lease": jobs[0]["lease"]})
    [refill] = await worker.jobs(1)
    assert refill["payload"] == 4
    reply: dict[str, Any] = await worker.recv()
    assert reply.get("rid") == "a" and reply["ok"] is True, reply
    if store.sync == "full":
        assert kinds_of(written) == ["push", "write", "fsync", "reply"]
    else:
        assert kinds_of(written) == ["push", "write", "reply"]
