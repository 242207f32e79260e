"""The broker's ``max_frame_bytes``: no request frame over it goes out; shared frames split
to fit; a 1009 close fails the request that caused it instead of resending it."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from conveyor.broker import ops
from conveyor.broker.server import Broker
from conveyor.sdk import Client, TooLarge
from conveyor.sdk._wire import DEFAULT_MAX_FRAME_BYTES, Op

from .conftest import WAIT, Probe, with_config


async def test_an_enqueue_over_the_frame_limit_fails_at_once_and_nothing_else_does(
    probe: Probe, client: Client
) -> None:
    assert client.server_info["max_frame_bytes"] == DEFAULT_MAX_FRAME_BYTES
    big, small, stats = await asyncio.gather(
        client.enqueue("big", "x" * 1_300_000),
        client.enqueue("big", "small"),
        client.stats(),
        return_exceptions=True,
    )
    assert isinstance(big, TooLarge)
    assert big.code == "too_large"
    assert re.fullmatch(
        r"enqueue frame is 1,300,\d{3} bytes; the broker accepts at most 1,048,576 "
        r"\(max_frame_bytes\)",
        big.message,
    ), big.message
    assert isinstance(small, str) and isinstance(stats, dict)
    assert await client.get_job(small) is not None
    # Nothing was sent for it: the connection it would have cost is still the first.
    assert len(probe.handled("hello")) == 1
    assert [h.fields["payload"] for h in probe.handled("enqueue")] == ["small"]


async def test_enqueue_many_refuses_a_job_too_large_for_any_frame_before_sending_any(
    probe: Probe, client: Client
) -> None:
    with pytest.raises(TooLarge) as caught:
        await client.enqueue_many("big", ["small", "x" * 1_100_000])
    assert caught.value.field == "jobs[1].payload"
    assert "at most 1,048,576 (max_frame_bytes)" in caught.value.message
    assert probe.handled("enqueue_batch") == []
    assert len(probe.handled("hello")) == 1


@with_config(max_frame_bytes=16384)
async def test_shared_enqueues_too_large_together_go_in_several_frames_that_fit(
    probe: Probe, client: Client
) -> None:
    payloads = [f"{i:02}" + "p" * 3000 for i in range(20)]  # 60 KB: a shared frame's worth
    ids = await asyncio.gather(*(client.enqueue("split", p) for p in payloads))
    frames = [h.fields["jobs"] for h in probe.log if h.op == "enqueue_each"]
    assert sum(len(jobs) for jobs in frames) == 20
    assert 4 < len(frames) < 20  # split to fit, and still shared
    assert len(probe.handled("hello")) == 1  # no frame was refused
    for job_id, payload in zip(ids, payloads, strict=True):
        info = await client.get_job(job_id)
        assert info is not None and info.payload == payload


@with_config(max_frame_bytes=16384)
async def test_enqueue_many_splits_its_frames_to_fit(probe: Probe, client: Client) -> None:
    payloads = [{"n": i, "pad": "p" * 3000} for i in range(20)]
    ids = await client.enqueue_many("split", payloads)
    batches = [h.fields["jobs"] for h in probe.handled("enqueue_batch")]
    assert sum(len(jobs) for jobs in batches) == 20
    assert max(len(jobs) for jobs in batches) == 5  # as many as fit in 16 KiB
    assert len(probe.handled("hello")) == 1
    infos = [await client.get_job(job_id) for job_id in ids]
    assert [info.payload if info else None for info in infos] == payloads


@with_config(max_frame_bytes=4096)
async def test_a_1009_close_fails_the_request_it_was_over_and_resends_the_rest(
    broker: Broker, probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A broker whose hello says more than it takes: the SDK cannot know in advance.
    hello = ops.HANDLERS[Op.HELLO]

    def boasting(conn: Any, fields: dict[str, Any]) -> Any:
        return {**hello(conn, fields), "max_frame_bytes": DEFAULT_MAX_FRAME_BYTES}

    monkeypatch.setitem(ops.HANDLERS, Op.HELLO, boasting)
    async with Client(broker.url, connect_timeout=WAIT, request_timeout=WAIT) as client:
        assert client.server_info["max_frame_bytes"] == DEFAULT_MAX_FRAME_BYTES
        big, small, stats = await asyncio.gather(
            client.enqueue("q", "x" * 10_000),
            client.enqueue("q", "small"),
            client.stats(),
            return_exceptions=True,
        )
        assert isinstance(big, TooLarge), big
        assert "closed the connection over it (1009, message too big)" in big.message
        assert isinstance(small, str) and isinstance(stats, dict)
        assert await client.get_job(small) is not None
    # One reconnect, for the others' sake; the large frame was not sent again.
    assert len(probe.handled("hello")) == 2
    assert [h.fields["payload"] for h in probe.handled("enqueue")] == ["small"]
