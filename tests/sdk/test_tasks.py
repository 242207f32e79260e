"""Tasks: ``@worker.task(queue)`` functions, enqueued by calling ``.enqueue`` with their
arguments, run by the worker with the payload as keywords."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.broker.server import Broker
from conveyor.sdk import Client, Job, SyncClient, Task, Worker

from .conftest import ROOT, WAIT, Probe, running


@pytest.fixture
async def worker(broker: Broker) -> AsyncIterator[Worker]:
    made = Worker(broker.url, shutdown_timeout_s=1.0)
    try:
        yield made
    finally:
        await asyncio.to_thread(made.close_tasks_client)


async def test_a_task_is_enqueued_with_its_arguments_and_run_with_them(
    worker: Worker, client: Client, probe: Probe
) -> None:
    calls: list[tuple[str, str]] = []

    @worker.task("emails")
    async def send_email(to: str, subject: str = "hi") -> None:
        calls.append((to, subject))

    assert isinstance(send_email, Task) and send_email.queue == "emails"
    assert worker.queues == ["emails"]
    first = await send_email.enqueue(to="a@b.c")
    second = await send_email.enqueue("d@e.f", subject="yo")  # positional too, by name
    info = await client.get_job(first)
    assert info is not None and info.payload == {"to": "a@b.c"}  # the defaults: the worker's
    info = await client.get_job(second)
    assert info is not None and info.payload == {"to": "d@e.f", "subject": "yo"}
    async with running(worker, probe):
        await probe.count("ack", 2)
    assert sorted(calls) == [("a@b.c", "hi"), ("d@e.f", "yo")]


async def test_a_function_whose_first_parameter_is_job_gets_the_job(
    worker: Worker, probe: Probe
) -> None:
    seen: list[tuple[str, int, int]] = []

    @worker.task("sums")
    async def add(job: Job, a: int, b: int = 1) -> None:
        seen.append((job.id, job.attempt, a + b))

    job_id = await add.enqueue(a=2)
    async with running(worker, probe):
        await probe.report("ack", job_id)
    assert seen == [(job_id, 1, 3)]
    with pytest.raises(TypeError, match="job"):
        await add.enqueue(a=1, job=None)  # type: ignore[call-arg]


async def test_a_plain_function_runs_in_a_thread_and_enqueues_blocking(
    worker: Worker, probe: Probe
) -> None:
    threads: list[str] = []

    @worker.task("sync-work", timeout_s=5.0)
    def crunch(n: int) -> int:
        threads.append(threading.current_thread().name)
        return n * 2

    job_id = await asyncio.to_thread(crunch.enqueue_sync, n=21)
    async with running(worker, probe):
        await probe.report("ack", job_id)
    assert len(threads) == 1 and threads[0] != threading.main_thread().name


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "send_email(): missing a required argument: 'to'"),
        ((), {"to": "x", "cc": "y"}, "send_email(): got an unexpected keyword argument 'cc'"),
        (("x", "y", "z"), {}, "send_email(): too many positional arguments"),
    ],
)
async def test_arguments_that_do_not_fit_the_signature_raise_before_anything_is_sent(
    worker: Worker, probe: Probe, args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    @worker.task("emails")
    async def send_email(to: str, subject: str = "hi") -> None: ...

    with pytest.raises(TypeError) as refused:
        await send_email.enqueue(*args, **kwargs)
    assert str(refused.value) == message
    assert worker._publisher is None  # not even connected
    assert probe.handled("enqueue") == []


async def test_options_bind_a_client_and_the_per_job_options(
    worker: Worker, client: Client, probe: Probe
) -> None:
    @worker.task("reports")
    async def build(month: int) -> None: ...

    call = build.options(client=client, delay_s=60.0, priority=4, key="k-3", timeout_s=9.0)
    job_id = await call.enqueue(month=3)
    assert await call.enqueue(month=3) == job_id  # the key: stored once
    info = await client.get_job(job_id)
    assert info is not None
    assert (info.payload, info.priority, info.key, info.timeout_s) == ({"month": 3}, 4, "k-3", 9.0)
    assert info.ready_at == pytest.approx(info.enqueued_at + 60.0)
    assert worker._publisher is None  # the shared client was never needed
    with pytest.raises(TypeError, match="enqueue_sync"):
        await build.options(client=SyncClient(client.urls)).enqueue(month=1)


async def test_a_payload_the_function_cannot_take_fails_the_job(
    worker: Worker, client: Client, probe: Probe
) -> None:
    @worker.task("strict")
    async def strict(n: int) -> None: ...

    not_object = await client.enqueue("strict", [1, 2])
    unknown = await client.enqueue("strict", {"n": 1, "extra": True})
    async with running(worker, probe):
        first = await probe.report("fail", not_object)
        second = await probe.report("fail", unknown)
    assert first.fields["error"] == (
        "strict: the payload must be an object of keyword arguments, got list"
    )
    assert second.fields["error"] == "strict(): got an unexpected keyword argument 'extra'"


def test_mypy_sees_the_tasks_call_signature(tmp_path: Path) -> None:
    source = tmp_path / "uses_tasks.py"
    source.write_text(
        textwrap.dedent(
            """
            from conveyor import Job, Worker

            worker = Worker()


            @worker.task("emails")
            async def send_email(to: str, subject: str = "hi") -> None: ...


            @worker.task("sums")
            def add(job: Job, a: int) -> int:
                return a


            async def publish() -> None:
                await send_email.enqueue(to="a@b.c")
                await send_email.enqueue(to=1)
                await send_email.enqueue(subject="no to")
                await add.enqueue(a=1)
                add.enqueue_sync(a="one")
                await send_email.options(delay_s=5).enqueue(to="x", cc="y")
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(source)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    errors = [
        line.split(": error: ")[1] for line in done.stdout.splitlines() if ": error: " in line
    ]
    lines = [int(line.split(":")[1]) for line in done.stdout.splitlines() if ": error: " in line]
    assert lines == [18, 19, 21, 22], done.stdout
    assert 'Argument "to" to "enqueue" of "Task" has incompatible type "int"' in errors[0]
    assert 'Missing positional argument "to"' in errors[1]
    assert 'Argument "a" to "enqueue_sync" of "Task"' in errors[2]
    assert 'Unexpected keyword argument "cc"' in errors[3]


async def test_enqueue_waits_for_nothing_of_the_loop_it_is_called_from(
    worker: Worker, client: Client
) -> None:
    """The shared client runs on its own thread: enqueues from several event loops (this
    one, and one in another thread) go through the one connection."""

    @worker.task("anywhere")
    async def note(n: int) -> None: ...

    here = await note.enqueue(n=1)
    there = await asyncio.to_thread(asyncio.run, note.enqueue(n=2))
    assert here != there
    for job_id, n in ((here, 1), (there, 2)):
        info = await client.get_job(job_id)
        assert info is not None and info.payload == {"n": n}
    assert await asyncio.wait_for(asyncio.to_thread(lambda: worker._publisher), WAIT)
