"""``Client``: every call against a real broker, and the errors a caller can catch."""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import pytest

from conveyor.broker.server import Broker
from conveyor.sdk import (
    Client,
    ConnectionFailed,
    ConveyorError,
    Fail,
    Forbidden,
    InvalidArgument,
    Job,
    JobInfo,
    NotFound,
    TooLarge,
    Unauthorized,
    Worker,
)
from conveyor.sdk._wire import Role

from .conftest import WAIT, Probe, free_port, running, with_config


async def test_enqueue_with_every_option_shows_in_get_job(client: Client) -> None:
    before = time.time()
    job_id = await client.enqueue(
        "emails",
        {"to": "a@b.c", "n": [1, 2.5, None, True]},
        priority=7,
        visibility_timeout_s=42.0,
        max_attempts=4,
        backoff_base_s=0.5,
        expires_s=100.0,
        key="order-1",
    )
    info = await client.get_job(job_id)

    assert isinstance(info, JobInfo)
    assert info.id == job_id
    assert info.queue == "emails"
    assert info.state == "ready"
    assert info.payload == {"to": "a@b.c", "n": [1, 2.5, None, True]}
    assert info.priority == 7
    assert info.attempts == 0
    assert info.max_attempts == 4
    assert info.visibility_timeout_s == 42.0
    assert info.backoff_base_s == 0.5
    assert info.backoff_max_s == 3600.0  # the queue's default
    assert before <= info.enqueued_at <= time.time()
    assert info.ready_at == pytest.approx(info.enqueued_at)
    assert info.expires_at == pytest.approx(info.enqueued_at + 100.0)
    assert info.key == "order-1"
    assert (info.worker_id, info.deadline, info.last_error, info.died_at) == (None,) * 4


async def test_defaults_come_from_the_queue(client: Client) -> None:
    info = await client.get_job(await client.enqueue("plain", None))
    assert info is not None
    assert info.payload is None
    assert (info.priority, info.max_attempts, info.visibility_timeout_s) == (0, 3, 300.0)
    assert info.expires_at is None


async def test_delay_and_run_at_schedule_the_job(client: Client) -> None:
    delayed = await client.get_job(await client.enqueue("later", 1, delay_s=60.0))
    assert delayed is not None
    assert delayed.ready_at == pytest.approx(delayed.enqueued_at + 60.0)

    at = time.time() + 120.0
    scheduled = await client.get_job(await client.enqueue("later", 2, run_at=at))
    assert scheduled is not None
    assert scheduled.ready_at == pytest.approx(at)

    both = await client.get_job(await client.enqueue("later", 3, delay_s=30.0, run_at=at))
    assert both is not None
    assert both.ready_at == pytest.approx(both.enqueued_at + 30.0)  # delay_s wins

    stats = (await client.stats("later"))["later"]
    assert (stats["ready"], stats["scheduled"]) == (0, 3)


async def test_the_same_key_stores_one_job(client: Client) -> None:
    first = await client.enqueue("keyed", {"v": 1}, key="k")
    again = await client.enqueue("keyed", {"v": 2}, key="k")
    assert again == first
    info = await client.get_job(first)
    assert info is not None and info.payload == {"v": 1}
    assert (await client.stats("keyed"))["keyed"]["totals"]["enqueued"] == 1


async def test_without_a_key_each_enqueue_is_a_new_job(client: Client) -> None:
    ids = [await client.enqueue("unkeyed", {"same": True}) for _ in range(3)]
    assert len(set(ids)) == 3
    info = await client.get_job(ids[0])
    assert info is not None and info.key  # the SDK made one, for safe resends
    assert (await client.stats("unkeyed"))["unkeyed"]["ready"] == 3


async def test_enqueue_many_returns_ids_in_order_with_the_options(client: Client) -> None:
    payloads = [{"i": i} for i in range(5)]
    ids = await client.enqueue_many("bulk", payloads, priority=3, max_attempts=9)
    assert len(ids) == 5 and len(set(ids)) == 5
    for job_id, payload in zip(ids, payloads, strict=True):
        info = await client.get_job(job_id)
        assert info is not None
        assert (info.payload, info.priority, info.max_attempts) == (payload, 3, 9)
    assert await client.enqueue_many("bulk", []) == []


async def test_enqueue_many_splits_past_the_broker_batch_limit(client: Client) -> None:
    ids = await client.enqueue_many("big", range(1001))
    assert len(set(ids)) == 1001
    last = await client.get_job(ids[-1])
    assert last is not None and last.payload == 1000
    assert (await client.stats("big"))["big"]["ready"] == 1001


async def test_cancel_deletes_the_job_once(client: Client) -> None:
    job_id = await client.enqueue("cancels", "x")
    assert await client.cancel(job_id) is True
    assert await client.get_job(job_id) is None
    assert await client.cancel(job_id) is False
    assert await client.get_job("no-such-job") is None
    assert (await client.stats("cancels"))["cancels"]["totals"]["cancelled"] == 1


async def test_stats_per_queue_as_plain_data(client: Client) -> None:
    ids = await client.enqueue_many("s1", [1, 2])
    await client.enqueue("s2", 3, delay_s=60.0)
    first = await client.get_job(ids[0])
    assert first is not None

    everything = await client.stats()
    assert set(everything) >= {"s1", "s2"}
    assert everything["s1"] == {
        "ready": 2,
        "scheduled": 0,
        "processing": 0,
        "dead": 0,
        "completed": 0,
        "waiting": 0,
        "paused": False,
        "oldest_ready_at": first.ready_at,
        "totals": {
            "enqueued": 2,
            "completed": 0,
            "retried": 0,
            "dead": 0,
            "expired": 0,
            "cancelled": 0,
        },
        "limited": 0,
        "partitions": 0,
        "backoff_until": None,
        "limits": {
            "concurrency": None,
            "rate": None,
            "per_s": 1.0,
            "burst": None,
            "partition_concurrency": None,
            "partition_rate": None,
            "partition_per_s": 1.0,
            "partition_burst": None,
        },
    }
    assert list(await client.stats("s2")) == ["s2"]
    assert (await client.stats("s2"))["s2"]["scheduled"] == 1
    assert (await client.stats("s2"))["s2"]["oldest_ready_at"] is None  # none ready
    with pytest.raises(NotFound):
        await client.stats("never-used")


async def test_pause_holds_jobs_back_until_resume(
    broker: Broker, client: Client, probe: Probe
) -> None:
    handled: list[str] = []
    got: dict[str, asyncio.Event] = {"first": asyncio.Event(), "second": asyncio.Event()}
    worker = Worker(broker.url, queues=["first", "second"], shutdown_timeout_s=1.0)

    @worker.handler("first")
    @worker.handler("second")
    async def handle(job: Job) -> None:
        handled.append(job.queue)
        got[job.queue].set()

    await client.pause("first")
    assert (await client.stats("first"))["first"]["paused"] is True
    async with running(worker, probe):
        held = await client.enqueue("first", "a")  # the earlier queue: would go first
        await client.enqueue("second", "b")
        await asyncio.wait_for(got["second"].wait(), WAIT)
        info = await client.get_job(held)
        assert info is not None and (info.state, info.attempts) == ("ready", 0)

        await client.resume("first")
        assert (await client.stats("first"))["first"]["paused"] is False
        await asyncio.wait_for(got["first"].wait(), WAIT)
    assert handled == ["second", "first"]


async def test_redrive_and_purge_dead(broker: Broker, client: Client, probe: Probe) -> None:
    attempts: list[int] = []
    worker = Worker(broker.url, queues=["doomed"], shutdown_timeout_s=1.0)

    @worker.handler("doomed")
    async def handle(job: Job) -> None:
        attempts.append(job.attempt)
        raise Fail("bad input")

    async with running(worker, probe):
        job_id = await client.enqueue("doomed", {})
        await probe.report("fail", job_id)
        info = await client.get_job(job_id)
        assert info is not None and info.state == "dead"

        assert await client.redrive(job_id) is True  # pending again, attempts reset
        await probe.wait_for(lambda: len(probe.handled("fail", job_id)) == 2)
        assert attempts == [1, 1]
        info = await client.get_job(job_id)
        assert info is not None and info.state == "dead"

        alive = await client.enqueue("doomed", {}, delay_s=60.0)
        assert await client.redrive(alive) is False  # not dead
        assert await client.purge_dead("doomed") == 1
        assert await client.get_job(job_id) is None
        assert await client.get_job(alive) is not None
        assert await client.purge_dead("doomed") == 0


async def test_server_info_is_the_hello_reply(client: Client) -> None:
    info = client.server_info
    assert info["server"] == "conveyor"
    assert set(info["roles"]) == {"admin", "publish", "work", "read"}


# -- errors -----------------------------------------------------------------------------------


async def test_bad_priority_is_invalid_argument_naming_the_field(client: Client) -> None:
    with pytest.raises(InvalidArgument) as caught:
        await client.enqueue("errs", {}, priority=2**31)
    assert caught.value.field == "priority"
    assert caught.value.code == "invalid_argument"
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, ConveyorError)

    with pytest.raises(ValueError):  # what a caller that knows nothing of Conveyor catches
        await client.enqueue("bad queue name!", {})
    with pytest.raises(InvalidArgument) as caught:
        await client.enqueue_many("errs", [1, 2], delay_s=-1.0)
    assert caught.value.field == "jobs[0].delay_s"
    stored = (await client.stats()).get("errs", {"totals": {"enqueued": 0}})
    assert stored["totals"]["enqueued"] == 0


async def test_payloads_json_cannot_hold_are_refused_before_sending(
    client: Client, probe: Probe
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        await client.enqueue("nan", float("nan"))
    assert caught.value.field == "payload"
    with pytest.raises(InvalidArgument) as caught:
        await client.enqueue_many("nan", [1, {"x": float("inf")}])
    assert caught.value.field == "jobs[1].payload"
    with pytest.raises(InvalidArgument):
        await client.enqueue("nan", {1, 2})
    # An option JSON cannot hold would go out as null, "not set": refused by name instead.
    with pytest.raises(InvalidArgument) as caught:
        await client.enqueue("nan", 1, delay_s=float("inf"))
    assert caught.value.field == "delay_s"
    with pytest.raises(InvalidArgument) as caught:
        await client.enqueue_many("nan", [1], visibility_timeout_s=float("nan"))
    assert caught.value.field == "visibility_timeout_s"
    assert probe.handled("enqueue") == probe.handled("enqueue_batch") == []


@with_config(max_payload_bytes=1024)
async def test_payload_over_the_broker_limit_is_too_large(client: Client) -> None:
    with pytest.raises(TooLarge):
        await client.enqueue("large", "x" * 2000)
    with pytest.raises(TooLarge) as caught:
        await client.enqueue_many("large", ["small", "x" * 2000])
    assert caught.value.field == "jobs[1].payload"
    assert await client.enqueue("large", "x" * 500)  # under the limit is fine


TOKENS = {
    "pub": frozenset({Role.PUBLISH}),
    "reader": frozenset({Role.READ}),
    "root": frozenset(Role),
}


@with_config(tokens=TOKENS)
async def test_a_token_without_the_role_is_forbidden(broker: Broker) -> None:
    async with Client(broker.url, token="reader", connect_timeout=WAIT) as reader:
        with pytest.raises(Forbidden) as caught:
            await reader.enqueue("q", {})
        assert caught.value.code == "forbidden"
        assert await reader.stats() == {}  # reading is allowed
    async with Client(broker.url, token="pub", connect_timeout=WAIT) as publisher:
        job_id = await publisher.enqueue("q", {})
        with pytest.raises(Forbidden):
            await publisher.pause("q")
        with pytest.raises(Forbidden):
            await publisher.purge_dead("q")
        assert await publisher.cancel(job_id) is True


@with_config(tokens=TOKENS)
async def test_a_wrong_or_missing_token_is_unauthorized_at_once(broker: Broker) -> None:
    async with asyncio.timeout(WAIT):
        with pytest.raises(Unauthorized):
            async with Client(broker.url, token="wrong", connect_timeout=WAIT):
                pass
        with pytest.raises(Unauthorized):
            async with Client(broker.url, connect_timeout=WAIT):
                pass


async def test_no_broker_is_connection_failed_within_the_connect_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionFailed) as caught:
        async with Client(f"ws://127.0.0.1:{free_port()}", connect_timeout=0.3):
            pass
    assert time.monotonic() - started < 2.0
    assert caught.value.code == "connection_failed"


async def test_a_bad_url_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument) as caught:
        Client("http://127.0.0.1:8765")
    assert caught.value.field == "url"


async def test_a_url_without_a_path_means_the_ws_endpoint(broker: Broker) -> None:
    bare = broker.url.removesuffix("/ws")
    async with Client(bare, connect_timeout=WAIT) as c:
        assert await c.enqueue("bare", 1)


async def test_concurrent_calls_are_pipelined_on_one_client(client: Client) -> None:
    ids = await asyncio.gather(*(client.enqueue("many", i) for i in range(200)))
    assert len(set(ids)) == 200
    infos = await asyncio.gather(*(client.get_job(i) for i in ids))
    assert [info.payload for info in infos if info is not None] == list(range(200))


async def test_concurrent_enqueues_share_frames_and_a_bad_one_fails_alone(
    client: Client, probe: Probe
) -> None:
    bad = {7: True, 20: 2**31}  # a wrong type, a value out of range
    calls = [client.enqueue("shared", i, priority=bad.get(i, 0)) for i in range(40)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)

    for i in bad:
        error = outcomes[i]
        assert isinstance(error, InvalidArgument), error
        assert error.field == "priority"  # the caller's own argument, not jobs[k].priority
        assert str(error).startswith("priority: ")
    good = [i for i in range(40) if i not in bad]
    ids = [outcomes[i] for i in good]
    assert all(isinstance(job_id, str) for job_id in ids) and len(set(ids)) == len(good)
    frames = [h.fields["jobs"] for h in probe.log if h.op == "enqueue_each"]
    assert [job["payload"] for jobs in frames for job in jobs] == list(range(40))  # in order
    assert max(len(jobs) for jobs in frames) > 1  # they did share frames
    stored = (await client.stats("shared"))["shared"]
    assert stored["totals"]["enqueued"] == len(good)
    infos = await asyncio.gather(*(client.get_job(str(job_id)) for job_id in ids))
    assert [info.payload for info in infos if info is not None] == good


async def test_a_shared_frame_answers_each_enqueue_as_a_frame_of_its_own_would(
    client: Client,
) -> None:
    rng = random.Random(7)
    choices: dict[str, list[Any]] = {
        "priority": [0, 3, -5, 2**31, True, 1.5],
        "delay_s": [None, 0, 2.5, -1, 1e300],
        "max_attempts": [None, 1, 5, 0, "3"],
        "visibility_timeout_s": [None, 30, 0, -2],
        "backoff_base_s": [None, 1, 10**6],
        "expires_s": [None, 60, 0],
    }
    cases = []
    for i in range(80):
        queue = rng.choice(["mixed", "mixed", "other", "bad name!", "x" * 129])
        options = {name: rng.choice(values) for name, values in choices.items()}
        payload = {"i": i} if rng.random() < 0.9 else "x" * 3000
        cases.append((queue, payload, options))

    def outcome(result: Any) -> Any:
        if isinstance(result, ConveyorError):
            return (type(result), result.code, result.field, str(result))
        assert isinstance(result, str), result
        return "stored"

    shared = await asyncio.gather(
        *(client.enqueue(q, p, **o) for q, p, o in cases), return_exceptions=True
    )
    alone = []
    for queue, payload, options in cases:
        fields = {k: v for k, v in options.items() if v is not None}
        try:
            reply = await client._call("enqueue", queue=queue, payload=payload, **fields)
            alone.append(outcome(reply["id"]))
        except ConveyorError as exc:
            alone.append(outcome(exc))
    assert [outcome(r) for r in shared] == alone
    assert "stored" in alone and len(set(alone)) > 5  # the cases did mix outcomes


async def test_a_broker_without_enqueue_each_gets_plain_enqueues() -> None:
    import orjson
    from websockets.asyncio.server import ServerConnection, serve

    ops: list[str] = []

    async def older(ws: ServerConnection) -> None:  # a broker from before enqueue_each
        async for message in ws:
            frame = orjson.loads(message)
            ops.append(frame["op"])
            if frame["op"] == "enqueue_each":
                error = {"code": "unknown_op", "message": "op: unknown op", "field": "op"}
                reply = {"rid": frame["rid"], "ok": False, "error": error}
            elif frame["op"] == "enqueue":
                reply = {"rid": frame["rid"], "ok": True, "id": f"id-{frame['payload']}"}
            else:
                reply = {"rid": frame["rid"], "ok": True}
            await ws.send(orjson.dumps(reply).decode())

    async with serve(older, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with Client(f"ws://127.0.0.1:{port}/ws", connect_timeout=WAIT) as old:
            first = await asyncio.gather(*(old.enqueue("q", i) for i in range(3)))
            later = await old.enqueue("q", 3)
    assert first == ["id-0", "id-1", "id-2"] and later == "id-3"
    # The first goes at once, alone; the two made meanwhile share the next frame. Once
    # refused, every enqueue goes plain, those three again and every later one.
    assert ops == ["hello", "enqueue_each", "enqueue_each", *["enqueue"] * 4]


async def test_an_enqueue_with_nothing_in_flight_is_written_in_the_callers_step(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = client._session
    writers: list[asyncio.Task[Any] | None] = []  # the task that wrote each frame
    write_now = session._write_now

    def spy(frame: bytes) -> None:
        writers.append(asyncio.current_task())
        write_now(frame)

    monkeypatch.setattr(session, "_write_now", spy)
    await client.enqueue("now", 1)  # alone, with nothing in flight
    assert writers == [asyncio.current_task()]  # written before this task yielded
    writers.clear()
    ids = await asyncio.gather(*(client.enqueue("now", i) for i in range(5)))
    assert len(set(ids)) == 5
    # The first of a burst goes at once from its own task; the other four share one
    # frame, written at the end of the loop iteration (no task then).
    assert len(writers) == 2 and writers[0] is not None and writers[1] is None


async def test_shared_frames_stay_small_and_a_large_payload_goes_alone(
    client: Client, probe: Probe
) -> None:
    mid = "m" * 20_000  # three fit under the 64 KiB a shared frame holds, four do not
    large = "L" * 100_000
    ids = await asyncio.gather(
        *(client.enqueue("sizes", mid) for _ in range(10)), client.enqueue("sizes", large)
    )
    frames = [h.fields["jobs"] for h in probe.log if h.op == "enqueue_each"]
    assert sum(len(jobs) for jobs in frames) == 10
    assert max(len(jobs) for jobs in frames) == 3
    alone = [h for h in probe.log if h.op == "enqueue"]
    assert [h.result["id"] for h in alone] == [ids[-1]]
    info = await client.get_job(ids[-1])
    assert info is not None and info.payload == large


def test_made_keys_are_unique_and_not_shared_with_a_forked_child() -> None:
    from conveyor.sdk._client import _AutoKeys

    keys = _AutoKeys()
    made = {keys() for _ in range(1000)}
    assert len(made) == 1000
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its keys must not repeat the parent's
        os.write(write, keys().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(write)
    child_key = os.read(read, 200).decode()
    os.close(read)
    parent_next = keys()
    assert child_key not in made and child_key != parent_next
    assert child_key.rsplit("-", 1)[0] != parent_next.rsplit("-", 1)[0]


async def test_request_now_is_answered_with_the_reply_or_the_refusal(client: Client) -> None:
    """``Session.request_now`` (a worker's acks go out through it) gives the reply, or
    fails with the refusal the broker sent, like ``request``; cancelling it stops the
    wait and leaves nothing waiting for an answer."""
    session = client._session
    reply = await session.request_now("stats", {})
    assert reply["ok"] is True and "queues" in reply
    with pytest.raises(ConveyorError) as refused:
        await session.request_now("no_such_op", {})
    assert refused.value.code == "unknown_op"
    waiting = session.request_now("stats", {})
    waiting.cancel()
    for _ in range(2):  # a future's callbacks run a loop turn later: the wait's, then its request's
        await asyncio.sleep(0)
    assert not session._pending
