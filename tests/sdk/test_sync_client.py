"""``SyncClient``: the blocking publisher, from plain threads, outside any event loop.

These tests are plain functions (no event loop runs in the test's thread), against a
broker in a subprocess (``conveyor serve --port 0``).
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from conveyor.sdk import ConnectionFailed, InvalidArgument, JobInfo, NotFound, SyncClient

from .conftest import WAIT, free_port


def fresh(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_every_call_blocks_and_returns_plain_values(broker_process: str) -> None:
    queue = fresh("sync")
    with SyncClient(broker_process, connect_timeout=WAIT, request_timeout=WAIT) as client:
        job_id = client.enqueue(queue, {"to": "a@b.c"}, priority=4, delay_s=60.0, key="k")
        assert client.enqueue(queue, {"other": 1}, key="k") == job_id
        info = client.get_job(job_id)
        assert isinstance(info, JobInfo)
        assert (info.queue, info.payload, info.priority, info.key) == (
            queue,
            {"to": "a@b.c"},
            4,
            "k",
        )
        ids = client.enqueue_many(queue, [1, 2, 3], max_attempts=2)
        assert len(set(ids)) == 3
        stats = client.stats(queue)[queue]
        assert (stats["ready"], stats["scheduled"]) == (3, 1)
        assert queue in client.stats()

        assert client.cancel(job_id) is True
        assert client.cancel(job_id) is False
        assert client.get_job(job_id) is None

        client.pause(queue)
        assert client.stats(queue)[queue]["paused"] is True
        client.resume(queue)
        assert client.stats(queue)[queue]["paused"] is False
        assert client.redrive(ids[0]) is False  # not dead
        assert client.purge_dead(queue) == 0

        with pytest.raises(InvalidArgument) as caught:  # the same errors as Client
            client.enqueue(queue, {}, priority=2**31)
        assert caught.value.field == "priority"
        with pytest.raises(NotFound):
            client.stats(fresh("unknown"))


def test_one_client_shared_by_plain_threads(broker_process: str) -> None:
    queue = fresh("threads")
    threads, per_thread = 4, 25
    start = threading.Barrier(threads)

    with SyncClient(broker_process, connect_timeout=WAIT, request_timeout=WAIT) as client:

        def publish(worker: int) -> list[str]:
            start.wait(WAIT)
            return [client.enqueue(queue, {"t": worker, "i": i}) for i in range(per_thread)]

        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(publish, t) for t in range(threads)]
            results = [future.result(timeout=WAIT) for future in futures]

        ids = [job_id for batch in results for job_id in batch]
        assert len(ids) == len(set(ids)) == threads * per_thread
        stats = client.stats(queue)[queue]
        assert stats["totals"]["enqueued"] == stats["ready"] == threads * per_thread
        for t, batch in enumerate(results):
            info = client.get_job(batch[-1])
            assert info is not None and info.payload == {"t": t, "i": per_thread - 1}


def test_no_broker_is_connection_failed() -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionFailed):
        with SyncClient(f"ws://127.0.0.1:{free_port()}", connect_timeout=0.3):
            pass
    assert time.monotonic() - started < 2.0


def test_calls_outside_with_say_how_to_use_it(broker_process: str) -> None:
    client = SyncClient(broker_process)
    with pytest.raises(RuntimeError, match="with SyncClient"):
        client.enqueue(fresh("nowhere"), {})
    with client:
        assert client.enqueue(fresh("somewhere"), {})
    with pytest.raises(RuntimeError, match="with SyncClient"):
        client.stats()  # closed again
