"""The order in which one loop turn's frames reach the sockets (memory store: no commit
gate in between). A job waiting for a worker is the latency a user sees, so the push it
makes goes out before the reply to the enqueue that made it."""

from __future__ import annotations

import pytest

from .conftest import ClientFactory, record_writes


async def test_a_push_is_written_before_the_reply_that_made_it(
    client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w", queues=["order"], prefetch=4)
    written = record_writes(monkeypatch)
    await publisher.call("enqueue", queue="order", payload=1)
    await worker.jobs(1)
    kinds = ["push" if frame.startswith(b'{"push"') else "reply" for frame in written]
    assert kinds == ["push", "reply"]
