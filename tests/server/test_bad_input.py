"""Bad input, limits and misbehaving peers (docs/protocol.md §2, §3, §6, §10-§12).

Each kind of bad frame gets an error with a stable code whose message names the field,
and the connection stays usable; peers that keep misbehaving are closed with the
documented code; nothing a peer sends crashes the broker or makes it log a traceback.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from conveyor.broker.connection import Connection, Socket
from conveyor.broker.ops import HANDLERS
from conveyor.broker.server import Broker
from conveyor.sdk._wire import OPS, ErrorCode, Field, Kind, Op

from .conftest import (
    WAIT,
    ClientFactory,
    RawClient,
    stalled_socket,
    with_config,
)

# Small limits, so that going over them costs little.
LIMITS = {
    "max_payload_bytes": 1024,
    "max_batch": 3,
    "max_prefetch": 4,
    "max_frame_bytes": 8192,
}
limited = with_config(**LIMITS)


def request(op: str, **fields: Any) -> str:
    return json.dumps({"op": op, "rid": 1, **fields})


def enqueue(**fields: Any) -> str:
    return request("enqueue", **{"queue": "q", "payload": 1, **fields})


def handles(n: int) -> list[dict[str, str]]:
    return [{"id": f"j{i}", "lease": f"l{i}"} for i in range(n)]


# (frame as sent, code, field, rid echoed)
BAD_INPUT: dict[str, tuple[str | bytes, str, str | None, Any]] = {
    # The frame itself.
    "not json": ("enqueue please", "bad_json", None, None),
    "trailing garbage": ('{"op": "ping", "rid": 1} x', "bad_json", None, None),
    "NaN is not JSON": (
        '{"op": "enqueue", "rid": 1, "queue": "q", "payload": NaN}',
        "bad_json",
        None,
        None,
    ),
    "json array": ("[1, 2]", "bad_frame", None, None),
    "json number": ("3", "bad_frame", None, None),
    "json string": ('"ping"', "bad_frame", None, None),
    "binary frame": (b'{"op": "ping", "rid": 1}', "bad_frame", None, None),
    # The envelope.
    "unknown op": (request("enqueu"), "unknown_op", "op", 1),
    "missing op": ('{"rid": 1}', "invalid_argument", "op", 1),
    "op not a string": ('{"op": 5, "rid": 1}', "invalid_argument", "op", 1),
    "rid an array": ('{"op": "ping", "rid": [1]}', "invalid_argument", "rid", None),
    "rid a boolean": ('{"op": "ping", "rid": true}', "invalid_argument", "rid", None),
    "rid too long": (
        orjson.dumps({"op": "ping", "rid": "r" * 65}).decode(),
        "invalid_argument",
        "rid",
        None,
    ),
    # Fields: missing, unknown, mistyped.
    "missing payload": (request("enqueue", queue="q"), "invalid_argument", "payload", 1),
    "missing queue": (request("enqueue", payload=1), "invalid_argument", "queue", 1),
    "null required": (request("enqueue", queue=None, payload=1), "invalid_argument", "queue", 1),
    "unknown field": (enqueue(priorty=1), "invalid_argument", "priorty", 1),
    "unknown nested field": (
        request("enqueue_batch", queue="q", jobs=[{"payload": 1, "bogus": 2}]),
        "invalid_argument",
        "jobs[0].bogus",
        1,
    ),
    "queue not a string": (enqueue(queue=5), "invalid_argument", "queue", 1),
    "bool for an integer": (enqueue(priority=True), "invalid_argument", "priority", 1),
    "bool for a number": (enqueue(delay_s=False), "invalid_argument", "delay_s", 1),
    "fraction for an integer": (enqueue(max_attempts=2.5), "invalid_argument", "max_attempts", 1),
    "exponent for an integer": (
        '{"op": "enqueue", "rid": 1, "queue": "q", "payload": 1, "priority": 1e0}',
        "invalid_argument",
        "priority",
        1,
    ),
    "string for a number": (enqueue(delay_s="5"), "invalid_argument", "delay_s", 1),
    "bool in a batch": (
        request(
            "enqueue_batch", queue="q", jobs=[{"payload": 1}, {"payload": 2, "priority": True}]
        ),
        "invalid_argument",
        "jobs[1].priority",
        1,
    ),
    "queues not an array": (
        request("subscribe", worker_id="w", queues="q"),
        "invalid_argument",
        "queues",
        1,
    ),
    "lease missing": (request("ack", id="j1"), "invalid_argument", "lease", 1),
    "lease missing in a batch": (
        request("ack_batch", items=[{"id": "j1"}]),
        "invalid_argument",
        "items[0].lease",
        1,
    ),
    # Meaning: names, ranges.
    "bad queue name": (enqueue(queue="emails to send"), "invalid_argument", "queue", 1),
    "empty queue name": (enqueue(queue=""), "invalid_argument", "queue", 1),
    "queue name too long": (enqueue(queue="q" * 129), "invalid_argument", "queue", 1),
    "bad queue in a list": (
        request("subscribe", worker_id="w", queues=["ok", "not ok"], prefetch=1),
        "invalid_argument",
        "queues[1]",
        1,
    ),
    "queue listed twice": (
        request("subscribe", worker_id="w", queues=["a", "b", "a"]),
        "invalid_argument",
        "queues[2]",
        1,
    ),
    "empty worker_id": (
        request("subscribe", worker_id="", queues=["q"]),
        "invalid_argument",
        "worker_id",
        1,
    ),
    "priority above range": (enqueue(priority=2**31), "invalid_argument", "priority", 1),
    "priority below range": (enqueue(priority=-(2**31) - 1), "invalid_argument", "priority", 1),
    "priority beyond 64 bits": (enqueue(priority=2**64), "invalid_argument", "priority", 1),
    "negative delay": (enqueue(delay_s=-1), "invalid_argument", "delay_s", 1),
    "zero expiry": (enqueue(expires_s=0), "invalid_argument", "expires_s", 1),
    "zero visibility": (
        enqueue(visibility_timeout_s=0),
        "invalid_argument",
        "visibility_timeout_s",
        1,
    ),
    "zero attempts": (enqueue(max_attempts=0), "invalid_argument", "max_attempts", 1),
    "negative retry delay": (
        request("retry", id="j", lease="l", delay_s=-0.5),
        "invalid_argument",
        "delay_s",
        1,
    ),
    # One decoder, one set of rules: what orjson refuses is bad_json, never a
    # second, laxer parse.
    "1e400 delay": (
        '{"op": "enqueue", "rid": 1, "queue": "q", "payload": 1, "delay_s": 1e400}',
        "bad_json",
        None,
        None,
    ),
    "1e400 in a payload": (
        '{"op": "enqueue", "rid": 1, "queue": "q", "payload": [1e400]}',
        "bad_json",
        None,
        None,
    ),
    "lone surrogate in a key": (
        '{"op": "enqueue", "rid": 1, "queue": "q", "payload": 1, "key": "\\ud800"}',
        "bad_json",
        None,
        None,
    ),
    "400-digit rid": ('{"op": "ping", "rid": ' + "9" * 400 + "}", "bad_json", None, None),
    "max_attempts 2**63": (enqueue(max_attempts=2**63), "invalid_argument", "max_attempts", 1),
    "max_attempts over 2**31-1": (
        enqueue(max_attempts=2**31),
        "invalid_argument",
        "max_attempts",
        1,
    ),
    "payload nested too deep": (
        '{"op": "enqueue", "rid": 1, "queue": "q", "payload": ' + "[" * 255 + "]" * 255 + "}",
        "invalid_argument",
        "payload",
        1,
    ),
    "prefetch zero": (
        request("subscribe", worker_id="w", queues=["q"], prefetch=0),
        "invalid_argument",
        "prefetch",
        1,
    ),
    "protocol 2": (request("hello", protocol=2), "unsupported_version", "protocol", 1),
    "client name too long": (request("hello", client="c" * 257), "invalid_argument", "client", 1),
    # Flow control.
    "limit zero": (
        request("set_limits", queue="q", concurrency=0),
        "invalid_argument",
        "concurrency",
        1,
    ),
    "limit not an integer": (
        request("set_limits", queue="q", rate="100/min"),
        "invalid_argument",
        "rate",
        1,
    ),
    "limit period zero": (
        request("set_limits", queue="q", rate=5, per_s=0),
        "invalid_argument",
        "per_s",
        1,
    ),
    "burst without rate": (
        request("set_limits", queue="q", partition_burst=2),
        "invalid_argument",
        "partition_burst",
        1,
    ),
    "limit misspelt": (
        request("set_limits", queue="q", concurency=2),
        "invalid_argument",
        "concurency",
        1,
    ),
    "limits of a bad queue": (
        request("set_limits", queue="a b", concurrency=2),
        "invalid_argument",
        "queue",
        1,
    ),
    "partition too long": (enqueue(partition="p" * 1025), "invalid_argument", "partition", 1),
    "partition not a string": (enqueue(partition=7), "invalid_argument", "partition", 1),
    "back off without delay": (
        request("back_off", id="x", lease="y"),
        "invalid_argument",
        "delay_s",
        1,
    ),
    "back off negative": (
        request("back_off", id="x", lease="y", delay_s=-1),
        "invalid_argument",
        "delay_s",
        1,
    ),
    "back off bad scope": (
        request("back_off", id="x", lease="y", delay_s=1, scope="all"),
        "invalid_argument",
        "scope",
        1,
    ),
    # Limits.
    "payload too large": (enqueue(payload="x" * 2000), "too_large", "payload", 1),
    "batch payload too large": (
        request("enqueue_batch", queue="q", jobs=[{"payload": 1}, {"payload": "x" * 2000}]),
        "too_large",
        "jobs[1].payload",
        1,
    ),
    "enqueue batch too long": (
        request("enqueue_batch", queue="q", jobs=[{"payload": i} for i in range(4)]),
        "too_large",
        "jobs",
        1,
    ),
    "enqueue each too long": (
        request("enqueue_each", jobs=[{"queue": "q", "payload": i} for i in range(4)]),
        "too_large",
        "jobs",
        1,
    ),
    "enqueue each not an array": (
        request("enqueue_each", jobs={"queue": "q", "payload": 1}),
        "invalid_argument",
        "jobs",
        1,
    ),
    "ack batch too long": (request("ack_batch", items=handles(4)), "too_large", "items", 1),
    "heartbeat batch too long": (
        request("heartbeat_batch", items=handles(4)),
        "too_large",
        "items",
        1,
    ),
    "too many leases": (
        request("subscribe", worker_id="w", queues=["q"], leases=handles(4)),
        "too_large",
        "leases",
        1,
    ),
    "prefetch over max": (
        request("subscribe", worker_id="w", queues=["q"], prefetch=5),
        "limit_exceeded",
        "prefetch",
        1,
    ),
    # State.
    "unsubscribe first": (request("unsubscribe"), "conflict", None, 1),
    "stats of an unknown queue": (request("stats", queue="nobody"), "not_found", "queue", 1),
    "resume an unknown queue": (request("resume", queue="nobody"), "not_found", "queue", 1),
}


@limited
@pytest.mark.parametrize(
    ("frame", "code", "field", "rid"), list(BAD_INPUT.values()), ids=list(BAD_INPUT)
)
async def test_bad_input_is_answered_and_the_connection_stays_usable(
    client: ClientFactory, frame: str | bytes, code: str, field: str | None, rid: Any
) -> None:
    conn = await client()
    await conn.send(frame)
    reply = await conn.recv()
    assert reply["ok"] is False
    error = reply["error"]
    assert error["code"] == code, error
    assert error["field"] == field, error
    assert reply["rid"] == rid
    if field is not None:
        assert error["message"].startswith(f"{field}: "), error
    # A normal request on the same connection still works, and the refused one
    # changed nothing.
    job_id = (await conn.call("enqueue", queue="after", payload={"n": 1}))["id"]
    stats = (await conn.call("stats"))["queues"]
    holding = {name: s["ready"] + s["scheduled"] for name, s in stats.items()}
    assert {name: n for name, n in holding.items() if n} == {"after": 1}
    assert (await conn.call("get_job", id=job_id))["job"]["payload"] == {"n": 1}


async def test_subscribing_twice_is_a_conflict(client: ClientFactory) -> None:
    worker = await client()
    await worker.call("subscribe", worker_id="w", queues=["a"], prefetch=2)
    reply = await worker.request("subscribe", worker_id="w", queues=["b"], prefetch=2)
    assert reply["error"]["code"] == "conflict"
    # The first subscription stands: jobs of "a" come, jobs of "b" do not.
    publisher = await client()
    await publisher.call("enqueue", queue="b", payload="b")
    await publisher.call("enqueue", queue="a", payload="a")
    [job] = await worker.jobs(1)
    assert job["payload"] == "a"
    assert (await worker.call("ack", id=job["id"], lease=job["lease"]))["landed"] is True


@limited
async def test_a_frame_over_max_frame_bytes_closes_1009(
    client: ClientFactory, no_errors_logged: None
) -> None:
    conn = await client()
    other = await client()
    await conn.send(enqueue(payload="x" * 9000))
    assert await conn.closed() == 1009
    # The broker goes on serving everyone else, and stored nothing.
    assert (await other.call("stats"))["queues"] == {}
    assert (await other.request("ping"))["ok"] is True


async def test_a_text_frame_that_is_not_utf8_closes_1007(
    client: ClientFactory, no_errors_logged: None
) -> None:
    conn = await client()
    await conn.ws.send(b'{"op": "ping", "rid": "\xff"}', text=True)
    assert await conn.closed() == 1007
    assert (await (await client()).request("ping"))["ok"] is True


async def test_a_peer_that_keeps_sending_garbage_is_closed_1008(client: ClientFactory) -> None:
    conn = await client()
    garbage = ["nope", "[]", b"\x00", request("nope")]  # bad_json, bad_frame, bad_frame, unknown_op

    async def send_garbage(n: int) -> None:
        for i in range(n):
            await conn.send(garbage[i % len(garbage)])
        for _ in range(n):
            reply = await conn.recv()
            assert reply["error"]["code"] in {"bad_json", "bad_frame", "unknown_op"}

    # An accepted request (even fire-and-forget) resets the count, so 9 + 9 + 9 is fine...
    await send_garbage(9)
    assert (await conn.request("ping"))["ok"] is True
    await send_garbage(9)
    await conn.send({"op": "ping"})
    await send_garbage(9)
    assert (await conn.request("ping"))["ok"] is True
    # ...and a tenth in a row is not: all ten are answered, then the connection closes.
    await send_garbage(10)
    assert await conn.closed() == 1008


async def test_an_internal_error_says_nothing_and_the_broker_goes_on(
    caplog: pytest.LogCaptureFixture,
    client: ClientFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = "SECRET-DETAIL-in-the-exception"

    def broken(conn: Any, fields: dict[str, Any]) -> None:
        raise RuntimeError(secret)

    monkeypatch.setitem(HANDLERS, Op.STATS, broken)
    conn = await client()
    reply = await conn.request("stats")
    assert reply["error"]["code"] == "internal"
    text = orjson.dumps(reply).decode()
    assert secret not in text
    assert "Traceback" not in text
    assert "RuntimeError" not in text
    # The operator gets the whole story in the log.
    assert any(r.exc_info and secret in str(r.exc_info[1]) for r in caplog.records)
    # The connection and the broker keep working.
    assert (await conn.call("enqueue", queue="q", payload=1))["id"]
    fresh = await client()
    assert (await fresh.call("get_job", id="nothing"))["job"] is None


# -------------------------------------------------------------------------- fuzzing


def json_containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    json_containers,
    max_leaves=12,
)
QUEUE_NAMES = st.sampled_from(["q", "fuzz", "a.b:c-d_e", "", "no spaces", "x" * 129]) | st.text(
    max_size=12
)


def field_values(f: Field) -> st.SearchStrategy[Any]:
    """Values for one field of the real op table: mostly of its type, sometimes anything."""
    typed: st.SearchStrategy[Any]
    if f.kind is Kind.STRING:
        typed = QUEUE_NAMES if f.name == "queue" else st.text(max_size=12)
    elif f.kind is Kind.INTEGER:
        typed = st.integers(-3, 20) | st.integers()
    elif f.kind is Kind.NUMBER:
        typed = st.integers(-3, 5) | st.floats(-3, 5) | st.floats()
    elif f.kind is Kind.ANY:
        typed = JSON_VALUES
    elif f.kind is Kind.STRINGS:
        typed = st.lists(QUEUE_NAMES, max_size=4)
    else:
        typed = st.lists(
            st.fixed_dictionaries({}, optional={sub.name: field_values(sub) for sub in f.items}),
            max_size=4,
        )
    return typed | JSON_VALUES


@st.composite
def requests(draw: st.DrawFn) -> str:
    op = draw(st.sampled_from(sorted(OPS)) | st.text(max_size=12))
    frame: dict[str, Any] = {"op": op}
    if draw(st.booleans()):
        frame["rid"] = draw(st.integers() | st.text(max_size=70) | JSON_VALUES)
    spec = OPS.get(op)
    if spec is not None:
        for f in spec.fields:
            if draw(st.booleans()):
                frame[f.name] = draw(field_values(f))
    frame.update(draw(st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=2)))
    # json.dumps writes NaN, Infinity and integers of any size, as a sloppy client would.
    return json.dumps(frame)


FRAMES = st.one_of(
    requests(),
    requests(),
    st.text(max_size=200),
    JSON_VALUES.map(json.dumps),
    st.binary(max_size=40),
    st.integers(8200, 9000).map(lambda n: "x" * n),  # over max_frame_bytes
)
CODES = {code.value for code in ErrorCode} - {"internal"}
END = "end-of-fuzz-frames"
EXAMPLES = 100


@limited
async def test_fuzzed_frames_never_break_the_broker(broker: Broker, no_errors_logged: None) -> None:
    loop = asyncio.get_running_loop()
    checks = 0

    async def throw(frames: list[str | bytes]) -> None:
        ws = await connect(broker.url)
        try:
            for frame in frames:
                await ws.send(frame)
            await ws.send(orjson.dumps({"op": "ping", "rid": END}).decode())
        except ConnectionClosed:
            pass
        try:
            while True:
                reply = orjson.loads(await ws.recv())
                assert isinstance(reply, dict), reply
                if "push" in reply:
                    continue
                if reply["ok"] is False:
                    assert reply["error"]["code"] in CODES, reply
                elif reply["rid"] == END:
                    break
                for result in reply.get("results", []):  # enqueue_each: each job's own
                    assert "id" in result or result["error"]["code"] in CODES, reply
        except ConnectionClosed:
            # Garbage (1008) or a frame over the limit (1009); never an internal error.
            assert ws.close_code in {1008, 1009}, ws.close_code
        finally:
            await ws.close()

    async def still_serves() -> None:
        nonlocal checks
        checks += 1
        queue = f"check.{checks}"
        publisher = RawClient(await connect(broker.url))
        worker = RawClient(await connect(broker.url))
        try:
            await worker.call(
                "subscribe", worker_id=f"checker-{checks}", queues=[queue], prefetch=1
            )
            job_id = (await publisher.call("enqueue", queue=queue, payload=checks))["id"]
            [job] = await worker.jobs(1)
            assert (job["id"], job["payload"]) == (job_id, checks)
            assert (await worker.call("ack", id=job_id, lease=job["lease"]))["landed"] is True
        finally:
            await publisher.ws.close()
            await worker.ws.close()

    async def one_example(frames: list[str | bytes]) -> None:
        async with asyncio.timeout(WAIT):
            await throw(frames)
            await still_serves()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(FRAMES, max_size=12))
    def run_example(frames: list[str | bytes]) -> None:
        # Hypothesis drives this from a worker thread; the broker lives on the test's loop.
        future = asyncio.run_coroutine_threadsafe(one_example(frames), loop)
        future.result(timeout=WAIT + 1)

    await asyncio.to_thread(run_example)
    assert checks >= EXAMPLES // 2  # hypothesis really ran the examples


# -------------------------------------------------------------------------- slow peers


@with_config(ping_timeout_s=1.0)
async def test_a_stalled_worker_does_not_slow_another_and_is_dropped(
    broker: Broker, client: ClientFactory, no_errors_logged: None
) -> None:
    loop = asyncio.get_running_loop()
    publisher = await client()
    # A worker that subscribes and then never reads again (its library buffers one frame).
    stalled = await client(sock=stalled_socket(broker.url), max_queue=1, ping_interval=None)
    await stalled.call("subscribe", worker_id="stalled", queues=["slow"], prefetch=500)
    jobs = 240
    for _ in range(jobs // 10):  # 240 x 64 KiB: far more than the socket buffers hold
        batch = [{"payload": {"blob": "x" * 65536}} for _ in range(10)]
        await publisher.call("enqueue_batch", queue="slow", jobs=batch)
    stats = (await publisher.call("stats", queue="slow"))["queues"]["slow"]
    # Its window has room for all of them, but once its connection holds a MiB unsent
    # the broker pushes it nothing more: the rest wait in the queue, not in memory.
    pushed = stats["processing"]
    assert 0 < pushed < jobs
    assert stats["ready"] == jobs - pushed

    # Another worker on another queue is served as if nothing were wrong.
    fast = await client()
    await fast.call("subscribe", worker_id="fast", queues=["fast"], prefetch=1)
    started = loop.time()
    for i in range(50):
        await publisher.send({"op": "enqueue", "queue": "fast", "payload": i})
        [job] = await fast.jobs(1)
        assert job["payload"] == i
        await fast.send({"op": "ack", "id": job["id"], "lease": job["lease"]})
    assert loop.time() - started < 2.0

    # The stalled worker is dropped and its jobs go to a worker that reads.
    rescuer = await client()
    await rescuer.call("subscribe", worker_id="rescuer", queues=["slow"], prefetch=500)
    got = await rescuer.jobs(jobs, timeout=WAIT + 5)
    attempts = [job["attempt"] for job in got]
    assert (attempts.count(2), attempts.count(1)) == (pushed, jobs - pushed)
    assert await stalled.closed() in {1006, 1008}


async def test_a_client_that_pipelines_is_slowed_not_dropped(client: ClientFactory) -> None:
    conn = await client()
    n = 10_000  # far more replies than the broker's outbox holds

    async def send_all() -> None:
        for i in range(n):
            await conn.ws.send(orjson.dumps({"op": "ping", "rid": i}).decode())

    sender = asyncio.create_task(send_all())
    seen = set()
    async with asyncio.timeout(20):
        while len(seen) < n:
            reply = await conn.recv()
            assert reply["ok"] is True, reply
            seen.add(reply["rid"])
    await sender
    assert seen == set(range(n))


@with_config(max_outbox_frames=64)
async def test_requests_read_in_one_piece_wait_while_replies_are_behind(
    client: ClientFactory,
) -> None:
    # 1,000 requests in one write: the broker reads them at once, far more than its outbox
    # (64 frames) holds. Reading pauses at half of that, and the requests already read
    # wait with it, so the peer gets every reply instead of a "too slow" close.
    conn = await client()
    n = 1000
    async with conn.ws.send_context():
        for i in range(n):
            conn.ws.protocol.send_text(orjson.dumps({"op": "ping", "rid": i}))
    seen = []
    async with asyncio.timeout(20):
        while len(seen) < n:
            reply = await conn.recv()
            assert reply["ok"] is True, reply
            seen.append(reply["rid"])
    assert seen == list(range(n))  # in order, each once


# --- how frames reach the handler -------------------------------------------------------


async def test_a_fragmented_message_is_joined_before_it_is_handled(
    client: ClientFactory, no_errors_logged: None
) -> None:
    conn = await client()
    # "é" is two bytes in UTF-8; the fragments split it, so only the joined message is text.
    body = '{"op": "ping", "rid": "é"}'.encode()
    cut = body.index(b"\xc3") + 1
    async with conn.ws.send_context():
        conn.ws.protocol.send_text(body[:cut], fin=False)
        conn.ws.protocol.send_ping(b"in between")  # control frames may come between
        conn.ws.protocol.send_continuation(body[cut:-3], fin=False)
        conn.ws.protocol.send_continuation(body[-3:], fin=True)
    pong = await conn.reply("é")
    assert pong["ok"] is True and isinstance(pong["now"], float)
    # A fragmented binary message is refused whole, like any binary frame.
    async with conn.ws.send_context():
        conn.ws.protocol.send_binary(b'{"op": "pi', fin=False)
        conn.ws.protocol.send_continuation(b'ng", "rid": 2}', fin=True)
    refused = await conn.recv()
    assert refused["ok"] is False and refused["error"]["code"] == "bad_frame"
    assert (await conn.request("ping"))["ok"] is True


async def test_invalid_utf8_split_across_fragments_closes_1007(
    client: ClientFactory, no_errors_logged: None
) -> None:
    conn = await client()
    async with conn.ws.send_context():
        conn.ws.protocol.send_text(b'{"op": "ping", "rid": "\xc3', fin=False)
        conn.ws.protocol.send_continuation(b'("}', fin=True)  # \xc3 then "(": not UTF-8
    assert await conn.closed() == 1007


async def test_frames_sent_before_the_connection_is_served_are_handled_in_order(
    broker: Broker, client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hold the connection's handling back until the client's requests have surely arrived.
    release = asyncio.Event()
    arrived = asyncio.Event()
    run = Connection.run

    async def late_run(self: Connection) -> None:
        arrived.set()
        await release.wait()
        await run(self)

    monkeypatch.setattr(Connection, "run", late_run)
    assert broker.server is not None
    try:
        conn = await client()
        for rid in range(5):
            await conn.send({"op": "ping", "rid": rid})
        await asyncio.wait_for(arrived.wait(), WAIT)
        # A handshake on another connection takes several round trips, by which time the
        # broker has read conn's frames: they wait for conn's handler.
        other = await client()
        waiting = sorted(len(ws._waiting) for ws in broker.server.connections)
        assert waiting == [0, 5]  # conn's five; other sent none
    finally:
        release.set()
    assert (await other.request("ping"))["ok"] is True
    assert [(await conn.recv())["rid"] for _ in range(5)] == [0, 1, 2, 3, 4]


def masked_frame(opcode: int, payload: bytes, *, fin: bool = True) -> bytes:
    """A client's frame as RFC 6455 lays it out (7-, 16- or 64-bit length, masked)."""
    mask = b"\x37\xfa\x21\x3d"
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + body


def ping_request(rid: str, pad: int = 0) -> bytes:
    """A ping request, made ``pad`` bytes longer with JSON whitespace."""
    return orjson.dumps({"op": "ping", "rid": rid})[:-1] + b" " * pad + b"}"


async def test_a_frame_cut_anywhere_between_two_reads_is_joined(
    client: ClientFactory, no_errors_logged: None
) -> None:
    # The first piece rides one write with a whole request; its reply shows the broker
    # has read that write (so the cut really falls between two reads); then the rest.
    conn = await client()
    transport = conn.ws.transport
    for size in (0, 200, 70_000):  # 7-, 16- and 64-bit lengths
        frame = masked_frame(0x1, ping_request(f"r{size}", size))
        header = {0: 6, 200: 8, 70_000: 14}[size]
        for cut in sorted({1, 2, 3, header - 4, header - 1, header, header + 1, len(frame) - 1}):
            transport.write(masked_frame(0x1, ping_request(f"before{size}.{cut}")) + frame[:cut])
            assert (await conn.recv())["rid"] == f"before{size}.{cut}"
            transport.write(frame[cut:])
            reply = await conn.recv()
            assert (reply["rid"], reply["ok"]) == (f"r{size}", True), (size, cut, reply)


async def test_frames_of_every_kind_in_one_read_are_handled_in_order(
    client: ClientFactory, no_errors_logged: None
) -> None:
    conn = await client()
    text = '{"op": "ping", "rid": "frag-é"}'.encode()
    stream = b"".join(
        [
            masked_frame(0x1, ping_request("a")),
            masked_frame(0x9, b"are you there"),  # a ping: websockets answers it
            masked_frame(0x1, ping_request("b", 300)),
            masked_frame(0x1, text[:20], fin=False),  # a fragmented message
            masked_frame(0xA, b"unasked pong"),
            masked_frame(0x0, text[20:], fin=True),
            masked_frame(0x2, ping_request("binary")),  # refused: binary
            masked_frame(0x1, ping_request("c")),
            masked_frame(0x1, ping_request("d", 70_000)),
            masked_frame(0x1, ping_request("e")),
        ]
    )
    conn.ws.transport.write(stream)
    replies = [await conn.recv() for _ in range(7)]
    assert [r.get("rid") for r in replies] == ["a", "b", "frag-é", None, "c", "d", "e"]
    assert replies[3]["error"]["code"] == "bad_frame"
    assert (await conn.request("ping"))["ok"] is True


@with_config(max_frame_bytes=1000)
async def test_an_oversized_frame_after_good_ones_in_one_read_closes_1009(
    client: ClientFactory,
) -> None:
    conn = await client()
    conn.ws.transport.write(
        masked_frame(0x1, ping_request("ok")) + masked_frame(0x1, ping_request("big", 2000))
    )
    # (The close frame goes out at once; the reply to "ok", queued for the end of the
    # loop iteration, may not make it before it.)
    assert await conn.closed() == 1009


async def test_invalid_utf8_after_good_frames_in_one_read_closes_1007(
    broker: Broker, client: ClientFactory, no_errors_logged: None
) -> None:
    conn = await client()
    conn.ws.transport.write(
        masked_frame(0x1, orjson.dumps({"op": "enqueue", "rid": 1, "queue": "q", "payload": 1}))
        + masked_frame(0x1, b'{"op": "ping", "rid": "\xc3("}')
        + masked_frame(0x1, orjson.dumps({"op": "enqueue", "rid": 2, "queue": "q", "payload": 2}))
    )
    assert await conn.closed() == 1007
    # The frame before the bad one was handled; the one after it was not.
    assert broker.backend.table.queue("q").stats().ready == 1


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
async def test_a_peer_closed_for_garbage_gets_every_reply_before_the_close(
    client: ClientFactory,
) -> None:
    # An enqueue, then ten bad frames, in one write: with a durable store the enqueue's
    # reply waits for its commit, and the close must wait behind it, not overtake it.
    conn = await client()
    frames = [enqueue(payload="kept")] + ["nope"] * 10
    async with conn.ws.send_context():
        for frame in frames:
            conn.ws.protocol.send_text(frame.encode())
    replies = [await conn.recv() for _ in frames]
    assert replies[0]["ok"] is True and replies[0]["rid"] == 1
    assert [r["error"]["code"] for r in replies[1:]] == ["bad_json"] * 10
    assert all(r["rid"] is None for r in replies[1:])
    assert await conn.closed() == 1008
    other = await client()
    assert (await other.call("get_job", id=replies[0]["id"]))["job"]["payload"] == "kept"


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
@with_config(ping_timeout_s=1.0)
async def test_a_peer_that_pipelines_large_replies_and_never_reads_holds_bounded_memory(
    broker: Broker,
    client: ClientFactory,
    no_errors_logged: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held: asyncio.Queue[Socket] = asyncio.Queue()
    hold = Socket.hold

    def noting_holds(ws: Socket) -> None:
        held.put_nowait(ws)
        hold(ws)

    monkeypatch.setattr(Socket, "hold", noting_holds)
    ended: asyncio.Queue[Connection] = asyncio.Queue()
    release = Connection.release

    def noting_ends(conn: Connection) -> None:
        ended.put_nowait(conn)
        release(conn)

    monkeypatch.setattr(Connection, "release", noting_ends)
    publisher = await client()
    job_id = (await publisher.call("enqueue", queue="big", payload="x" * 900_000))["id"]
    # 2,000 get_job requests for a 0.9 MB job in one small write (about 2 GB of replies),
    # from a peer that never reads them.
    hog = await client(sock=stalled_socket(broker.url), max_queue=1, ping_interval=None)
    ask = orjson.dumps({"op": "get_job", "rid": 1, "id": job_id})
    async with hog.ws.send_context():
        for _ in range(2000):
            hog.ws.protocol.send_text(ask)
    ws = await asyncio.wait_for(held.get(), WAIT)
    [conn] = [c for c in broker.connections if c.ws is ws]
    # Reading paused once a MiB was unsent: what waits is that and the reply that
    # crossed it (the other 1,998 or so requests wait unread).
    assert conn.reading_held
    assert conn.unsent_bytes < broker.config.max_unsent_bytes + 1_000_000
    # Others are served meanwhile, and the hog is dropped once its socket stays full for
    # the ping timeout.
    assert (await publisher.call("get_job", id=job_id))["job"]["id"] == job_id
    assert await asyncio.wait_for(ended.get(), WAIT) is conn
    assert conn not in broker.connections
