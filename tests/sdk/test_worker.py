"""``Worker``: each handler outcome, heartbeats, cancel, graceful shutdown, refusals."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

import anyio
import pytest
from websockets.protocol import State

from conveyor.broker.engine import QueueOpts
from conveyor.broker.server import Broker
from conveyor.sdk import Client, Fail, Forbidden, InvalidArgument, Job, Retry, Unauthorized, Worker
from conveyor.sdk._wire import Role

from .conftest import WAIT, Probe, running, with_config


def make_worker(broker: Broker, queue: str, **kwargs: Any) -> Worker:
    kwargs.setdefault("shutdown_timeout_s", 1.0)
    return Worker(broker.url, queues=[queue], **kwargs)


async def test_handlers_that_end_together_are_acked_in_one_frame(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = make_worker(broker, "burst", prefetch=20)

    @worker.handler("burst")
    async def handle(job: Job) -> None:
        pass

    ids = await client.enqueue_many("burst", list(range(20)))
    async with running(worker, probe):
        await probe.count("ack", 20)
    acks = probe.handled("ack")
    assert sorted(h.id for h in acks) == sorted(ids)
    assert all(h.result == {"landed": True} for h in acks)
    # Twenty jobs pushed together end together: their acks share frames.
    frames = [h for h in probe.log if h.op in ("ack", "ack_batch")]
    assert len(frames) < 20 and all(h.op == "ack_batch" for h in frames)


async def test_acks_go_out_at_half_the_prefetch_while_the_rest_still_end(
    broker: Broker, client: Client, probe: Probe
) -> None:
    """Handlers that end in one loop iteration send their acks as soon as half the
    prefetch is waiting, not all at the iteration's end: the broker then refills that half
    of the window while the worker ends the rest. (With one ack frame for the whole
    window, worker and broker took turns, each idle while the other worked.)"""
    worker = make_worker(broker, "halves", prefetch=8)
    started: list[str] = []
    release = asyncio.Event()

    @worker.handler("halves")
    async def handle(job: Job) -> None:
        started.append(job.id)
        probe.poke()
        await release.wait()  # all eight wake, and end, in one iteration

    ids = await client.enqueue_many("halves", list(range(8)))
    async with running(worker, probe):
        await probe.wait_for(lambda: len(started) == 8)
        release.set()
        await probe.count("ack", 8)
    assert sorted(h.id for h in probe.handled("ack")) == sorted(ids)
    assert all(h.result == {"landed": True} for h in probe.handled("ack"))
    frames = [h for h in probe.log if h.op == "ack_batch"]
    assert [len(h.fields["items"]) for h in frames] == [4, 4]


@with_config(max_batch=4)
async def test_acks_that_end_together_are_split_at_the_brokers_max_batch(
    broker: Broker, client: Client, probe: Probe
) -> None:
    worker = make_worker(broker, "small", prefetch=10)

    @worker.handler("small")
    async def handle(job: Job) -> None:
        pass

    ids = [
        job_id
        for i in range(0, 10, 4)
        for job_id in await client.enqueue_many("small", list(range(i, min(10, i + 4))))
    ]
    async with running(worker, probe):
        await probe.count("ack", 10)
    assert sorted(h.id for h in probe.handled("ack")) == sorted(ids)
    assert all(h.result == {"landed": True} for h in probe.handled("ack"))
    # Never more than the broker's max_batch in one frame (it would refuse the frame).
    assert all(len(h.fields["items"]) <= 4 for h in probe.log if h.op == "ack_batch")


async def test_a_handler_that_returns_acks_the_job(
    broker: Broker, client: Client, probe: Probe
) -> None:
    seen: list[Job] = []
    worker = make_worker(broker, "ok")

    @worker.handler("ok")
    async def handle(job: Job) -> None:
        seen.append(job)

    async with running(worker, probe):
        job_id = await client.enqueue("ok", {"to": "a@b.c"}, priority=2, max_attempts=5)
        ack = await probe.report("ack", job_id)
    assert ack.result == {"landed": True}
    assert await client.get_job(job_id) is None
    [job] = seen
    assert (job.id, job.queue, job.payload) == (job_id, "ok", {"to": "a@b.c"})
    assert (job.attempt, job.max_attempts, job.priority) == (1, 5, 2)
    assert job.deadline > time.time()
    assert worker.handled == 1


async def test_a_handler_extends_its_lease_with_job_heartbeat(
    broker: Broker, client: Client, probe: Probe
) -> None:
    answers: list[bool] = []
    worker = make_worker(broker, "beat")

    @worker.handler("beat")
    async def handle(job: Job) -> None:
        answers.append(await job.heartbeat())

    async with running(worker, probe):
        job_id = await client.enqueue("beat", None, visibility_timeout_s=30.0)
        await probe.report("ack", job_id)
    assert answers == [True]
    [beat] = probe.handled("heartbeat", job_id)
    assert beat.result == {"landed": True}
    assert beat.fields["lease"] == probe.handled("ack", job_id)[0].fields["lease"]


async def test_a_job_made_by_hand_runs_a_handler_with_no_worker() -> None:
    """A handler can be tested on a ``Job`` made by hand: it has no lease to extend, no
    one to tell its progress, and no dependencies' results to read."""
    job = Job("j1", "mail", {"to": "a@b.c"}, 1, 3, time.time() + 60, "lease", 0, 60.0,
              dependencies=2)  # fmt: skip
    assert await job.heartbeat() is False
    await job.progress(0.5, "half")
    assert await job.dependency_results() == {}


@pytest.mark.parametrize("last", ["plain", "async"])
async def test_the_handler_registered_last_for_a_queue_is_the_one_that_runs(
    broker: Broker, client: Client, probe: Probe, last: str
) -> None:
    # The worker sorts handlers into async and plain once, at registration: registering
    # another kind for the same queue must replace the first, not run beside it.
    ran: list[str] = []
    worker = make_worker(broker, "swap")

    async def asynchronous(job: Job) -> None:
        ran.append(f"async on {threading.current_thread() is threading.main_thread()}")

    def plain(job: Job) -> None:
        ran.append(f"plain on {threading.current_thread() is threading.main_thread()}")

    first, then = (asynchronous, plain) if last == "plain" else (plain, asynchronous)
    worker.handler("swap")(first)
    worker.handler("swap")(then)
    async with running(worker, probe):
        job_id = await client.enqueue("swap", 1)
        ack = await probe.report("ack", job_id)
    assert ack.result == {"landed": True}
    # A plain handler runs on a worker thread, an async one on the loop's thread.
    assert ran == (["plain on False"] if last == "plain" else ["async on True"])


async def test_retry_with_a_delay_runs_attempt_two_after_it(
    broker: Broker, client: Client, probe: Probe
) -> None:
    starts: list[tuple[int, float]] = []
    second = asyncio.Event()
    release = asyncio.Event()
    worker = make_worker(broker, "later")

    @worker.handler("later")
    async def handle(job: Job) -> None:
        starts.append((job.attempt, time.monotonic()))
        if job.attempt == 1:
            raise Retry(delay_s=0.3, error="not yet")
        second.set()
        await release.wait()

    async with running(worker, probe):
        job_id = await client.enqueue("later", {})
        retry = await probe.report("retry", job_id)
        assert retry.fields["delay_s"] == 0.3
        assert retry.result == {"landed": True}
        await asyncio.wait_for(second.wait(), WAIT)
        info = await client.get_job(job_id)
        assert info is not None
        assert (info.state, info.attempts, info.last_error) == ("processing", 2, "not yet")
        release.set()
        await probe.report("ack", job_id)
    assert [attempt for attempt, _ in starts] == [1, 2]
    assert starts[1][1] - retry.at >= 0.25


@with_config(queue_opts={"curve": QueueOpts(backoff_base_s=0.05)})
async def test_retry_without_a_delay_follows_the_queue_backoff(
    broker: Broker, client: Client, probe: Probe
) -> None:
    starts: list[tuple[int, float]] = []
    worker = make_worker(broker, "curve")

    @worker.handler("curve")
    async def handle(job: Job) -> None:
        starts.append((job.attempt, time.monotonic()))
        if job.attempt == 1:
            raise Retry()

    async with running(worker, probe):
        job_id = await client.enqueue("curve", {})
        info = await client.get_job(job_id)
        assert info is not None and info.backoff_base_s == 0.05
        retry = await probe.report("retry", job_id)
        assert retry.fields["delay_s"] is None  # the broker's curve decides
        await probe.report("ack", job_id)
    assert [attempt for attempt, _ in starts] == [1, 2]
    # Equal jitter on a 0.05 s base: the first retry waits 0.025 to 0.05 s.
    assert starts[1][1] - retry.at >= 0.02


@pytest.mark.parametrize("delay_s", [float("inf"), float("nan"), -1.0, True, "5"])
async def test_a_retry_with_a_bad_delay_retries_on_the_curve_with_the_error_said(
    broker: Broker, client: Client, probe: Probe, delay_s: Any
) -> None:
    worker = make_worker(broker, "baddelay")

    @worker.handler("baddelay")
    async def handle(job: Job) -> None:
        if job.attempt == 1:
            raise Retry(delay_s=delay_s)

    async with running(worker, probe):
        job_id = await client.enqueue("baddelay", {}, backoff_base_s=0.01)
        retry = await probe.report("retry", job_id)
        # Not "no delay given", which an infinity would have become on the wire.
        assert "delay_s" not in retry.fields or retry.fields["delay_s"] is None
        assert retry.fields["error"].startswith("InvalidArgument: delay_s: must be a finite")
        assert (await probe.report("ack", job_id)).result == {"landed": True}


async def test_fail_dead_letters_the_job_at_once(
    broker: Broker, client: Client, probe: Probe
) -> None:
    attempts: list[int] = []
    worker = make_worker(broker, "fails")

    @worker.handler("fails")
    async def handle(job: Job) -> None:
        attempts.append(job.attempt)
        raise Fail("x")

    async with running(worker, probe):
        job_id = await client.enqueue("fails", {}, max_attempts=5)
        fail = await probe.report("fail", job_id)
    assert fail.result == {"landed": True}
    assert attempts == [1]
    info = await client.get_job(job_id)
    assert info is not None
    assert (info.state, info.last_error, info.attempts) == ("dead", "x", 1)
    assert info.died_at is not None


async def test_any_other_exception_retries_with_its_type_and_message(
    broker: Broker, client: Client, probe: Probe
) -> None:
    second = asyncio.Event()
    release = asyncio.Event()
    worker = make_worker(broker, "boom")

    @worker.handler("boom")
    async def handle(job: Job) -> None:
        if job.attempt == 1:
            raise ValueError("boom")
        second.set()
        await release.wait()

    async with running(worker, probe):
        job_id = await client.enqueue("boom", {}, backoff_base_s=0.01)
        retry = await probe.report("retry", job_id)
        assert retry.fields["error"] == "ValueError: boom"
        await asyncio.wait_for(second.wait(), WAIT)
        info = await client.get_job(job_id)
        assert info is not None
        assert (info.state, info.attempts) == ("processing", 2)
        assert info.last_error == "ValueError: boom"
        assert info.worker_id == worker.worker_id
        release.set()
        assert (await probe.report("ack", job_id)).result == {"landed": True}


async def test_a_plain_handler_blocking_past_its_lease_is_heartbeaten_in_a_thread(
    broker: Broker, client: Client, probe: Probe
) -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []
    release = threading.Event()
    blocked_for: list[float] = []
    worker = make_worker(broker, "sync")

    @worker.handler("sync")
    def handle(job: Job) -> None:  # plain def: a blocking handler
        threads.append(threading.get_ident())
        started = time.monotonic()
        release.wait(WAIT)  # blocks its thread, like time.sleep or a blocking client would
        blocked_for.append(time.monotonic() - started)

    try:
        async with running(worker, probe):
            job_id = await client.enqueue("sync", {}, visibility_timeout_s=0.3)
            # Four heartbeats, each a third of the lease apart: past the first deadline.
            await probe.wait_for(lambda: sum(probe.beats(job_id)) >= 4)
            release.set()
            ack = await probe.report("ack", job_id)
    finally:
        release.set()
    assert ack.result == {"landed": True}
    assert threads and threads[0] != loop_thread
    assert len(threads) == 1  # attempt 1 only: the lease never lapsed
    assert blocked_for[0] > 0.3
    assert await client.get_job(job_id) is None


async def test_heartbeats_keep_a_long_job_alive_past_its_visibility_timeout(
    broker: Broker, client: Client, probe: Probe
) -> None:
    calls: list[Job] = []
    started = asyncio.Event()
    release = asyncio.Event()
    worker = make_worker(broker, "long")

    @worker.handler("long")
    async def handle(job: Job) -> None:
        calls.append(job)
        started.set()
        await release.wait()

    async with running(worker, probe):
        job_id = await client.enqueue("long", {}, visibility_timeout_s=0.5)
        await asyncio.wait_for(started.wait(), WAIT)
        began = time.monotonic()
        # Nine heartbeats a sixth of a second apart: the job runs about 1.5 s, three leases.
        beats = await probe.wait_for(lambda: len(probe.beats(job_id)) >= 9 and probe.beats(job_id))
        assert all(beats)
        assert time.monotonic() - began >= 1.0
        info = await client.get_job(job_id)
        assert info is not None and info.deadline is not None
        assert info.deadline > calls[0].deadline + 0.9  # the lease was extended
        release.set()
        ack = await probe.report("ack", job_id)
    assert ack.result == {"landed": True}
    assert len(calls) == 1 and calls[0].attempt == 1
    assert (await client.stats("long"))["long"]["totals"]["completed"] == 1


async def test_cancel_reaches_the_running_handler(
    broker: Broker, client: Client, probe: Probe
) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()
    finished = asyncio.Event()
    done: list[Any] = []
    worker = make_worker(broker, "cancel", prefetch=1)

    @worker.handler("cancel")
    async def handle(job: Job) -> None:
        if job.payload == "next":
            done.append(job.payload)
            return
        started.set()
        try:
            await asyncio.Event().wait()  # never set: only a cancel ends this
        except asyncio.CancelledError:
            cancelled.set()
            raise
        finally:
            finished.set()

    async with running(worker, probe):
        job_id = await client.enqueue("cancel", "long")
        await asyncio.wait_for(started.wait(), WAIT)
        assert await client.cancel(job_id) is True
        await asyncio.wait_for(cancelled.wait(), WAIT)
        assert finished.is_set()
        # Its prefetch slot (the only one) is free again: the next job runs.
        following = await client.enqueue("cancel", "next")
        await probe.report("ack", following)
    assert done == ["next"]
    assert await client.get_job(job_id) is None
    assert not [h for op in ("ack", "retry", "fail") for h in probe.handled(op, job_id)]


async def test_a_job_after_a_cancelled_one_finds_its_task_uncancelled(
    broker: Broker, client: Client, probe: Probe
) -> None:
    """A job that follows a cancelled one on the same worker runs as in a fresh task: no
    cancel request left pending, and its own timeouts and cancel scopes act as usual."""
    started = asyncio.Event()
    seen: list[Any] = []
    worker = make_worker(broker, "after-cancel", prefetch=1)

    @worker.handler("after-cancel")
    async def handle(job: Job) -> None:
        if job.payload == "long":
            started.set()
            await asyncio.Event().wait()  # never set: only a cancel ends this
        task = asyncio.current_task()
        assert task is not None
        seen.append(task.cancelling())
        try:
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()
        except TimeoutError:
            seen.append("asyncio timeout")
        with anyio.move_on_after(0.01) as scope:
            await asyncio.Event().wait()
        seen.append(scope.cancelled_caught)
        seen.append(task.cancelling())

    async with running(worker, probe):
        job_id = await client.enqueue("after-cancel", "long")
        await asyncio.wait_for(started.wait(), WAIT)
        assert await client.cancel(job_id) is True
        following = await client.enqueue("after-cancel", "next")
        await probe.report("ack", following)
    assert seen == [0, "asyncio timeout", True, 0]


async def test_a_context_variable_set_by_a_handler_is_not_seen_by_the_next_job(
    broker: Broker, client: Client, probe: Probe
) -> None:
    """Each job starts from the worker's context, as a task of its own would: what one
    handler sets in a ``ContextVar`` does not leak into the jobs after it."""
    var: contextvars.ContextVar[Any] = contextvars.ContextVar("request_id", default=None)
    seen: list[Any] = []
    worker = make_worker(broker, "context", prefetch=1)

    @worker.handler("context")
    async def handle(job: Job) -> None:
        seen.append(var.get())
        var.set(job.payload)

    async with running(worker, probe):
        for payload in ("a", "b", "c"):
            job_id = await client.enqueue("context", payload)
            await probe.report("ack", job_id)
    assert seen == [None, None, None]


async def test_stop_finishes_the_running_job_and_takes_no_new_one(
    broker: Broker, client: Client, probe: Probe
) -> None:
    handled: list[str] = []
    started = asyncio.Event()
    release = asyncio.Event()
    worker = make_worker(broker, "drain", prefetch=4, shutdown_timeout_s=WAIT)

    @worker.handler("drain")
    async def handle(job: Job) -> None:
        handled.append(job.payload)
        started.set()
        await release.wait()

    async with running(worker, probe) as task:
        first = await client.enqueue("drain", "first")
        await asyncio.wait_for(started.wait(), WAIT)
        worker.stop()
        await probe.report("unsubscribe", None)
        second = await client.enqueue("drain", "second")
        assert not task.done()  # the running handler holds the shutdown
        release.set()
        await asyncio.wait_for(task, WAIT)  # run() returns
        assert task.result() is None
    assert handled == ["first"]
    assert (await probe.report("ack", first)).result == {"landed": True}
    assert await client.get_job(first) is None
    info = await client.get_job(second)
    assert info is not None and (info.state, info.attempts) == ("ready", 0)


async def test_a_handler_past_the_shutdown_timeout_is_cancelled_and_its_job_lapses(
    broker: Broker, client: Client, probe: Probe
) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()
    worker = make_worker(broker, "stuck", shutdown_timeout_s=0.3)

    @worker.handler("stuck")
    async def handle(job: Job) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    async with running(worker, probe) as task:
        job_id = await client.enqueue("stuck", {})
        await asyncio.wait_for(started.wait(), WAIT)
        stopped_at = time.monotonic()
        worker.stop()
        await asyncio.wait_for(task, WAIT)
        assert time.monotonic() - stopped_at >= 0.3  # it waited for the handler first
        # run() returned with nothing of its own left running.
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "conveyor-job"]
    assert cancelled.is_set()
    assert not [h for op in ("ack", "retry", "fail") for h in probe.handled(op, job_id)]

    # The job went back to the broker (grace 0 here): the next worker gets attempt 2.
    attempts: list[int] = []
    again = make_worker(broker, "stuck")

    @again.handler("stuck")
    async def handle_again(job: Job) -> None:
        attempts.append(job.attempt)

    async with running(again, probe):
        await probe.report("ack", job_id)
    assert attempts == [2]


# -- refusals ---------------------------------------------------------------------------------


async def test_run_without_a_handler_is_invalid_argument(broker: Broker) -> None:
    worker = Worker(broker.url, queues=["nobody"])
    with pytest.raises(InvalidArgument) as caught:
        await asyncio.wait_for(worker.run(), WAIT)
    assert caught.value.field == "queues"
    with pytest.raises(InvalidArgument):
        Worker(broker.url, prefetch=0)


WORK_TOKENS = {"pub": frozenset({Role.PUBLISH}), "work": frozenset({Role.WORK})}


@with_config(tokens=WORK_TOKENS)
async def test_a_worker_with_a_wrong_token_raises_unauthorized(broker: Broker) -> None:
    worker = make_worker(broker, "q", token="wrong")
    worker.handler("q")(lambda job: None)
    with pytest.raises(Unauthorized):
        await asyncio.wait_for(worker.run(), WAIT)


@with_config(tokens=WORK_TOKENS)
async def test_a_worker_whose_token_lacks_the_work_role_raises_forbidden(broker: Broker) -> None:
    worker = make_worker(broker, "q", token="pub")
    worker.handler("q")(lambda job: None)
    with pytest.raises(Forbidden):
        await asyncio.wait_for(worker.run(), WAIT)


async def test_a_worker_with_a_bad_queue_name_raises_invalid_argument(broker: Broker) -> None:
    worker = make_worker(broker, "not a queue name")
    worker.handler("not a queue name")(lambda job: None)
    with pytest.raises(InvalidArgument) as caught:
        await asyncio.wait_for(worker.run(), WAIT)
    assert caught.value.field == "queues[0]"


async def test_run_returns_only_once_its_connection_is_closed(
    broker: Broker, client: Client, probe: Probe
) -> None:
    # A process may exit as soon as run() returns: nothing of the worker's connection
    # may be left open for the broker to time out.
    worker = make_worker(broker, "exit")

    @worker.handler("exit")
    async def handle(job: Job) -> None:
        pass

    async with running(worker, probe) as task:
        (ours,) = [c.ws for c in broker.connections if c.client == worker.name]
        # What the broker's end of the connection is when run() has just returned.
        at_return: list[State] = []
        task.add_done_callback(lambda _: at_return.append(ours.state))
        worker.stop()
        await asyncio.wait_for(asyncio.shield(task), WAIT)
    assert at_return == [State.CLOSED]
