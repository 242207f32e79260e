"""The wire codec and the op table (sdk/_wire.py), with no server and no event loop.

Also checks that docs/protocol.md names every op, field, error code, close code and push
that the code defines, so the page cannot fall behind the table.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.sdk import _wire as wire
from conveyor.sdk._wire import (
    OPS,
    ErrorCode,
    Field,
    Kind,
    Op,
    Role,
    WireError,
    check_entry,
    decode,
    encode,
    encode_payload,
    raw_json,
    validate_request,
)

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"

# The codes each stage may raise (docs/protocol.md, "Order of checks").
DECODE_CODES = {ErrorCode.BAD_JSON, ErrorCode.BAD_FRAME}
VALIDATE_CODES = {ErrorCode.INVALID_ARGUMENT, ErrorCode.UNKNOWN_OP, ErrorCode.TOO_LARGE}


def raises(code: ErrorCode, fn: Any, *args: Any, **kwargs: Any) -> WireError:
    with pytest.raises(WireError) as info:
        fn(*args, **kwargs)
    assert info.value.code is code, info.value
    return info.value


def sample(kind: Kind) -> Any:
    """A valid value of each kind, for building requests from the table."""
    return {
        Kind.STRING: "s",
        Kind.INTEGER: 1,
        Kind.NUMBER: 1.5,
        Kind.ANY: {"any": [1, None]},
        Kind.STRINGS: ["a", "b"],
        Kind.BOOLEAN: True,
    }[kind]


def minimal(op: str) -> dict[str, Any]:
    """The smallest valid request of ``op``: its required fields only."""
    frame: dict[str, Any] = {"op": op, "rid": 1}
    for f in OPS[op].fields:
        if f.required:
            frame[f.name] = sample_field(f)
    return frame


def sample_field(f: Field) -> Any:
    if f.kind is Kind.OBJECTS:
        return [{sub.name: sample_field(sub) for sub in f.items if sub.required}]
    if f.kind is Kind.OBJECT:
        return {sub.name: sample_field(sub) for sub in f.items if sub.required}
    return sample(f.kind)


def every_field() -> list[tuple[str, str, Field]]:
    """(op, path, field) for every field of every op, nested ones included (as entry 0)."""
    out = []
    for name, spec in OPS.items():
        for f in spec.fields:
            out.append((name, f.name, f))
            # An array's entry 0 (``jobs[0].priority``), an object's member (``schedule.tz``).
            at = f"{f.name}." if f.kind is Kind.OBJECT else f"{f.name}[0]."
            for sub in f.items:
                out.append((name, f"{at}{sub.name}", sub))
    return out


def with_entry(frame: dict[str, Any], outer: str) -> dict[str, Any]:
    """Entry 0 of the array field ``outer``, made (with its required members) if absent."""
    if outer not in frame:
        frame[outer] = sample_field(OPS[frame["op"]].by_name[outer])
    entry: dict[str, Any] = frame[outer][0]
    return entry


def put(frame: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` (``"x"``, ``"x[0].y"`` or ``"x.y"``) in a frame built by ``minimal``."""
    if "[0]." in path:
        outer, inner = path.split("[0].")
        with_entry(frame, outer)[inner] = value
    elif "." in path:
        outer, inner = path.split(".")
        frame[outer][inner] = value
    else:
        frame[path] = value


def check_all(frame: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    """``validate_request``, then ``check_entry`` on each entry of an ``each`` field, as
    the broker's op does (an entry's error travels in that request's reply: its rid)."""
    op, rid, fields = validate_request(frame)
    for f in OPS[op].fields:
        if f.each:
            try:
                fields[f.name] = [check_entry(f, item, i) for i, item in enumerate(fields[f.name])]
            except WireError as exc:
                exc.rid = rid
                raise
    return op, rid, fields


# --------------------------------------------------------------------------- decode


def test_decode_object() -> None:
    assert decode('{"op": "ping", "rid": 1}') == {"op": "ping", "rid": 1}
    assert decode(b' {"a": [1, 2.5, null, true, "\xc3\xa9"]} ') == {"a": [1, 2.5, None, True, "é"]}


@pytest.mark.parametrize("text", ["[]", "1", '"x"', "null", "true", "[{}]"])
def test_decode_non_object_is_bad_frame(text: str) -> None:
    err = raises(ErrorCode.BAD_FRAME, decode, text)
    assert err.field is None and err.rid is None


@pytest.mark.parametrize(
    "data",
    [
        "",
        "{",
        "{'a': 1}",
        '{"a": NaN}',
        '{"a": Infinity}',
        '{"a": 1,}',
        "{} {}",
        "\ufeff{}",
        '{"a": "\\ud800"}',
        b"\xff",
        b'{"a": "\xc3"}',
        "[" * 1025 + "]" * 1025,
    ],
)
def test_decode_invalid_is_bad_json(data: str | bytes) -> None:
    err = raises(ErrorCode.BAD_JSON, decode, data)
    assert err.message.startswith("invalid JSON")


def test_decode_depth_limit_is_1024() -> None:
    assert "a" in decode('{"a":' + "[" * 1023 + "]" * 1023 + "}")  # 1024 levels
    raises(ErrorCode.BAD_JSON, decode, '{"a":' + "[" * 1024 + "]" * 1024 + "}")


def test_decode_numbers() -> None:
    frame = decode('{"i": 3, "f": 3.0, "e": 1e2, "big": 18446744073709551615, "huge": 1e30}')
    assert type(frame["i"]) is int and type(frame["f"]) is float and type(frame["e"]) is float
    assert frame["big"] == 2**64 - 1
    assert decode('{"x": 123456789012345678901234567890}')["x"] == pytest.approx(1.2345678e29)


def test_binary_frame_error() -> None:
    err = wire.binary_frame_error()
    assert err.code is ErrorCode.BAD_FRAME
    assert err.reply()["rid"] is None


# Arbitrary input: the decoder answers a dict or a documented WireError, never anything else.

_any_text = st.text(st.characters(exclude_categories=()))
_json_tokens = st.lists(
    st.sampled_from(
        [
            "{",
            "}",
            "[",
            "]",
            ":",
            ",",
            " ",
            '"op"',
            '"rid"',
            '"a"',
            "1",
            "-0.5e3",
            "null",
            "true",
            "NaN",
            "1e999",
            '"\\ud800"',
            '"\\u00e9"',
            "\ufeff",
            '"',
            "\\",
        ]
    ),
    max_size=40,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(), _any_text, _json_tokens, _json_tokens.map(str.encode)))
def test_decode_fuzz(data: str | bytes) -> None:
    try:
        frame = decode(data)
    except WireError as exc:
        assert exc.code in DECODE_CODES
        assert isinstance(exc.message, str) and exc.field is None
    else:
        assert isinstance(frame, dict)


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_encode_decode_round_trip(value: Any) -> None:
    data = encode(value)
    if isinstance(value, dict):
        assert decode(data) == value
        assert decode(data.decode()) == value
    else:
        raises(ErrorCode.BAD_FRAME, decode, data)


# --------------------------------------------------------------------------- encode


def test_encode_splices_raw_json() -> None:
    frame = {"push": "jobs", "jobs": [{"id": "j1", "payload": raw_json(b'{"x": [1, 2]}')}]}
    assert encode(frame) == b'{"push":"jobs","jobs":[{"id":"j1","payload":{"x": [1, 2]}}]}'
    assert decode(encode({"p": raw_json("[1]")})) == {"p": [1]}


def test_encode_refuses_what_json_cannot_hold() -> None:
    class Key(StrEnum):
        A = "a"

    for bad in ({1: 2}, {Key.A: 1}, {"s": {1, 2}}, 2**64, "\ud800"):
        with pytest.raises(TypeError):
            encode(bad)


def test_encode_payload() -> None:
    assert encode_payload({"a": [1, "null", None]}) == b'{"a":[1,"null",null]}'
    assert encode_payload(None) == b"null"
    for bad in (math.nan, [1, {"x": math.inf}], {"y": (-math.inf,)}):
        err = raises(ErrorCode.INVALID_ARGUMENT, encode_payload, bad)
        assert err.field == "payload" and err.message.startswith("payload: ")
    err = raises(ErrorCode.INVALID_ARGUMENT, encode_payload, {1: 2}, field="jobs[2].payload")
    assert err.field == "jobs[2].payload"
    raises(ErrorCode.INVALID_ARGUMENT, encode_payload, {"s": {1}})
    assert encode_payload({"k": "v"}, max_bytes=9) == b'{"k":"v"}'
    err = raises(ErrorCode.TOO_LARGE, encode_payload, {"k": "v"}, max_bytes=8)
    assert err.field == "payload"


def test_encode_payload_depth() -> None:
    def nest(n: int) -> Any:
        value: Any = []
        for _ in range(n - 1):
            value = [value]
        return value

    assert encode_payload(nest(wire.MAX_PAYLOAD_DEPTH)).count(b"[") == wire.MAX_PAYLOAD_DEPTH
    err = raises(ErrorCode.INVALID_ARGUMENT, encode_payload, nest(wire.MAX_PAYLOAD_DEPTH + 1))
    assert "deeper than 254" in err.message


# --------------------------------------------------------------------------- the envelope


@pytest.mark.parametrize("rid", [0, -5, 2**63 - 1, -(2**63), "", "abc", "x" * 64])
def test_rid_accepted_and_returned(rid: int | str) -> None:
    assert validate_request({"op": "ping", "rid": rid}) == (Op.PING, rid, {})


def test_rid_absent_or_null_is_fire_and_forget() -> None:
    assert validate_request({"op": "ping"})[1] is None
    assert validate_request({"op": "ping", "rid": None})[1] is None


@pytest.mark.parametrize("rid", [True, 1.5, 1.0, [], {}, "x" * 65, 2**63, -(2**63) - 1, 10**400])
def test_bad_rid(rid: Any) -> None:
    err = raises(ErrorCode.INVALID_ARGUMENT, validate_request, {"op": "ping", "rid": rid})
    assert err.field == "rid" and err.rid is None
    assert err.reply() == {"rid": None, "ok": False, "error": err.error_object()}


def test_op_missing_or_not_a_string() -> None:
    for frame in ({"rid": 3}, {"rid": 3, "op": None}, {"rid": 3, "op": 7}):
        err = raises(ErrorCode.INVALID_ARGUMENT, validate_request, frame)
        assert err.field == "op" and err.rid == 3


def test_unknown_op_echoes_rid_and_a_short_name() -> None:
    err = raises(ErrorCode.UNKNOWN_OP, validate_request, {"op": "x" * 5000, "rid": "r"})
    assert err.rid == "r" and err.field == "op" and len(err.message) < 120
    raises(ErrorCode.UNKNOWN_OP, validate_request, {"op": "ENQUEUE"})


def test_parse_envelope_leaves_fields_alone() -> None:
    spec, rid = wire.parse_envelope({"op": "enqueue", "rid": 4, "priority": True})
    assert spec is OPS["enqueue"] and rid == 4


# --------------------------------------------------------------------------- fields


def test_enqueue_defaults_filled() -> None:
    op, rid, fields = validate_request({"op": "enqueue", "rid": 1, "queue": "q", "payload": 5})
    assert (op, rid) == (Op.ENQUEUE, 1)
    assert fields == {
        "queue": "q",
        "payload": 5,
        "priority": 0,
        "delay_s": None,
        "run_at": None,
        "expires_s": None,
        "visibility_timeout_s": None,
        "max_attempts": None,
        "backoff_base_s": None,
        "key": None,
        "timeout_s": None,
        "partition": None,
        "after": [],
    }


def test_null_means_not_set_but_null_payload_is_a_value() -> None:
    frame = {"op": "enqueue", "queue": "q", "payload": None, "priority": None, "delay_s": None}
    fields = validate_request(frame)[2]
    assert fields["payload"] is None and fields["priority"] == 0 and fields["delay_s"] is None
    err = raises(ErrorCode.INVALID_ARGUMENT, validate_request, {"op": "enqueue", "queue": "q"})
    assert err.field == "payload" and "missing" in err.message
    err = raises(
        ErrorCode.INVALID_ARGUMENT, validate_request, {"op": "enqueue", "queue": None, "payload": 1}
    )
    assert err.field == "queue" and "null" in err.message


@pytest.mark.parametrize("op", sorted(OPS))
def test_minimal_request_of_every_op(op: str) -> None:
    name, rid, fields = check_all(minimal(op))
    assert name == op and rid == 1
    assert set(fields) == {f.name for f in OPS[op].fields}


@pytest.mark.parametrize(
    ("op", "path"),
    [(op, path) for op, path, f in every_field() if f.required],
)
def test_missing_required_field(op: str, path: str) -> None:
    frame = minimal(op)
    if "[0]." in path:
        outer, inner = path.split("[0].")
        del with_entry(frame, outer)[inner]
    elif "." in path:
        outer, inner = path.split(".")
        del frame[outer][inner]
    else:
        del frame[path]
    err = raises(ErrorCode.INVALID_ARGUMENT, check_all, frame)
    assert err.field == path and err.message.startswith(f"{path}: ") and err.rid == 1


_WRONG: dict[Kind, list[Any]] = {
    Kind.STRING: [1, True, [], {}],
    Kind.INTEGER: [True, False, 1.0, 1.5, "1", []],
    Kind.NUMBER: [True, False, "1.5", [], {}],
    Kind.STRINGS: ["a", {}, 3, [1], ["a", None]],
    Kind.OBJECTS: [{}, "x", [1], [None], [[]]],
    Kind.OBJECT: [[], "x", 1, True],
    Kind.BOOLEAN: [1, 0, "true", [], {}],
}


@pytest.mark.parametrize(
    ("op", "path", "value"),
    [(op, path, value) for op, path, f in every_field() for value in _WRONG.get(f.kind, [])],
)
def test_wrong_type_named(op: str, path: str, value: Any) -> None:
    frame = minimal(op)
    put(frame, path, value)
    err = raises(ErrorCode.INVALID_ARGUMENT, check_all, frame)
    assert err.field is not None and err.field.startswith(path)
    assert err.message.startswith(f"{err.field}: ")


@pytest.mark.parametrize(("op", "path", "f"), every_field())
def test_right_type_accepted(op: str, path: str, f: Field) -> None:
    frame = minimal(op)
    put(frame, path, sample_field(f))
    check_all(frame)
    if f.kind is Kind.NUMBER:
        put(frame, path, 7)  # an integer is a number
        check_all(frame)


def test_unknown_field_named_and_rid_echoed() -> None:
    frame = {"op": "ack", "rid": 9, "id": "j", "lease": "l", "leese": "x"}
    err = raises(ErrorCode.INVALID_ARGUMENT, validate_request, frame)
    assert err.field == "leese" and err.rid == 9
    frame = {"op": "ack", "id": "j", "lease": "l", "z" * 10_000: 1}
    err = raises(ErrorCode.INVALID_ARGUMENT, validate_request, frame)
    assert err.field is not None and len(err.field) < 80 and err.rid is None


def test_batch_entries_checked_with_paths() -> None:
    frame: dict[str, Any] = {
        "op": "enqueue_batch",
        "rid": 2,
        "queue": "q",
        "jobs": [{"payload": 1}, {"payload": 2, "priority": True}],
    }
    err = raises(ErrorCode.INVALID_ARGUMENT, validate_request, frame)
    assert (err.field, err.rid) == ("jobs[1].priority", 2)
    frame["jobs"] = [{"payload": 1}, {"payload": 2, "bogus": 1}]
    assert raises(ErrorCode.INVALID_ARGUMENT, validate_request, frame).field == "jobs[1].bogus"
    frame["jobs"] = [{"payload": 1}, 5]
    assert raises(ErrorCode.INVALID_ARGUMENT, validate_request, frame).field == "jobs[1]"
    frame["jobs"] = [{"payload": None, "key": "k", "delay_s": 2}]
    jobs = validate_request(frame)[2]["jobs"]
    assert jobs == [
        {
            "payload": None,
            "priority": 0,
            "delay_s": 2,
            "run_at": None,
            "expires_s": None,
            "visibility_timeout_s": None,
            "max_attempts": None,
            "backoff_base_s": None,
            "key": "k",
            "timeout_s": None,
            "partition": None,
            "after": [],
        }
    ]
    frame["jobs"] = []
    assert validate_request(frame)[2]["jobs"] == []


def test_subscribe_shape() -> None:
    base = {"op": "subscribe", "worker_id": "w", "queues": ["a", "b"]}
    fields = validate_request(base)[2]
    assert fields == {"worker_id": "w", "queues": ["a", "b"], "prefetch": 16, "leases": []}
    fields["leases"].append("mutated")
    assert validate_request(base)[2]["leases"] == []  # a fresh default each time
    bad: list[tuple[dict[str, Any], str]] = [
        ({"worker_id": ""}, "worker_id"),
        ({"queues": []}, "queues"),
        ({"queues": ["a", "b", "a"]}, "queues[2]"),
        ({"queues": ["a", 1]}, "queues[1]"),
        ({"leases": [{"id": "j"}]}, "leases[0].lease"),
        ({"prefetch": 2.0}, "prefetch"),
    ]
    for patch, field in bad:
        err = raises(ErrorCode.INVALID_ARGUMENT, validate_request, {**base, **patch})
        assert err.field == field
    leases = [{"id": "j", "lease": "l"}]
    assert validate_request({**base, "leases": leases})[2]["leases"] == leases


def test_ranges_are_not_checked_here() -> None:
    # Ranges belong to the engine (docs/contract.md, ENQ-9) or the broker (max_prefetch).
    frame = {
        "op": "enqueue",
        "queue": "not a valid name!",
        "payload": 1,
        "priority": 2**40,
        "delay_s": -1,
        "max_attempts": 0,
    }
    validate_request(frame)
    validate_request({"op": "subscribe", "worker_id": "w", "queues": ["q"], "prefetch": 0})


@pytest.mark.parametrize(
    ("op", "path"),
    [(op, path) for op, path, f in every_field() if f.batch],
)
def test_batch_limit(op: str, path: str) -> None:
    frame = minimal(op)
    entry = sample_field(OPS[op].by_name[path])[0]
    frame[path] = [entry] * 3
    validate_request(frame, max_batch=3)
    validate_request(frame)
    err = raises(ErrorCode.TOO_LARGE, validate_request, frame, max_batch=2)
    assert err.field == path and err.rid == 1


def test_batch_fields_are_the_documented_ones() -> None:
    batch = {(op, path) for op, path, f in every_field() if f.batch}
    assert batch == {
        ("enqueue_batch", "jobs"),
        ("enqueue_each", "jobs"),
        ("ack_batch", "items"),
        ("heartbeat_batch", "items"),
        ("progress", "items"),
        ("subscribe", "leases"),
        ("cancel_batch", "ids"),
        ("list_schedules", "ids"),
        ("enqueue_group", "jobs"),
    }


# Arbitrary request-shaped frames: validate_request answers or raises a documented code.

_names = st.sampled_from(
    sorted({path.split("[")[0] for _, path, _ in every_field()} | {"op", "rid", "zzz"})
)
_frames = st.fixed_dictionaries(
    {"op": st.sampled_from([*sorted(OPS), "nope"]) | _json_values},
    optional={"rid": _json_values},
).flatmap(
    lambda head: st.dictionaries(_names, _json_values, max_size=6).map(
        lambda rest: {**rest, **head}
    )
)


@settings(max_examples=500, deadline=None)
@given(_frames, st.none() | st.integers(0, 3))
def test_validate_fuzz(frame: dict[str, Any], max_batch: int | None) -> None:
    try:
        op, rid, fields = validate_request(frame, max_batch=max_batch)
    except WireError as exc:
        assert exc.code in VALIDATE_CODES
        assert exc.message.startswith(f"{exc.field}: ")
        encode(exc.reply())
    else:
        assert op in OPS and set(fields) == set(OPS[op].by_name)
        assert rid is None or isinstance(rid, int | str)


# --------------------------------------------------------------------------- roles

P, W, A, R = Role.PUBLISH, Role.WORK, Role.ADMIN, Role.READ

ROLES_BY_OP = {
    "hello": set(),
    "ping": set(),
    "enqueue": {P, A},
    "enqueue_batch": {P, A},
    "enqueue_each": {P, A},
    "get_job": {P, W, R, A},
    "wait": {P, R, A},
    "cancel": {P, A},
    "cancel_batch": {P, A},
    "stats": {P, R, A},
    "list_jobs": {P, R, A},
    "subscribe": {W, A},
    "unsubscribe": {W, A},
    "ack": {W, A},
    "retry": {W, A},
    "fail": {W, A},
    "heartbeat": {W, A},
    "ack_batch": {W, A},
    "heartbeat_batch": {W, A},
    "pause": {A},
    "resume": {A},
    "redrive": {A},
    "redrive_all": {A},
    "purge_dead": {A},
    "sweep": {A},
    "set_limits": {A},
    "set_schedule": {A},
    "delete_schedule": {A},
    "pause_schedule": {A},
    "resume_schedule": {A},
    "run_schedule": {A},
    "list_schedules": {P, R, A},
    "back_off": {W, A},
    "watch": {R, A},
    "progress": {W, A},
    "watch_job": {P, R, A},
    "unwatch_job": {P, R, A},
    "enqueue_group": {P, A},
    "dependency_results": {P, W, R, A},
}


def test_role_table() -> None:
    assert {op: set(spec.roles) for op, spec in OPS.items()} == ROLES_BY_OP
    assert set(OPS) == {op.value for op in Op}


@pytest.mark.parametrize("op", sorted(OPS))
def test_allows(op: str) -> None:
    spec = OPS[op]
    assert spec.allows(wire.ALL_ROLES)
    assert spec.allows({A})
    assert spec.allows(set()) == (not ROLES_BY_OP[op])
    for role in Role:
        assert spec.allows({role}) == (not ROLES_BY_OP[op] or role in ROLES_BY_OP[op])


# --------------------------------------------------------------------------- outgoing frames


@dataclass(frozen=True, slots=True)
class FakeJob:
    id: str = "j1"
    queue: str = "emails"
    state: str = "processing"
    payload_json: bytes = b'{"to":"a@b.c"}'
    priority: int = 3
    attempts: int = 2
    max_attempts: int = 5
    visibility_timeout_s: float = 30.0
    backoff_base_s: float = 5.0
    backoff_max_s: float = 3600.0
    enqueued_at: float = 100.0
    ready_at: float = 100.0
    expires_at: float | None = None
    worker_id: str | None = "w"
    deadline: float | None = 160.0
    last_error: str | None = "boom"
    died_at: float | None = None
    key: str | None = None
    seq: int = 1
    lease: str = "secret"
    timeout_s: float | None = 45.0
    partition: str | None = "acme"
    result_json: bytes | None = None
    completed_at: float | None = None
    progress_json: bytes | None = None
    after: tuple[str, ...] = ()
    waiting_for: int = 0


@dataclass(frozen=True, slots=True)
class FakeClaim:
    id: str = "j1"
    queue: str = "emails"
    payload_json: bytes = b'{"to":"a@b.c"}'
    attempt: int = 2
    max_attempts: int = 5
    lease: str = "L1"
    deadline: float = 160.0
    priority: int = 3
    visibility_timeout_s: float = 30.0
    timeout_s: float | None = None
    partition: str | None = None
    dependencies: int = 0


def test_pushed_job_and_jobs_push() -> None:
    entry = wire.pushed_job(FakeClaim())
    assert tuple(entry) == wire.PUSHED_JOB_FIELDS
    frame = decode(encode(wire.jobs_push([entry, entry])))
    assert frame["push"] == "jobs"
    assert frame["jobs"][0] == {
        "id": "j1",
        "queue": "emails",
        "payload": {"to": "a@b.c"},
        "attempt": 2,
        "max_attempts": 5,
        "lease": "L1",
        "deadline": 160.0,
        "priority": 3,
        "visibility_timeout_s": 30.0,
        "timeout_s": None,
        "partition": None,
        "dependencies": 0,
    }
    assert len(frame["jobs"]) == 2
    assert wire.pushed_job(FakeClaim(timeout_s=2.5))["timeout_s"] == 2.5


def test_job_info_hides_lease_and_seq() -> None:
    info = decode(encode(wire.job_info(FakeJob(), 100.0)))
    assert tuple(info) == wire.JOB_INFO_FIELDS
    assert info["payload"] == {"to": "a@b.c"} and info["state"] == "processing"
    assert info["timeout_s"] == 45.0 and info["partition"] == "acme"
    assert "lease" not in info and "seq" not in info


def test_replies() -> None:
    assert wire.ok_reply(1) == {"rid": 1, "ok": True}
    assert wire.ok_reply("a", {"landed": False}) == {"rid": "a", "ok": True, "landed": False}
    err = WireError(ErrorCode.NOT_FOUND, "queue: no such queue", "queue", rid=4)
    assert decode(encode(err.reply())) == {
        "rid": 4,
        "ok": False,
        "error": {"code": "not_found", "message": "queue: no such queue", "field": "queue"},
    }
    assert decode(encode(wire.cancelled_push(iter(["a", "b"])))) == {
        "push": "cancelled",
        "ids": ["a", "b"],
    }
    assert isinstance(err, ValueError) and str(err) == "queue: no such queue"


# --------------------------------------------------------------------------- constants


def test_error_codes_are_the_stable_set() -> None:
    assert [c.value for c in ErrorCode] == [
        "bad_json",
        "bad_frame",
        "unknown_op",
        "invalid_argument",
        "unauthorized",
        "forbidden",
        "not_found",
        "too_large",
        "limit_exceeded",
        "conflict",
        "unsupported_version",
        "internal",
        "unavailable",
        "dependency_cycle",
    ]


CLOSE_CODES = {
    "CLOSE_NORMAL": 1000,
    "CLOSE_GOING_AWAY": 1001,
    "CLOSE_INVALID_DATA": 1007,
    "CLOSE_POLICY_VIOLATION": 1008,
    "CLOSE_MESSAGE_TOO_BIG": 1009,
    "CLOSE_INTERNAL_ERROR": 1011,
    "CLOSE_SERVICE_RESTART": 1012,
    "CLOSE_TRY_AGAIN_LATER": 1013,
}


def test_constants() -> None:
    assert {name: getattr(wire, name) for name in CLOSE_CODES} == CLOSE_CODES
    assert wire.PROTOCOL_VERSION == 1 and wire.PROTOCOL_VERSION in wire.SUPPORTED_PROTOCOLS
    assert wire.WS_PATH == "/ws"
    assert all(hasattr(wire, name) for name in wire.__all__)


# --------------------------------------------------------------------------- the page


def doc_sections() -> dict[str, str]:
    """Each ``#### `op``` section of docs/protocol.md, by op name."""
    text = DOC.read_text(encoding="utf-8")
    sections = {}
    for match in re.finditer(r"^#### `(\w+)`\n(.*?)(?=^#{2,4} )", text, re.M | re.S):
        sections[match.group(1)] = match.group(2)
    return sections


def test_doc_describes_every_op_and_field() -> None:
    sections = doc_sections()
    assert set(sections) == set(OPS)
    for op, path, _ in every_field():
        name = path.rsplit(".", 1)[-1]
        # A field's row in the op's table, or its entry's members: "`{id, lease}`".
        assert f"| `{name}` |" in sections[op] or re.search(
            rf"`\{{[^`]*\b{name}\b[^`]*\}}`", sections[op]
        ), (op, path)


def test_doc_lists_codes_pushes_and_members() -> None:
    text = DOC.read_text(encoding="utf-8")
    for code in ErrorCode:
        assert f"| `{code.value}` |" in text, code
    for value in CLOSE_CODES.values():
        assert f"| {value} |" in text, value
    for push in wire.Push:
        assert f"### `{push.value}`" in text, push
    for member in (*wire.JOB_INFO_FIELDS, *wire.PUSHED_JOB_FIELDS):
        assert f"| `{member}` |" in text, member
    assert "ws://HOST:PORT/ws" in text


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1e999}',  # too large for a double
        '{"b": [-1e400]}',
        '{"rid": 1e400, "rid": 1}',  # even where a later duplicate would replace it
        '{"a": 1, "b": NaN}',
        '{"k": "\\ud800"}',  # a lone surrogate, as an escape
        '{"k": "\\udc00x"}',
        '{"a": 1' + "0" * 400 + "}",  # an integer of hundreds of digits
    ],
)
def test_decode_refuses_what_orjson_refuses_as_bad_json(text: str) -> None:
    # One decoder, one set of rules: nothing falls back to a laxer parser that would let
    # lone surrogates or huge integers through to the stores and the feed.
    with pytest.raises(WireError) as caught:
        decode(text)
    assert caught.value.code == "bad_json"


def test_decode_keeps_64_bit_integers_and_a_valid_surrogate_pair() -> None:
    assert decode('{"a": 18446744073709551615, "b": "\\ud83d\\ude00"}') == {
        "a": 2**64 - 1,
        "b": "\U0001f600",
    }


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64 - 1])
def test_an_integer_field_outside_64_bits_is_refused_naming_it(value: int) -> None:
    err = raises(
        ErrorCode.INVALID_ARGUMENT,
        validate_request,
        {"op": "enqueue", "rid": 1, "queue": "q", "payload": 1, "max_attempts": value},
    )
    assert err.field == "max_attempts" and err.rid == 1
    assert "2^63" in err.message


def test_an_encoded_payload_holds_only_its_own_bytes() -> None:
    # The broker stores these bytes for every job: a buffer kept beside them would cost
    # kilobytes per job (orjson's output keeps its whole write buffer).
    import tracemalloc

    tracemalloc.start()
    try:
        kept = [encode_payload({"to": "someone@example.com", "n": i}) for i in range(200)]
        per_payload = tracemalloc.get_traced_memory()[0] / len(kept)
    finally:
        tracemalloc.stop()
    assert per_payload < 200, per_payload


# The fast check (every request's first pass) and the full check (which names the fault)
# must agree on every frame: the same fields out, or a refusal from both.


def _near_valid(f: Field) -> st.SearchStrategy[Any]:
    """Mostly valid values of a field's kind, with wrong types and nulls mixed in."""
    if f.kind is Kind.OBJECTS:
        item = st.fixed_dictionaries(
            {},
            optional={
                **{sub.name: _near_valid(sub) for sub in f.items},
                "zzz": _json_values,
            },
        )
        return st.lists(item, max_size=4) | _json_values
    if f.kind is Kind.OBJECT:
        members = st.fixed_dictionaries(
            {},
            optional={
                **{sub.name: _near_valid(sub) for sub in f.items},
                "zzz": _json_values,
            },
        )
        return members | _json_values
    if f.kind is Kind.STRINGS:
        return st.lists(st.sampled_from(["a", "b", ""]) | _json_values, max_size=4)
    valid = {
        Kind.STRING: st.sampled_from(["s", ""]),
        Kind.INTEGER: st.integers(-3, 3),
        Kind.NUMBER: st.integers(-3, 3) | st.floats(-1e3, 1e3),
        Kind.ANY: _json_values,
        Kind.BOOLEAN: st.booleans(),
    }[f.kind]
    return valid | valid | st.booleans() | st.none() | _json_values


@st.composite
def _spec_and_fields(draw: st.DrawFn) -> tuple[Any, dict[str, Any]]:
    spec = OPS[draw(st.sampled_from(sorted(OPS)))]
    frame = {}
    for f in spec.fields:
        if draw(st.integers(0, 4)):  # present four times in five
            frame[f.name] = draw(_near_valid(f))
    return spec, frame


@settings(max_examples=1000, deadline=None)
@given(_spec_and_fields(), st.none() | st.integers(0, 3))
def test_fast_check_agrees_with_the_full_check(
    case: tuple[Any, dict[str, Any]], max_batch: int | None
) -> None:
    spec, frame = case
    try:
        slow: dict[str, Any] | WireError = wire._check_object(spec.fields, frame, "", max_batch)
    except WireError as exc:
        slow = exc
    try:
        fast: dict[str, Any] | None = wire._fast_object(spec.shape, frame, max_batch)
    except wire._Explain:
        fast = None
    if isinstance(slow, WireError):
        assert fast is None, f"the fast check took what the full one refuses: {slow.message}"
    else:
        assert fast == slow
        assert list(fast) == list(slow)  # the same order, too
        assert [type(v) for v in fast.values()] == [type(v) for v in slow.values()]
        for f in spec.fields:  # an `each` field's entries: checked one by one, by the op
            if f.each:
                for i, item in enumerate(slow[f.name]):
                    _entry_checks_agree(f, item, i)


def _entry_checks_agree(f: Field, item: Any, index: int) -> None:
    try:
        slow: dict[str, Any] | WireError = wire._check_entry(f, item, f"{f.name}[{index}]", None)
    except WireError as exc:
        slow = exc
    try:
        fast = check_entry(f, item, index)
    except WireError as exc:
        assert isinstance(slow, WireError), exc
        assert (exc.field, exc.message) == (slow.field, slow.message)
        return
    assert fast == slow


def test_ack_batch_items_with_a_result_are_told_apart_by_type() -> None:
    spec = OPS["ack_batch"]
    bare = [{"id": "a", "lease": "1"}, {"id": "b", "lease": "2"}]
    checked = wire.validate_fields(spec, {"op": "ack_batch", "items": bare})
    assert type(checked["items"]) is list and checked["items"] == bare
    mixed = [{"id": "a", "lease": "1"}, {"id": "b", "lease": "2", "result": {"n": [1]}}]
    checked = wire.validate_fields(spec, {"op": "ack_batch", "items": mixed})
    assert type(checked["items"]) is wire.MoreThanPairs
    assert checked["items"] == [mixed[0], {"id": "b", "lease": "2", "result": {"n": [1]}}]
    with pytest.raises(WireError) as bad:
        wire.validate_fields(spec, {"items": [*mixed, {"id": "c", "lease": "3", "extra": 1}]})
    assert bad.value.code is ErrorCode.INVALID_ARGUMENT and bad.value.field == "items[2].extra"
    with pytest.raises(WireError) as bad:
        wire.validate_fields(spec, {"items": [{"id": "c", "lease": 3, "result": 1}]})
    assert bad.value.field == "items[0].lease"
