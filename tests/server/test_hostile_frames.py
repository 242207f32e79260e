"""Hostile frames down the whole frame path, on both stores (docs/protocol.md §2, §3, §10).

Hypothesis writes request frames as raw JSON text, so that it can say what a Python
encoder cannot: lone surrogate escapes, integers past 64 bits, ``1e400``, ``NaN``,
repeated member names, nesting past 1024 levels. Every op of the real op table is drawn,
with sane values in most fields and hostile ones in a few, beside unknown ops, garbage,
binary frames and frames over ``max_frame_bytes``.

What a peer relies on, checked for each frame: exactly one answer comes (none for a
fire-and-forget request that succeeds); it carries the frame's ``rid`` when the frame
decodes to an object with a valid ``rid``, else ``null``; it is a success or an error
with a documented code (``internal`` is a bug); a frame over the limit closes 1009 and
nothing else closes the connection. After each example the broker still answers a
``ping`` and an enqueued job reads back, and nothing was logged as an error.

A ``ping`` follows every hostile frame: it marks where that frame's answers end (a
connection's replies leave in order) and resets the bad-frames-in-a-row count, so
that the close rule of docs/protocol.md §6 stays out of the way.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from conveyor.broker.server import Broker
from conveyor.sdk._wire import INT_MAX, INT_MIN, MAX_RID_CHARS, OPS, Field, Kind, Rid

from .conftest import BOTH_STORES, RawClient, with_config
from .test_bad_input import CODES, JSON_VALUES, field_values

pytestmark = BOTH_STORES

MAX_FRAME = 65536
hostile_limits = with_config(max_frame_bytes=MAX_FRAME, max_payload_bytes=MAX_FRAME)
EXAMPLES = 150
EXAMPLE_S = 20.0  # seconds one example may take (a few dozen round trips, some fsyncs)
# Stands for "a fresh valid rid" in a drawn frame. json.dumps escapes NUL, so no drawn
# JSON text holds it by chance.
FRESH_RID = "\x00rid\x00"


def nested(depth: int, opener: str = "[", inner: str = "1") -> str:
    """``inner`` inside ``depth`` arrays (``opener="["``) or objects (``opener="{"``)."""
    if opener == "[":
        return "[" * depth + inner + "]" * depth
    return '{"a":' * depth + inner + "}" * depth


def text(value: str) -> str:
    """A JSON string literal."""
    return orjson.dumps(value).decode()


# Raw JSON texts (some of them not JSON at all) for a member's value.
SURROGATES = ['"\\ud800"', '"x\\udfff"', '"\\udc00\\ud800"', '"\\ud800\\u0041"', '"\\ud83d\\ude00"']
NUMBERS = [
    *(str(n) for n in (INT_MAX, INT_MAX + 1, INT_MIN, INT_MIN - 1, 2**64, -(2**64))),
    "9" * 400,
    "-" + "9" * 400,
    "1" + "0" * 308,
    "1e400",
    "-1e400",
    "1e-400",
    "-0.0",
    "-0",
    "3.0",
    "1e0",
]
NOT_JSON = ["NaN", "Infinity", "-Infinity", "01", "+1", ".5", "'q'", "[1,]", "tru", '"\\x41"']
DUPLICATES = ['{"a": 1, "a": 2}', '{"id": "x", "id": 1}']
# Payload nesting is refused past 254 levels, frame nesting past 1024.
DEPTHS = [253, 254, 255, 1023, 1024, 1025, 5000]
LENGTHS = [MAX_RID_CHARS + 1, 129, 1025, 4096, MAX_FRAME + 1]

HOSTILE_VALUES = st.one_of(
    st.sampled_from(SURROGATES + NUMBERS + NOT_JSON + DUPLICATES),
    st.builds(nested, st.sampled_from(DEPTHS), st.sampled_from("[{")),
    st.sampled_from(LENGTHS).map(lambda n: text("x" * n)),
    JSON_VALUES.map(json.dumps),  # a valid value of the wrong type, mostly
)
HOSTILE_RIDS = st.sampled_from(
    [
        *SURROGATES,
        *NUMBERS,
        "true",
        "[1]",
        "{}",
        "1.5",
        "null",
        text("r" * MAX_RID_CHARS),
        text("r" * (MAX_RID_CHARS + 1)),
        nested(1025),
    ]
)
HOSTILE_NAMES = st.sampled_from(['"\\ud800"', text("k" * 5000), '"rid"', '"op"', '""'])
OP_NAMES = st.sampled_from([*sorted(OPS), "PING", "ping ", "enqueu", ""])


QUEUES = st.sampled_from(["q", "fuzz"])


def sane_value(f: Field) -> st.SearchStrategy[Any]:
    """A value for ``f`` of the type the op table gives it, mostly within its range."""
    if f.kind is Kind.STRING:
        return QUEUES if f.name == "queue" else st.text(min_size=1, max_size=12)
    if f.kind is Kind.INTEGER:
        return st.integers(0, 10)
    if f.kind is Kind.NUMBER:
        return st.floats(0, 10)
    if f.kind is Kind.ANY:
        return JSON_VALUES
    if f.kind is Kind.STRINGS:
        return st.lists(QUEUES, min_size=1, max_size=2, unique=True)
    entries = st.fixed_dictionaries(
        {sub.name: sane_value(sub) for sub in f.items if sub.required},
        optional={sub.name: sane_value(sub) for sub in f.items if not sub.required},
    )
    return st.lists(entries, min_size=1, max_size=3)


def member_value(f: Field) -> st.SearchStrategy[str]:
    """JSON text for field ``f``: sane, or as the sloppy fuzz test of test_bad_input draws
    it (of any type, NaN and big integers written as json.dumps writes them)."""
    drawn = (sane_value(f) | sane_value(f) | field_values(f)).map(json.dumps)
    if f.kind is Kind.ANY:  # a payload at, just past and far past its nesting limit
        return drawn | st.builds(nested, st.sampled_from(DEPTHS), st.sampled_from("[{"))
    return drawn


@st.composite
def hostile_requests(draw: st.DrawFn) -> str:
    """One request frame as raw JSON text: a real op's fields, a few of them hostile."""
    op = draw(OP_NAMES)
    members = [('"op"', text(op))]
    rid = draw(st.sampled_from(["fresh"] * 8 + ["none", "hostile"]))
    if rid == "fresh":
        members.append(('"rid"', FRESH_RID))
    elif rid == "hostile":
        members.append(('"rid"', draw(HOSTILE_RIDS)))
    spec = OPS.get(op)
    for f in spec.fields if spec is not None else ():
        if f.required or draw(st.booleans()):
            members.append((text(f.name), draw(member_value(f))))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        value = draw(HOSTILE_VALUES)
        how = draw(st.sampled_from(["own", "twice", "field", "field"]))
        if how == "own":  # a hostile member of its own
            members.append((draw(HOSTILE_NAMES), value))
        elif how == "twice":  # a member twice
            members.append(draw(st.sampled_from(members)))
        else:  # a hostile value in a field of the op (or in rid, or in op)
            i = draw(st.integers(0, len(members) - 1))
            members[i] = (members[i][0], value)
    order = draw(st.permutations(members))
    return "{" + ",".join(f"{name}:{value}" for name, value in order) + "}"


OTHER_FRAMES: st.SearchStrategy[str | bytes] = st.one_of(
    hostile_requests().map(str.encode),  # binary
    st.binary(max_size=40),
    st.text(max_size=100),
    HOSTILE_VALUES,  # not an object, or not JSON
    st.sampled_from(DEPTHS).map(lambda depth: nested(depth, "{", '{"op": "ping"}')),
    st.just('{"op": "ping", "rid": 1} x'),
)
# Three in four frames are requests. (one_of picks among distinct strategies evenly.)
FRAMES: st.SearchStrategy[str | bytes] = st.sampled_from([True, True, True, False]).flatmap(
    lambda request: hostile_requests() if request else OTHER_FRAMES
)


# -------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class Expected:
    """What the broker must answer to one frame."""

    rid: Rid = None  # the rid the answer carries
    code: str | None = None  # the one error code allowed, when the frame fixes it
    optional: bool = False  # fire-and-forget: no answer at all when it succeeds
    closes: bool = False  # over max_frame_bytes: no answer, close 1009
    late: bool = False  # a wait: its answer may come after later frames' (see Prober)


def valid_rid(rid: Any) -> bool:
    """docs/protocol.md §3: an integer in the 64-bit range, or a string of up to 64."""
    if isinstance(rid, str):
        return len(rid) <= MAX_RID_CHARS
    return type(rid) is int and INT_MIN <= rid <= INT_MAX


def expected(frame: str | bytes) -> Expected:
    """The answer docs/protocol.md §2 and §3 demand for ``frame``."""
    if len(frame if isinstance(frame, bytes) else frame.encode()) > MAX_FRAME:
        return Expected(closes=True)
    if isinstance(frame, bytes):
        return Expected(code="bad_frame")
    try:
        obj = orjson.loads(frame)  # the one decoder: what it refuses is bad_json
    except orjson.JSONDecodeError:
        return Expected(code="bad_json")
    if not isinstance(obj, dict):
        return Expected(code="bad_frame")
    rid = obj.get("rid")
    if rid is None:
        return Expected(optional=True)
    if not valid_rid(rid):
        return Expected(code="invalid_argument")
    return Expected(rid=rid, late=obj.get("op") == "wait")


def check_answers(frame: str | bytes, answers: list[dict[str, Any]], want: Expected) -> None:
    """Assert that ``answers`` (the replies before the next ping's) are what ``want`` says."""
    where = f"frame {frame[:200]!r}: answers {answers}"
    if (want.optional or want.late) and not answers:
        return
    assert len(answers) == 1, where
    [answer] = answers
    assert answer["rid"] == want.rid, where
    if answer["ok"] is True:
        assert want.code is None and want.rid is not None, where
        for result in answer.get("results") or []:  # enqueue_each: each job's own outcome
            assert "id" in result or result["error"]["code"] in CODES, where
        return
    assert answer["ok"] is False, where
    code = answer["error"]["code"]
    assert code in CODES, where
    assert want.code in (None, code), where


# -------------------------------------------------------------------------- the test


def with_rid(frame: str | bytes, rid: str) -> str | bytes:
    """``frame`` with its placeholder (if any) replaced by ``rid``, a JSON literal."""
    if isinstance(frame, bytes):
        return frame.replace(FRESH_RID.encode(), rid.encode())
    return frame.replace(FRESH_RID, rid)


class Prober:
    """One connection sending hostile frames, each followed by a marking ping."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ws: Any = None
        self.marks = itertools.count()
        # The rids of waits sent: their answers may come later, after other replies
        # (docs/protocol.md §3), so they are not counted as any frame's answer.
        self.late: set[Any] = set()

    async def open(self) -> None:
        self.ws = await connect(self.url, max_size=None)

    async def answers(self, frame: str | bytes) -> list[dict[str, Any]] | int:
        """The replies to ``frame`` (pushes skipped), or the close code if it closed."""
        mark = f"mark-{next(self.marks)}"
        got: list[dict[str, Any]] = []
        try:
            await self.ws.send(frame)
            await self.ws.send(orjson.dumps({"op": "ping", "rid": mark}).decode())
            while True:
                reply = orjson.loads(await self.ws.recv())
                assert isinstance(reply, dict), reply
                if "push" in reply:
                    continue
                if reply.get("ok") is True and "state" in reply and reply["rid"] in self.late:
                    continue  # a wait's answer, whenever it comes
                if reply["rid"] == mark:
                    assert reply["ok"] is True, reply
                    return got
                got.append(reply)
        except ConnectionClosed:
            code: int = self.ws.close_code
            await self.open()
            return code


async def still_serves(url: str, n: int) -> None:
    """A fresh connection pings, enqueues and reads its job back."""
    client = RawClient(await connect(url))
    try:
        assert (await client.request("ping"))["ok"] is True
        job_id = (await client.call("enqueue", queue=f"roundtrip.{n}", payload={"n": n}))["id"]
        job = (await client.call("get_job", id=job_id))["job"]
        assert (job["queue"], job["payload"]) == (f"roundtrip.{n}", {"n": n})
    finally:
        await client.ws.close()


@hostile_limits
async def test_every_hostile_frame_gets_one_documented_answer(
    broker: Broker, no_errors_logged: None
) -> None:
    loop = asyncio.get_running_loop()
    prober = Prober(broker.url)
    await prober.open()
    rids = itertools.count(1)
    examples = itertools.count(1)

    def fresh_rid() -> str:
        n = next(rids)
        return str(n) if n % 2 else text(f"h{n}")  # integers and strings

    async def one_example(frames: list[str | bytes]) -> None:
        async with asyncio.timeout(EXAMPLE_S):
            for frame in frames:
                sent = with_rid(frame, fresh_rid())
                want = expected(sent)
                if want.late:
                    prober.late.add(want.rid)
                got = await prober.answers(sent)
                if want.closes:
                    assert got == 1009, (frame[:200], got)
                else:
                    assert not isinstance(got, int), f"closed {got} after {frame[:200]!r}"
                    check_answers(sent, got, want)
            await still_serves(broker.url, next(examples))

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(FRAMES, min_size=1, max_size=8))
    def run_example(frames: list[str | bytes]) -> None:
        # Hypothesis drives this from a worker thread; the broker lives on the test's loop.
        future = asyncio.run_coroutine_threadsafe(one_example(frames), loop)
        future.result(timeout=EXAMPLE_S + 1)

    try:
        await asyncio.to_thread(run_example)
    finally:
        await prober.ws.close()
    assert next(examples) > EXAMPLES // 2  # hypothesis really ran the examples
