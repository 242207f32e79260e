"""Reconnecting: a reply lost mid-enqueue, a cut under a running job, a broker restart."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace

import pytest

from conveyor.broker.server import Broker, running_broker
from conveyor.sdk import Client, ConnectionFailed, Job, Worker

from .conftest import BASE_CONFIG, WAIT, Probe, Proxy, running, with_config


async def test_an_enqueue_whose_reply_was_lost_is_stored_once(
    client: Client, proxy: Proxy, probe: Probe
) -> None:
    proxy.cut_after = b"enqueue"
    async with Client(proxy.url, connect_timeout=WAIT, request_timeout=WAIT) as through:
        job_id = await asyncio.wait_for(through.enqueue("once", {"n": 1}), WAIT)

    assert proxy.cuts == 1 and proxy.accepted == 2  # it was cut, and it came back
    sent = probe.handled("enqueue")
    assert len(sent) == 2  # the broker got the request twice...
    assert sent[0].fields["key"] == sent[1].fields["key"]  # ...with the same key
    assert sent[0].result["id"] == sent[1].result["id"] == job_id
    stats = (await client.stats("once"))["once"]
    assert stats["totals"]["enqueued"] == 1 and stats["ready"] == 1


async def test_enqueue_many_resent_after_a_lost_reply_stores_each_job_once(
    client: Client, proxy: Proxy, probe: Probe
) -> None:
    proxy.cut_after = b"enqueue_batch"
    async with Client(proxy.url, connect_timeout=WAIT, request_timeout=WAIT) as through:
        ids = await asyncio.wait_for(through.enqueue_many("batch-once", [1, 2, 3]), WAIT)
    assert proxy.cuts == 1
    assert len(probe.handled("enqueue_batch")) == 2
    assert len(set(ids)) == 3
    assert (await client.stats("batch-once"))["batch-once"]["totals"]["enqueued"] == 3


async def test_a_cut_during_subscribe_is_retried_promptly(
    broker: Broker, client: Client, proxy: Proxy, probe: Probe
) -> None:
    handled = asyncio.Event()
    proxy.cut_after = b"subscribe"
    worker = Worker(proxy.url, queues=["resub"], shutdown_timeout_s=1.0)

    @worker.handler("resub")
    async def handle(job: Job) -> None:
        handled.set()

    async with running(worker, probe):  # returns once the first subscribe reached the broker
        await client.enqueue("resub", {})
        await asyncio.wait_for(handled.wait(), WAIT)
    assert proxy.cuts == 1
    assert len(probe.handled("subscribe")) == 2


@with_config(disconnect_grace_s=5.0)
async def test_a_worker_cut_off_mid_job_reattaches_its_lease(
    broker: Broker, client: Client, proxy: Proxy, probe: Probe
) -> None:
    calls: list[int] = []
    started = asyncio.Event()
    release = asyncio.Event()
    worker = Worker(proxy.url, queues=["reattach"], shutdown_timeout_s=1.0)

    @worker.handler("reattach")
    async def handle(job: Job) -> None:
        calls.append(job.attempt)
        started.set()
        await release.wait()

    async with running(worker, probe):
        job_id = await client.enqueue("reattach", {})
        await asyncio.wait_for(started.wait(), WAIT)
        proxy.cut()
        again = await probe.count("subscribe", 2)
        assert again[1].result == {"reattached": [job_id]}
        assert again[1].fields["worker_id"] == worker.worker_id
        release.set()
        ack = await probe.report("ack", job_id)
    assert ack.result == {"landed": True}  # the job's first lease still counted
    assert calls == [1]
    assert await client.get_job(job_id) is None


async def test_client_and_worker_reconnect_after_a_broker_restart(
    probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="conveyor.sdk")
    seen: list[str] = []
    handled = asyncio.Event()

    async def handle(job: Job) -> None:
        seen.append(job.payload)
        handled.set()

    async with contextlib.AsyncExitStack() as stack:
        async with running_broker(BASE_CONFIG) as first:
            port = int(first.url.rsplit(":", 1)[1].split("/", 1)[0])
            client = await stack.enter_async_context(
                Client(first.url, connect_timeout=WAIT, request_timeout=WAIT)
            )
            worker = Worker(first.url, queues=["restart"], shutdown_timeout_s=1.0)
            worker.handler("restart")(handle)
            await stack.enter_async_context(running(worker, probe))
            before = await client.enqueue("restart", "before")
            await probe.report("ack", before)
            handled.clear()

        async with running_broker(replace(BASE_CONFIG, port=port)):
            await probe.count("subscribe", 2)  # the worker came back by itself
            job_id = await client.enqueue("restart", "after")  # so did the client
            await asyncio.wait_for(handled.wait(), WAIT)
            assert (await probe.report("ack", job_id)).result == {"landed": True}
            warnings = [r.getMessage() for r in caplog.records if r.name == "conveyor.sdk"]
            # Once per outage for each of the two connections, not once per try.
            assert sum("lost the connection" in w for w in warnings) == 2, warnings
            assert sum("reconnected" in w for w in warnings) == 2, warnings
    assert seen == ["before", "after"]


async def test_enqueues_waiting_out_an_outage_fail_at_once_when_the_new_broker_refuses() -> None:
    from conveyor.sdk import Unauthorized
    from conveyor.sdk._wire import Role

    async with running_broker(replace(BASE_CONFIG, tokens={"old": frozenset(Role)})) as first:
        port = int(first.url.rsplit(":", 1)[1].split("/", 1)[0])
        client = Client(first.url, token="old", connect_timeout=WAIT, request_timeout=60.0)
        await client.__aenter__()
    try:
        # Made while no broker runs: they wait for the next one...
        waiting = [asyncio.ensure_future(client.enqueue("q", i)) for i in range(3)]
        new = replace(BASE_CONFIG, port=port, tokens={"new": frozenset(Role)})
        async with running_broker(new):
            # ...which refuses the token: each fails now, not at its 60 s timeout.
            outcomes = await asyncio.wait_for(
                asyncio.gather(*waiting, return_exceptions=True), WAIT
            )
        assert all(isinstance(outcome, Unauthorized) for outcome in outcomes), outcomes
        with pytest.raises(Unauthorized):  # and so does every later call
            await client.enqueue("q", 3)
    finally:
        await client.aclose()


async def test_a_call_during_an_outage_fails_after_the_request_timeout() -> None:
    async with running_broker(BASE_CONFIG) as broker:
        client = Client(broker.url, connect_timeout=WAIT, request_timeout=0.3)
        await client.__aenter__()
    try:
        with pytest.raises(ConnectionFailed):
            await asyncio.wait_for(client.enqueue("gone", {}), WAIT)
    finally:
        await client.aclose()


async def test_requests_a_broker_never_answers_fail_one_by_one_after_their_timeout() -> None:
    import orjson
    from websockets.asyncio.server import ServerConnection, serve

    arrived: asyncio.Queue[str] = asyncio.Queue()

    async def silent(ws: ServerConnection) -> None:  # answers hello, then nothing
        async for message in ws:
            frame = orjson.loads(message)
            if frame["op"] == "hello":
                await ws.send(orjson.dumps({"rid": frame["rid"], "ok": True}).decode())
            else:
                arrived.put_nowait(frame["op"])

    async with serve(silent, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        timeout = 0.3
        async with Client(
            f"ws://127.0.0.1:{port}/ws", connect_timeout=WAIT, request_timeout=timeout
        ) as client:
            loop = asyncio.get_running_loop()
            first_sent = loop.time()
            first = asyncio.ensure_future(client.stats())
            assert await asyncio.wait_for(arrived.get(), WAIT) == "stats"
            second_sent = loop.time()
            second = asyncio.ensure_future(client.get_job("x"))
            assert await asyncio.wait_for(arrived.get(), WAIT) == "get_job"
            failed = []
            for call, op, sent in ((first, "stats", first_sent), (second, "get_job", second_sent)):
                with pytest.raises(ConnectionFailed, match=f"^{op}: no reply"):
                    await asyncio.wait_for(call, WAIT)
                failed.append(loop.time())
                assert failed[-1] - sent >= timeout  # not before its time
            # The session still works: a third request gets its own full timeout.
            third_sent = loop.time()
            with pytest.raises(ConnectionFailed):
                await asyncio.wait_for(client.stats(), WAIT)
            assert loop.time() - third_sent >= timeout
