"""What a ``Worker`` logs through ``logging``: its connections and each job's end."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from conveyor import __version__
from conveyor.broker.server import Broker
from conveyor.sdk import Client, Fail, Job, Retry, Worker

from .conftest import WAIT, Probe, Proxy, running


class _Wake(logging.Handler):
    """Sets an event at each record (the worker logs on the event loop's thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.event.set()


async def logged(predicate: Callable[[], object]) -> None:
    """Wait until ``predicate()`` holds, looking again at each log record of the worker;
    for at most WAIT seconds."""
    wake = _Wake()
    logger = logging.getLogger("conveyor.worker")
    logger.addHandler(wake)
    try:
        async with asyncio.timeout(WAIT):
            while not predicate():
                wake.event.clear()
                await wake.event.wait()
    finally:
        logger.removeHandler(wake)


def lines(caplog: pytest.LogCaptureFixture, name: str) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == name]


async def test_each_jobs_end_is_one_line_at_its_level(
    broker: Broker, client: Client, probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="conveyor.worker")
    worker = Worker(broker.url, queues=["log"], worker_id="w-log", shutdown_timeout_s=1.0)

    @worker.handler("log")
    async def handle(job: Job) -> None:
        kind = job.payload
        if kind == "retry":
            raise Retry(error="not yet")
        if kind == "fail":
            raise Fail("bad input")
        if kind == "boom":
            raise ValueError("boom")

    ok = await client.enqueue("log", "ok")
    retried = await client.enqueue("log", "retry", max_attempts=2)
    failed = await client.enqueue("log", "fail")
    boom = await client.enqueue("log", "boom", max_attempts=1)
    async with running(worker, probe):
        await probe.report("ack", ok)
        await probe.report("retry", retried)
        await probe.report("fail", failed)
        await probe.report("retry", boom)
    logged = lines(caplog, "conveyor.worker.jobs")
    by_job = {job_id: [(lvl, m) for lvl, m in logged if m.startswith(f"job {job_id} ")]
              for job_id in (ok, retried, failed, boom)}  # fmt: skip
    assert all(len(found) == 1 for found in by_job.values()), logged
    [(level, message)] = by_job[ok]
    assert level == logging.INFO and message.startswith(f"job {ok} log ok in ")
    assert message.endswith(" ms")
    [(level, message)] = by_job[retried]
    assert level == logging.INFO
    assert message.startswith(f"job {retried} log retry (attempt 1/2) in ")
    assert message.endswith(": not yet")
    [(level, message)] = by_job[failed]
    assert level == logging.WARNING
    assert message.startswith(f"job {failed} log failed in ")
    assert message.endswith(" (dead-lettered): bad input")
    [(level, message)] = by_job[boom]
    assert level == logging.ERROR
    assert message.startswith(f"job {boom} log dead after 1 attempts, the last in ")
    assert message.endswith(": ValueError: boom")
    [record] = [r for r in caplog.records if r.getMessage().startswith(f"job {boom} ")]
    assert record.exc_info is not None and record.exc_info[0] is ValueError  # the traceback
    connected = f"worker w-log connected to {broker.url} (conveyor {__version__})"
    assert (logging.INFO, f"{connected}; queues log; prefetch 16") in lines(
        caplog, "conveyor.worker"
    )


async def test_with_info_off_only_warnings_and_errors_are_logged(
    broker: Broker, client: Client, probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="conveyor.worker")
    worker = Worker(broker.url, queues=["quiet"], shutdown_timeout_s=1.0)

    @worker.handler("quiet")
    async def handle(job: Job) -> None:
        if job.payload == "fail":
            raise Fail("no")

    ok = await client.enqueue("quiet", "ok")
    failed = await client.enqueue("quiet", "fail")
    async with running(worker, probe):
        await probe.report("ack", ok)
        await probe.report("fail", failed)
    # No duration is measured with INFO off: the Fail's line says none.
    assert lines(caplog, "conveyor.worker.jobs") == [
        (logging.WARNING, f"job {failed} quiet failed (dead-lettered): no")
    ]
    assert lines(caplog, "conveyor.worker") == []


async def test_a_reconnect_is_logged_again(
    proxy: Proxy, probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="conveyor.worker")
    worker = Worker(proxy.url, queues=["again"], worker_id="w-again", prefetch=2)

    @worker.handler("again")
    async def handle(job: Job) -> None:
        pass

    async with running(worker, probe):
        await logged(lambda: lines(caplog, "conveyor.worker"))  # (the reply came)
        proxy.cut()
        await logged(lambda: len(lines(caplog, "conveyor.worker")) >= 2)
    first, second = lines(caplog, "conveyor.worker")[:2]
    expected = f"{proxy.url} (conveyor {__version__}); queues again; prefetch 2"
    assert first == (logging.INFO, f"worker w-again connected to {expected}")
    assert second == (logging.INFO, f"worker w-again reconnected to {expected}")
