"""The order in which one loop turn's frames reach the sockets (memory store: no commit
gate in between). A job waiting for a worker is the latency a user sees, so the push it
makes goes out before the reply to the enqueue that made it."""

from __future__ import annotations

from typing import Any

import pytest

from broker import server

from .conftest import ClientFactory


async def test_a_push_is_written_before_the_reply_that_made_it(
    client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[str] = []
    write = server._Socket.write_text_frames

    def logged(self: Any, outbox: Any, limit: int) -> None:
        written.extend("push" if frame.startswith(b'{"push"') else "reply" for frame in outbox)
        write(self, outbox, limit)

    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w", queues=["order"], prefetch=4)
    monkeypatch.setattr(server._Socket, "write_text_frames", logged)
    await publisher.call("enqueue", queue="order", payload=1)
    await worker.jobs(1)
    assert written == ["push", "reply"]
