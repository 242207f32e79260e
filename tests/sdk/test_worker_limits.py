"""Time limits: a handler past its limit is retried (job > handler > queue), not waited for."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from conveyor.broker.server import Broker
from conveyor.sdk import Client, InvalidArgument, Job, Worker

from .conftest import WAIT, Probe, running

ERROR = "TimeoutError: handler ran past its {} s time limit"


def make_worker(broker: Broker, **kwargs: Any) -> Worker:
    kwargs.setdefault("shutdown_timeout_s", 1.0)
    return Worker(broker.url, **kwargs)


async def test_a_hung_async_handler_is_cancelled_and_its_job_retried_until_dead(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = make_worker(broker)
    never = asyncio.Event()
    cancelled: list[int] = []

    @worker.handler("hang", timeout_s=0.2)
    async def hang(job: Job) -> None:
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.append(job.attempt)
            raise

    job_id = await client.enqueue("hang", None, max_attempts=2, backoff_base_s=0)
    async with running(worker, probe):
        retries = await probe.count("retry", 2, job_id)
    assert [r.fields["error"] for r in retries] == [ERROR.format("0.2")] * 2
    assert cancelled == [1, 2]
    info = await client.get_job(job_id)
    assert info is not None and info.state == "dead" and info.attempts == 2
    assert info.last_error == ERROR.format("0.2")


async def test_a_handler_that_ignores_its_cancellation_is_not_waited_for(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = make_worker(broker)
    release = asyncio.Event()
    ended = asyncio.Event()

    @worker.handler("stubborn", timeout_s=0.1)
    async def stubborn(job: Job) -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # swallowed: it runs on
        ended.set()

    job_id = await client.enqueue("stubborn", None, max_attempts=1)
    async with running(worker, probe):
        retry = await probe.report("retry", job_id)
        assert retry.result == {"landed": True}
        assert not ended.is_set()  # reported while the handler still ran
        release.set()
        await asyncio.wait_for(ended.wait(), WAIT)


async def test_a_hung_thread_is_left_running_and_its_job_retried(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = make_worker(broker, timeouts={"blocked": 0.2})
    release = threading.Event()
    finished = threading.Event()

    @worker.handler("blocked")
    def blocked(job: Job) -> None:
        release.wait(WAIT)
        finished.set()

    job_id = await client.enqueue("blocked", None, max_attempts=1)
    try:
        async with running(worker, probe):
            retry = await probe.report("retry", job_id)
            assert retry.fields["error"] == ERROR.format("0.2")
            assert not finished.is_set()  # the thread runs on in the background
            # Its lease is no longer heartbeaten: the last beat (if any) came before it.
            beats = [h for h in probe.log if h.op == "heartbeat_batch"]
            assert all(h.at <= retry.at for h in beats)
    finally:
        release.set()
    assert await asyncio.to_thread(finished.wait, WAIT)


async def test_the_job_limit_wins_over_the_handlers_which_wins_over_the_queues(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = make_worker(broker, timeouts={"a": 0.1, "b": 30.0}, prefetch=4)
    never = asyncio.Event()

    @worker.handler("a", timeout_s=0.3)  # the handler's limit, not the queue's
    async def a(job: Job) -> None:
        await never.wait()

    @worker.handler("b")  # the queue's limit: 30 s, so only a job's own ends it
    async def b(job: Job) -> None:
        await never.wait()

    on_a = await client.enqueue("a", None, max_attempts=1)
    on_b = await client.enqueue("b", None, max_attempts=1, timeout_s=0.2)
    async with running(worker, probe):
        a_retry = await probe.report("retry", on_a)
        b_retry = await probe.report("retry", on_b)
    assert a_retry.fields["error"] == ERROR.format("0.3")
    assert b_retry.fields["error"] == ERROR.format("0.2")
    info = await client.get_job(on_b)
    assert info is not None and info.timeout_s == 0.2


async def test_without_a_limit_a_slow_handler_keeps_its_lease(
    broker: Broker, client: Client, probe: Probe
) -> None:
    """No limit anywhere: the heartbeats hold the lease past its visibility timeout."""
    worker = make_worker(broker)
    release = asyncio.Event()

    @worker.handler("slow")
    async def slow(job: Job) -> None:
        await release.wait()

    job_id = await client.enqueue("slow", None, visibility_timeout_s=0.3)
    async with running(worker, probe):
        await probe.wait_for(lambda: len(probe.beats(job_id)) >= 3)  # > 0.3 s in all
        assert all(probe.beats(job_id))
        release.set()
        ack = await probe.report("ack", job_id)
    assert ack.result == {"landed": True}
    assert probe.handled("retry", job_id) == []


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), True, "3"])
def test_a_bad_limit_is_refused_naming_it(bad: Any) -> None:
    worker = Worker()
    with pytest.raises(InvalidArgument, match=r"^timeout_s: must be a finite number > 0"):
        worker.handler("q", timeout_s=bad)
    with pytest.raises(InvalidArgument, match=r"^timeouts\['q'\]: must be a finite number > 0"):
        Worker(timeouts={"q": bad})
