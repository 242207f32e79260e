"""The Conveyor wire protocol, version 1: the frame codec and the definitions both ends share.

``docs/protocol.md`` is the specification; this module is its executable half, and the
only one. The broker imports it (the SDK never imports the broker), and it is the one
module of the project that imports ``orjson``: every other module encodes and decodes
frames through :func:`encode`, :func:`encode_payload`, :func:`raw_json` and :func:`decode`.

What lives here, in the order a frame meets it:

- :func:`decode` turns one text frame into a ``dict`` (``bad_json``, ``bad_frame``).
- :func:`validate_request` checks the envelope (``rid``, ``op``) and then the op's fields
  against :data:`OPS`, the declarative table of operations (docs/protocol.md,
  "Operations"). It checks shape and types only; ranges, queue-name syntax and the other
  semantic guards are the engine's (``docs/contract.md``, ENQ-9, LIM-*) or the broker's
  (``prefetch`` against ``max_prefetch``), and are not repeated here. A broker that wants
  to check roles before fields calls :func:`parse_envelope`, checks
  :meth:`OpSpec.allows`, then :func:`validate_fields`.
- :func:`ok_reply`, :meth:`WireError.reply`, :func:`jobs_push`, :func:`cancelled_push`,
  :func:`job_info` and :func:`pushed_job` build the outgoing frames, and :func:`encode`
  turns them into bytes.

Nothing here does I/O, reads a clock or holds state.

Exceptions::

    ValueError
     └── WireError   a frame or request the protocol rejects: .code (ErrorCode), .message,
                     .field (the offending field's path, or None), .rid (echo it, or None)
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, Protocol, TypeAlias

import orjson

__all__ = [
    "ALL_ROLES",
    "CLOSE_GOING_AWAY",
    "CLOSE_INTERNAL_ERROR",
    "CLOSE_INVALID_DATA",
    "CLOSE_MESSAGE_TOO_BIG",
    "CLOSE_NORMAL",
    "CLOSE_POLICY_VIOLATION",
    "CLOSE_SERVICE_RESTART",
    "CLOSE_TRY_AGAIN_LATER",
    "DEFAULT_LIST_LIMIT",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_PREFETCH",
    "DEFAULT_SCHEDULE_LIMIT",
    "HEALTHZ_PATH",
    "INT_MAX",
    "INT_MIN",
    "JOB_INFO_FIELDS",
    "JOB_STATES",
    "MAX_LIST_LIMIT",
    "MAX_PAYLOAD_DEPTH",
    "MAX_RID_CHARS",
    "MAX_SCHEDULE_LIMIT",
    "MAX_WAIT_S",
    "METRICS_PATH",
    "OPS",
    "PROTOCOL_VERSION",
    "PUSHED_JOB_FIELDS",
    "SCHEDULE_FIELDS",
    "SCHEDULE_STATE_FIELDS",
    "SERVER_NAME",
    "SUPPORTED_PROTOCOLS",
    "WS_PATH",
    "ClaimSnapshot",
    "ErrorCode",
    "Field",
    "JobSnapshot",
    "Kind",
    "MoreThanPairs",
    "Op",
    "OpSpec",
    "Push",
    "Rid",
    "Role",
    "WireError",
    "binary_frame_error",
    "cancelled_push",
    "check_entry",
    "decode",
    "decode_value",
    "encode",
    "encode_payload",
    "job_info",
    "job_state",
    "jobs_push",
    "ok_reply",
    "parse_envelope",
    "pushed_job",
    "raw_json",
    "validate_fields",
    "validate_request",
]

# --------------------------------------------------------------------------- constants

#: The protocol version this module speaks (docs/protocol.md, "Versioning").
PROTOCOL_VERSION: Final = 1
#: Every version a ``hello`` may ask for.
SUPPORTED_PROTOCOLS: Final = frozenset({1})
#: The ``server`` field of the ``hello`` reply.
SERVER_NAME: Final = "conveyor"

#: The WebSocket endpoint; the same port serves the HTTP paths below and the dashboard at ``/``.
WS_PATH: Final = "/ws"
HEALTHZ_PATH: Final = "/healthz"
METRICS_PATH: Final = "/metrics"

#: A string ``rid`` may hold at most this many characters (code points).
MAX_RID_CHARS: Final = 64
#: Every integer of a request (an integer ``rid`` and each field typed *integer*) lies in
#: the signed 64-bit range, so no value a peer sends overflows a store's integer column
#: or the reply's encoder. Fields narrow it further (``priority``, ``max_attempts``).
INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**63 - 1
#: Arrays and objects may nest at most this deep in a payload. It is orjson's encoding limit
#: and the engine's ``MAX_PAYLOAD_DEPTH``, so any payload the broker stores can be re-encoded.
MAX_PAYLOAD_DEPTH: Final = 254
#: The largest frame a client may send when the broker's settings leave it alone; a
#: client uses it until a ``hello`` reply announces the broker's own ``max_frame_bytes``.
DEFAULT_MAX_FRAME_BYTES: Final = 1 << 20
#: ``subscribe``'s ``prefetch`` when the request leaves it out.
DEFAULT_PREFETCH: Final = 16
#: ``list_jobs``' ``limit`` when the request leaves it out, and the most it may be.
DEFAULT_LIST_LIMIT: Final = 50
MAX_LIST_LIMIT: Final = 500
#: The longest ``timeout_s`` a ``wait`` may ask for, in seconds.
MAX_WAIT_S: Final = 3600.0

# Close codes (RFC 6455 section 7.4.1 and the IANA registry), docs/protocol.md "Close codes".
#: The peer asked to close, or the broker is done with a connection in good order.
CLOSE_NORMAL: Final = 1000
#: The broker is shutting down. Reconnect with backoff.
CLOSE_GOING_AWAY: Final = 1001
#: A text frame held invalid UTF-8. Sent by the WebSocket layer, never by Conveyor itself.
CLOSE_INVALID_DATA: Final = 1007
#: Too many bad frames, a failed authentication or an authentication timeout. Do not retry
#: blindly: fix the client or its token first.
CLOSE_POLICY_VIOLATION: Final = 1008
#: A frame over ``max_frame_bytes``. The frame was not processed.
CLOSE_MESSAGE_TOO_BIG: Final = 1009
#: The broker hit a bug it cannot recover this connection from. Reconnect with backoff.
CLOSE_INTERNAL_ERROR: Final = 1011
#: The broker is restarting. Reconnect with backoff.
CLOSE_SERVICE_RESTART: Final = 1012
#: Over a connection limit (connections per token). Reconnect later, with backoff.
CLOSE_TRY_AGAIN_LATER: Final = 1013


class ErrorCode(StrEnum):
    """The stable ``error.code`` values of an error reply (docs/protocol.md, "Error codes").

    A client must treat a code it does not know like ``internal``: later servers may add
    codes, never rename or remove one.
    """

    # The frame is not valid JSON (or not UTF-8).
    BAD_JSON = "bad_json"
    # The frame is JSON but not a JSON object, or it came as a binary frame.
    BAD_FRAME = "bad_frame"
    # `op` names no operation this server knows.
    UNKNOWN_OP = "unknown_op"
    # A field is missing, unknown, of the wrong type or out of range; `field` names it.
    INVALID_ARGUMENT = "invalid_argument"
    # Credentials are needed and none (or a wrong token) were given.
    UNAUTHORIZED = "unauthorized"
    # The connection's roles do not include the operation.
    FORBIDDEN = "forbidden"
    # The operation names a queue the broker does not know.
    NOT_FOUND = "not_found"
    # A payload over max_payload_bytes, or a batch over max_batch entries.
    TOO_LARGE = "too_large"
    # A request over a configured maximum: prefetch over max_prefetch, connections per token.
    LIMIT_EXCEEDED = "limit_exceeded"
    # The request clashes with the connection's state: a second hello or subscribe.
    CONFLICT = "conflict"
    # hello asked for a protocol version this server does not speak.
    UNSUPPORTED_VERSION = "unsupported_version"
    # A bug in the broker. The message is generic: no traceback or exception text.
    INTERNAL = "internal"
    # The broker is shutting down and takes no new work; reconnect elsewhere or later.
    UNAVAILABLE = "unavailable"
    # The jobs of an enqueue_group depend on each other in a circle; `field` names one.
    DEPENDENCY_CYCLE = "dependency_cycle"


class Role(StrEnum):
    """What a token may do (docs/protocol.md, "Authentication and roles")."""

    # Enqueue jobs and look at them: enqueue, enqueue_batch, get_job, wait, watch_job,
    # unwatch_job, cancel, stats, list_jobs, list_schedules.
    PUBLISH = "publish"
    # Take and finish jobs: subscribe, unsubscribe, ack, retry, fail, heartbeat and their
    # batch forms, progress, get_job.
    WORK = "work"
    # Everything, including pause, resume, redrive, redrive_all, purge_dead, sweep,
    # set_limits and the schedule changes (set_schedule, pause_schedule, ...).
    ADMIN = "admin"
    # Look only: get_job, wait, watch_job, unwatch_job, stats, list_jobs, list_schedules
    # (and the dashboard's feed).
    READ = "read"


#: The roles a connection has when the broker has no tokens configured.
ALL_ROLES: Final = frozenset(Role)


class Op(StrEnum):
    """Every operation a request may name in ``op`` (docs/protocol.md, "Operations")."""

    HELLO = "hello"
    PING = "ping"
    ENQUEUE = "enqueue"
    ENQUEUE_BATCH = "enqueue_batch"
    ENQUEUE_EACH = "enqueue_each"
    GET_JOB = "get_job"
    CANCEL = "cancel"
    CANCEL_BATCH = "cancel_batch"
    STATS = "stats"
    LIST_JOBS = "list_jobs"
    SUBSCRIBE = "subscribe"
    UNSUBSCRIBE = "unsubscribe"
    ACK = "ack"
    RETRY = "retry"
    FAIL = "fail"
    HEARTBEAT = "heartbeat"
    ACK_BATCH = "ack_batch"
    HEARTBEAT_BATCH = "heartbeat_batch"
    PAUSE = "pause"
    RESUME = "resume"
    REDRIVE = "redrive"
    REDRIVE_ALL = "redrive_all"
    PURGE_DEAD = "purge_dead"
    SWEEP = "sweep"
    SET_LIMITS = "set_limits"
    BACK_OFF = "back_off"
    WATCH = "watch"
    SET_SCHEDULE = "set_schedule"
    DELETE_SCHEDULE = "delete_schedule"
    PAUSE_SCHEDULE = "pause_schedule"
    RESUME_SCHEDULE = "resume_schedule"
    RUN_SCHEDULE = "run_schedule"
    LIST_SCHEDULES = "list_schedules"
    WAIT = "wait"
    PROGRESS = "progress"
    WATCH_JOB = "watch_job"
    UNWATCH_JOB = "unwatch_job"
    ENQUEUE_GROUP = "enqueue_group"
    DEPENDENCY_RESULTS = "dependency_results"


class Push(StrEnum):
    """The ``push`` values of frames the broker sends unasked (docs/protocol.md, "Pushes")."""

    # Jobs claimed for this subscribed connection: {"push": "jobs", "jobs": [...]}.
    JOBS = "jobs"
    # Jobs this connection holds were cancelled: {"push": "cancelled", "ids": [...]}.
    CANCELLED = "cancelled"
    # The dashboard feed after `watch`: queues, workers, a followed job, a dead-letter page.
    SNAPSHOT = "snapshot"
    # What a job watched with `watch_job` did: progress, a retry, its end.
    JOB_EVENT = "job_event"


#: A request id: an int or a string of at most MAX_RID_CHARS characters; None when absent.
Rid: TypeAlias = int | str | None


# --------------------------------------------------------------------------- errors


class WireError(ValueError):
    """A frame or request the protocol rejects, ready to become an error reply.

    ``code`` is the stable :class:`ErrorCode`; ``message`` is for humans and starts with the
    field's path when there is one (``"jobs[3].priority: expected an integer, got
    boolean"``); ``field`` is that path or ``None``; ``rid`` is the request id to echo
    (``None`` when the request had none, or when the ``rid`` itself was the fault).
    """

    def __init__(
        self, code: ErrorCode, message: str, field: str | None = None, *, rid: Rid = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.rid = rid

    def error_object(self) -> dict[str, Any]:
        """The reply's ``error`` member: ``{"code", "message", "field"}``."""
        return {"code": self.code.value, "message": self.message, "field": self.field}

    def reply(self) -> dict[str, Any]:
        """The whole error reply frame, to pass to :func:`encode`."""
        return {"rid": self.rid, "ok": False, "error": self.error_object()}

    def __repr__(self) -> str:
        return f"WireError({self.code.value!r}, {self.message!r}, field={self.field!r})"


def binary_frame_error() -> WireError:
    """The error for a binary WebSocket frame: every frame must be a JSON text frame."""
    return WireError(ErrorCode.BAD_FRAME, "binary frames are not accepted; send JSON as text")


# --------------------------------------------------------------------------- codec


def encode(obj: Any) -> bytes:
    """One frame (or any JSON value) as compact UTF-8 JSON bytes.

    Send the result as a *text* frame: it is valid UTF-8 by construction. A value made by
    :func:`raw_json` is spliced in verbatim, which is how the broker sends a stored payload
    without decoding it. Besides the JSON types, orjson writes dataclasses, datetimes,
    UUIDs and enum members in their JSON form.

    Raises ``TypeError`` (orjson's ``JSONEncodeError``) for what JSON cannot hold: a dict
    key that is not exactly ``str`` (a ``StrEnum`` key counts as not ``str``), an int
    outside the 64-bit range, a string with lone surrogates, a set or other unknown type,
    nesting deeper than 254 levels. NaN and the infinities are written as ``null`` without
    complaint, so values from outside must go through :func:`encode_payload`.
    """
    return orjson.dumps(obj)


def raw_json(data: bytes | str) -> Any:
    """Pre-encoded JSON to splice into a frame by :func:`encode`, without re-encoding.

    The caller vouches that ``data`` is exactly one valid JSON value (the engine's
    ``Job.payload_json``, or the bytes :func:`encode_payload` returned); nothing checks it.
    """
    return orjson.Fragment(data)


def encode_payload(value: Any, *, max_bytes: int | None = None, field: str = "payload") -> bytes:
    """A job payload as strict JSON bytes, checked as ``docs/contract.md`` ENQ-9 demands.

    Use it for every payload that came from a caller (the SDK's ``enqueue``), then splice
    the bytes into the frame with :func:`raw_json`, so a payload is encoded once and nested
    at most :data:`MAX_PAYLOAD_DEPTH` deep whatever frame it rides in. The broker may use it
    on a decoded request payload to hand the engine a ``RawJSON`` (orjson is far faster than
    the engine's own stdlib encoding).

    Raises ``WireError``: ``invalid_argument`` naming ``field`` when the value is not strict
    JSON (see :func:`encode` for what orjson refuses; NaN and the infinities are refused
    here); ``too_large`` when ``max_bytes`` is given and the encoding is longer.
    """
    try:
        data = orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        reason = str(exc)
        if "Recursion limit" in reason:  # orjson's words for nesting deeper than 254
            reason = f"nests deeper than {MAX_PAYLOAD_DEPTH} levels"
        raise WireError(ErrorCode.INVALID_ARGUMENT, f"{field}: {reason}", field) from None
    # orjson writes NaN and +-inf as null. Only when a null is in the output can one of them
    # be in the input, so the walk below runs for few payloads; the search itself is memchr.
    if b"null" in data and _holds_non_finite(value):
        raise WireError(
            ErrorCode.INVALID_ARGUMENT,
            f"{field}: must be strict JSON, holds NaN or an infinity",
            field,
        )
    if max_bytes is not None and len(data) > max_bytes:
        raise WireError(
            ErrorCode.TOO_LARGE,
            f"{field}: is {len(data)} bytes encoded, over the limit of {max_bytes} bytes",
            field,
        )
    # orjson's result keeps the whole buffer it wrote into (4 KiB at least) however short
    # the JSON, and a stored payload lives as long as its job; an exact copy is cheap.
    return bytes(memoryview(data))


def _holds_non_finite(value: Any) -> bool:
    """Whether a NaN or an infinity sits in ``value``'s dicts, lists and tuples."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def decode(data: str | bytes) -> dict[str, Any]:
    """One received frame as a ``dict``.

    ``data`` is the text frame as ``str``, or its raw UTF-8 ``bytes`` (a receive that skips
    UTF-8 decoding; orjson checks the encoding itself). A *binary* frame must not get here:
    answer it with :func:`binary_frame_error`.

    One decoder and one set of rules (docs/protocol.md §2): what orjson refuses is
    ``bad_json``. That is strict JSON and more: no NaN or infinities, no byte order mark,
    nothing after the value, nesting at most 1024 deep, no lone surrogate in a ``\\u``
    escape, and no number too large for a double (``1e400``). A duplicated key keeps its
    last value. An integer within the 64-bit ranges decodes as ``int``; a larger one
    decodes as ``float`` (and is then refused by any field that wants an integer).

    Raises ``WireError``: ``bad_json`` when ``data`` is not such a JSON value in UTF-8,
    ``bad_frame`` when it is one but not an object. Nothing else escapes.

    The payload comes back as a Python value, which is cheap (orjson builds it in C) and
    lets the broker check and re-encode it in one pass (:func:`encode_payload`).
    """
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise WireError(ErrorCode.BAD_JSON, f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError(
            ErrorCode.BAD_FRAME, f"a frame must be a JSON object, got {_json_type(obj)}"
        )
    return obj


def decode_value(data: str | bytes) -> Any:
    """Any one JSON value (not only an object), e.g. a payload typed on a command line.

    Raises ``WireError`` (``bad_json``) when ``data`` is not strict JSON.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise WireError(ErrorCode.BAD_JSON, f"invalid JSON: {exc}") from None


# --------------------------------------------------------------------------- the op table


class Kind(StrEnum):
    """The JSON type a request field accepts. A boolean is never accepted as a number."""

    # A JSON string.
    STRING = "string"
    # A JSON number with no fraction or exponent (`3`, not `3.0` or `3e0`), not a boolean.
    INTEGER = "integer"
    # Any JSON number (integer or not), not a boolean.
    NUMBER = "number"
    # Any JSON value, null included (the payload).
    ANY = "any"
    # An array of strings.
    STRINGS = "array of strings"
    # An array of objects, each checked against Field.items.
    OBJECTS = "array of objects"
    # One JSON object, checked against Field.items (``set_schedule``'s ``schedule``).
    OBJECT = "object"
    # ``true`` or ``false``.
    BOOLEAN = "boolean"


_ABSENT: Any = object()
# The kinds as plain module names for the fast check: reading a member off its enum class
# (``Kind.ANY``) costs a class attribute lookup, and the check reads up to five per field.
_ANY, _STRING, _INTEGER, _NUMBER, _STRINGS, _OBJECT, _BOOLEAN = (
    Kind.ANY,
    Kind.STRING,
    Kind.INTEGER,
    Kind.NUMBER,
    Kind.STRINGS,
    Kind.OBJECT,
    Kind.BOOLEAN,
)


class _Shape:
    """A tuple of fields, prepared for :func:`_fast_object`: the dict it starts from (every
    field in order, at its default), which of those defaults are lists to copy, the fields
    by name, and the names that must be present.

    Most optional fields of a request are absent (an enqueue sets two of its ten), so the
    fast check copies this template and looks only at the names the object holds.
    """

    __slots__ = ("by_name", "list_defaults", "required", "template")

    def __init__(self, fields: tuple[Field, ...]) -> None:
        self.by_name = {f.name: f for f in fields}
        # A required field starts as _ABSENT; it must be present and not null, which the
        # check proves before it returns, so no _ABSENT is ever handed out.
        self.template = {f.name: _ABSENT if f.required else f.default for f in fields}
        self.list_defaults = tuple(
            (f.name, f.default) for f in fields if not f.required and type(f.default) is tuple
        )
        self.required = frozenset(f.name for f in fields if f.required)


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a request (or of an object inside an ``OBJECTS`` field).

    A field that is absent or ``null`` takes ``default``, unless it is ``required`` (then it
    is an ``invalid_argument``). The one exception is a ``Kind.ANY`` field: ``null`` is a
    value there, and only absence counts as missing. A list default is copied per request.
    """

    name: str
    kind: Kind
    required: bool = False
    default: Any = None
    # STRING: not "". STRINGS, OBJECTS: at least one entry.
    nonempty: bool = False
    # STRINGS: no entry twice.
    unique: bool = False
    # STRINGS, OBJECTS: at most max_batch entries (too_large), when the broker passes one.
    batch: bool = False
    # OBJECTS: the fields of each entry.
    items: tuple[Field, ...] = ()
    # OBJECTS: the request's check leaves the entries as they are; the op checks each one
    # on its own (check_entry), so that one bad entry fails alone (enqueue_each).
    each: bool = False
    item_names: frozenset[str] = field(init=False, repr=False, compare=False)
    # OBJECTS whose entries are two required strings (``{id, lease}``) and optional fields:
    # the two names, for a shorter check of the batches every worker sends (acks,
    # heartbeats). An entry of exactly those two is kept as it is (its optional fields
    # absent, not filled with their defaults: read them with ``get``).
    string_pair: tuple[str, str] | None = field(init=False, repr=False, compare=False)
    # OBJECTS: what the fast check of an entry needs, computed once (see _Shape).
    item_shape: _Shape = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "item_names", frozenset(f.name for f in self.items))
        object.__setattr__(self, "item_shape", _Shape(self.items))
        pair = None
        if (
            len(self.items) >= 2
            and all(f.kind is Kind.STRING and f.required and not f.nonempty for f in self.items[:2])
            and not any(f.required for f in self.items[2:])
        ):
            pair = (self.items[0].name, self.items[1].name)
        object.__setattr__(self, "string_pair", pair)


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One operation: who may call it and what its request holds."""

    op: Op
    # Any one of these grants the op; empty means every connection may call it.
    roles: frozenset[Role]
    fields: tuple[Field, ...]
    by_name: Mapping[str, Field] = field(init=False, repr=False, compare=False)
    shape: _Shape = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        shape = _Shape(self.fields)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "by_name", MappingProxyType(shape.by_name))

    def allows(self, roles: Collection[Role]) -> bool:
        """Whether a connection holding ``roles`` may call this op."""
        return not self.roles or not self.roles.isdisjoint(roles)

    def needs(self) -> str:
        """The roles that grant this op, for a message: "the publish role", "the publish,
        work or read role"; admin grants every op, so it is named only when no other role
        does ("the admin role")."""
        names = sorted(role.value for role in self.roles if role is not Role.ADMIN)
        if not names:
            return "the admin role"
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        return f"the {listed} role"


_P, _W, _A, _R = Role.PUBLISH, Role.WORK, Role.ADMIN, Role.READ
_ANYONE: frozenset[Role] = frozenset()
_PUBLISHING = frozenset({_P, _A})
_WORKING = frozenset({_W, _A})
_ADMIN = frozenset({_A})

_ID = Field("id", Kind.STRING, required=True)
_LEASE = Field("lease", Kind.STRING, required=True)
_QUEUE = Field("queue", Kind.STRING, required=True)
_ERROR = Field("error", Kind.STRING)
# The per-job options of docs/contract.md (ENQ-2); None means "not set", so the queue's
# option or the plain default applies. Ranges are the engine's to check.
_JOB_OPTIONS = (
    Field("priority", Kind.INTEGER, default=0),
    Field("delay_s", Kind.NUMBER),
    Field("run_at", Kind.NUMBER),
    Field("expires_s", Kind.NUMBER),
    Field("visibility_timeout_s", Kind.NUMBER),
    Field("max_attempts", Kind.INTEGER),
    Field("backoff_base_s", Kind.NUMBER),
    Field("key", Kind.STRING),
    # The handler's time limit for this job, carried in its push (docs/worker.md).
    Field("timeout_s", Kind.NUMBER),
    # The job's partition key for flow control (docs/contract.md, FLW-3).
    Field("partition", Kind.STRING),
    # The ids of the jobs it waits for (docs/contract.md, DEP-1).
    Field("after", Kind.STRINGS, default=()),
)
# A member of an ``enqueue_group``: its ``after`` may also name members by index (DEP-6),
# so its entries are strings or integers, checked by the engine (``after[i]``).
_MEMBER_OPTIONS = (
    *(f for f in _JOB_OPTIONS if f.name != "after"),
    Field("after", Kind.ANY, default=()),
)
# A queue's flow-control limits (docs/contract.md, FLW-1), flat in ``set_limits``: an
# absent count means no such limit, an absent period one second.
_LIMITS = (
    Field("concurrency", Kind.INTEGER),
    Field("rate", Kind.INTEGER),
    Field("per_s", Kind.NUMBER, default=1.0),
    Field("burst", Kind.INTEGER),
    Field("partition_concurrency", Kind.INTEGER),
    Field("partition_rate", Kind.INTEGER),
    Field("partition_per_s", Kind.NUMBER, default=1.0),
    Field("partition_burst", Kind.INTEGER),
)
# A schedule's definition (docs/schedules.md; docs/contract.md, SCH-1), ``set_schedule``'s
# ``schedule`` object: the ScheduleSpec's fields under the same names. Ranges, the cron
# text and the zone are the engine's to check, as an enqueue's options are.
SCHEDULE_FIELDS: Final = (
    Field("id", Kind.STRING, required=True),
    _QUEUE,
    Field("payload", Kind.ANY),
    Field("cron", Kind.STRING),
    Field("every_s", Kind.NUMBER),
    Field("tz", Kind.STRING, default="UTC"),
    Field("start_at", Kind.NUMBER),
    Field("end_at", Kind.NUMBER),
    Field("missed", Kind.STRING, default="once"),
    Field("max_catch_up", Kind.INTEGER, default=100),
    Field("paused", Kind.BOOLEAN, default=False),
    # The options of the job each tick makes: an enqueue's, but for those the tick
    # decides (its time) and the schedule does (its key).
    *(f for f in _JOB_OPTIONS if f.name not in {"delay_s", "run_at", "key", "after"}),
)
#: What a schedule's info adds to its definition's fields (``list_schedules``).
SCHEDULE_STATE_FIELDS: Final = (
    "next_at",
    "last_at",
    "last_job",
    "fired",
    "created_at",
    "updated_at",
)
#: ``list_schedules``' ``limit`` when the request leaves it out, and the most it may be.
DEFAULT_SCHEDULE_LIMIT: Final = 100
MAX_SCHEDULE_LIMIT: Final = 1000
#: ``back_off``'s ``scope``: the job's partition key (or the one named), or its queue.
BACK_OFF_SCOPES: Final = ("partition", "queue")
_HANDLES = Field("items", Kind.OBJECTS, required=True, batch=True, items=(_ID, _LEASE))
# An ack's result: any JSON value; absent (or null) is no result.
_RESULT = Field("result", Kind.ANY)
_ACKS = Field("items", Kind.OBJECTS, required=True, batch=True, items=(_ID, _LEASE, _RESULT))
# A progress report's items: each job's latest progress, any JSON value (PRG-1).
_PROGRESSES = Field(
    "items",
    Kind.OBJECTS,
    required=True,
    batch=True,
    items=(_ID, _LEASE, Field("progress", Kind.ANY, required=True)),
)

_SPECS = (
    OpSpec(
        Op.HELLO,
        _ANYONE,
        (
            Field("token", Kind.STRING),
            Field("client", Kind.STRING),
            Field("protocol", Kind.INTEGER, default=PROTOCOL_VERSION),
        ),
    ),
    OpSpec(Op.PING, _ANYONE, ()),
    OpSpec(
        Op.ENQUEUE,
        _PUBLISHING,
        (_QUEUE, Field("payload", Kind.ANY, required=True), *_JOB_OPTIONS),
    ),
    OpSpec(
        Op.ENQUEUE_BATCH,
        _PUBLISHING,
        (
            _QUEUE,
            Field(
                "jobs",
                Kind.OBJECTS,
                required=True,
                batch=True,
                items=(Field("payload", Kind.ANY, required=True), *_JOB_OPTIONS),
            ),
        ),
    ),
    OpSpec(
        Op.ENQUEUE_EACH,
        _PUBLISHING,
        (
            Field(
                "jobs",
                Kind.OBJECTS,
                required=True,
                batch=True,
                each=True,
                items=(_QUEUE, Field("payload", Kind.ANY, required=True), *_JOB_OPTIONS),
            ),
        ),
    ),
    OpSpec(
        Op.ENQUEUE_GROUP,
        _PUBLISHING,
        (
            Field(
                "jobs",
                Kind.OBJECTS,
                required=True,
                nonempty=True,
                batch=True,
                items=(_QUEUE, Field("payload", Kind.ANY, required=True), *_MEMBER_OPTIONS),
            ),
        ),
    ),
    OpSpec(
        Op.DEPENDENCY_RESULTS,
        frozenset({_P, _W, _A, _R}),
        (_ID, Field("offset", Kind.INTEGER, default=0)),
    ),
    OpSpec(Op.GET_JOB, frozenset({_P, _W, _A, _R}), (_ID,)),
    OpSpec(Op.WAIT, frozenset({_P, _A, _R}), (_ID, Field("timeout_s", Kind.NUMBER, required=True))),
    OpSpec(Op.WATCH_JOB, frozenset({_P, _A, _R}), (_ID,)),
    OpSpec(Op.UNWATCH_JOB, frozenset({_P, _A, _R}), (_ID,)),
    OpSpec(Op.CANCEL, _PUBLISHING, (_ID,)),
    OpSpec(
        Op.CANCEL_BATCH,
        _PUBLISHING,
        (Field("ids", Kind.STRINGS, required=True, nonempty=True, batch=True),),
    ),
    OpSpec(Op.STATS, frozenset({_P, _A, _R}), (Field("queue", Kind.STRING),)),
    OpSpec(
        Op.LIST_JOBS,
        frozenset({_P, _A, _R}),
        (
            _QUEUE,
            Field("state", Kind.STRING, required=True),
            Field("search", Kind.STRING, nonempty=True),
            Field("cursor", Kind.STRING),
            Field("limit", Kind.INTEGER, default=DEFAULT_LIST_LIMIT),
        ),
    ),
    OpSpec(
        Op.SUBSCRIBE,
        _WORKING,
        (
            Field("worker_id", Kind.STRING, required=True, nonempty=True),
            Field("queues", Kind.STRINGS, required=True, nonempty=True, unique=True),
            Field("prefetch", Kind.INTEGER, default=DEFAULT_PREFETCH),
            Field("leases", Kind.OBJECTS, default=(), batch=True, items=(_ID, _LEASE)),
        ),
    ),
    OpSpec(Op.UNSUBSCRIBE, _WORKING, ()),
    OpSpec(Op.ACK, _WORKING, (_ID, _LEASE, _RESULT)),
    OpSpec(Op.RETRY, _WORKING, (_ID, _LEASE, _ERROR, Field("delay_s", Kind.NUMBER))),
    OpSpec(Op.FAIL, _WORKING, (_ID, _LEASE, _ERROR)),
    OpSpec(Op.HEARTBEAT, _WORKING, (_ID, _LEASE)),
    OpSpec(Op.ACK_BATCH, _WORKING, (_ACKS,)),
    OpSpec(Op.HEARTBEAT_BATCH, _WORKING, (_HANDLES,)),
    OpSpec(Op.PROGRESS, _WORKING, (_PROGRESSES,)),
    OpSpec(Op.PAUSE, _ADMIN, (_QUEUE,)),
    OpSpec(Op.RESUME, _ADMIN, (_QUEUE,)),
    OpSpec(Op.REDRIVE, _ADMIN, (_ID,)),
    OpSpec(Op.REDRIVE_ALL, _ADMIN, (_QUEUE,)),
    OpSpec(Op.PURGE_DEAD, _ADMIN, (_QUEUE,)),
    OpSpec(Op.SWEEP, _ADMIN, ()),
    OpSpec(Op.SET_LIMITS, _ADMIN, (_QUEUE, *_LIMITS)),
    OpSpec(
        Op.BACK_OFF,
        _WORKING,
        (
            _ID,
            _LEASE,
            Field("delay_s", Kind.NUMBER, required=True),
            Field("partition", Kind.STRING),
            Field("scope", Kind.STRING, default="partition"),
        ),
    ),
    OpSpec(
        Op.SET_SCHEDULE,
        _ADMIN,
        (Field("schedule", Kind.OBJECT, required=True, items=SCHEDULE_FIELDS),),
    ),
    OpSpec(Op.DELETE_SCHEDULE, _ADMIN, (_ID,)),
    OpSpec(Op.PAUSE_SCHEDULE, _ADMIN, (_ID,)),
    OpSpec(Op.RESUME_SCHEDULE, _ADMIN, (_ID,)),
    OpSpec(Op.RUN_SCHEDULE, _ADMIN, (_ID,)),
    OpSpec(
        Op.LIST_SCHEDULES,
        frozenset({_P, _A, _R}),
        (
            Field("ids", Kind.STRINGS, nonempty=True, batch=True),
            Field("after", Kind.STRING),
            Field("limit", Kind.INTEGER, default=DEFAULT_SCHEDULE_LIMIT),
        ),
    ),
    OpSpec(
        Op.WATCH,
        frozenset({_R, _A}),
        (
            Field("job", Kind.STRING),
            Field("worker", Kind.STRING),
            Field("dead_queue", Kind.STRING),
            Field("dead_offset", Kind.INTEGER, default=0),
            Field("dead_limit", Kind.INTEGER, default=20),
        ),
    ),
)

#: Every operation by name: its roles and its fields (docs/protocol.md, "Operations").
OPS: Final[Mapping[str, OpSpec]] = MappingProxyType({spec.op.value: spec for spec in _SPECS})


# --------------------------------------------------------------------------- validation

# The envelope's own members, never looked up in an op's fields.
_ENVELOPE = frozenset({"op", "rid"})
# An unknown name is echoed in an error at most this long, so a peer cannot make us
# send back a megabyte of its own garbage.
_MAX_ECHO = 64


def validate_request(
    frame: Mapping[str, Any], *, max_batch: int | None = None
) -> tuple[Op, Rid, dict[str, Any]]:
    """Check a decoded request frame; return its op, its request id and its fields.

    ``fields`` holds every field of the op, defaults filled in (docs/protocol.md gives
    each): ``enqueue`` yields ``{"queue", "payload", "priority", "delay_s", ...}``, each
    ``enqueue_batch`` job a dict of the same shape, ``subscribe.leases`` and the batch
    ``items`` lists of ``{"id", "lease"}`` dicts. ``max_batch``, when given, bounds the
    batch fields (``enqueue_batch.jobs``, ``ack_batch.items``, ``heartbeat_batch.items``,
    ``subscribe.leases``).

    Raises ``WireError`` (``invalid_argument``, ``unknown_op`` or ``too_large``) naming
    the field; its ``rid`` is the request's, so the error reply reaches the right request,
    except when the ``rid`` itself is the fault. Roles are not checked here; see
    :func:`parse_envelope`.
    """
    spec, rid = parse_envelope(frame)
    return spec.op, rid, validate_fields(spec, frame, rid=rid, max_batch=max_batch)


def parse_envelope(frame: Mapping[str, Any]) -> tuple[OpSpec, Rid]:
    """The op's spec and the request id, checked; the fields are left for later.

    Lets the broker check roles (:meth:`OpSpec.allows`) before it looks at the fields, so a
    peer without rights learns nothing about them. Raises ``WireError``:
    ``invalid_argument`` for a bad ``rid`` or a missing or non-string ``op``, and
    ``unknown_op`` for an op not in :data:`OPS`.
    """
    rid = frame.get("rid")
    if rid is not None:
        if isinstance(rid, str):
            if len(rid) > MAX_RID_CHARS:
                raise WireError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"rid: a string rid may hold at most {MAX_RID_CHARS} characters,"
                    f" got {len(rid)}",
                    "rid",
                )
        elif not isinstance(rid, int) or isinstance(rid, bool):
            raise WireError(
                ErrorCode.INVALID_ARGUMENT,
                f"rid: expected an integer or a string, got {_json_type(rid)}",
                "rid",
            )
        elif not INT_MIN <= rid <= INT_MAX:
            raise WireError(
                ErrorCode.INVALID_ARGUMENT, f"rid: {_RANGE_PROBLEM}, got {_big(rid)}", "rid"
            )
    op = frame.get("op")
    if not isinstance(op, str):
        problem = "is missing" if op is None else f"expected a string, got {_json_type(op)}"
        raise WireError(ErrorCode.INVALID_ARGUMENT, f"op: {problem}", "op", rid=rid)
    spec = OPS.get(op)
    if spec is None:
        raise WireError(ErrorCode.UNKNOWN_OP, f"op: unknown op {_echo(op)!r}", "op", rid=rid)
    return spec, rid


def validate_fields(
    spec: OpSpec, frame: Mapping[str, Any], *, rid: Rid = None, max_batch: int | None = None
) -> dict[str, Any]:
    """The op's fields from ``frame``, checked, with defaults filled in.

    See :func:`validate_request`, which calls it. ``rid`` is only put on a raised error.
    """
    for name in frame:
        if name not in spec.by_name and name not in _ENVELOPE:
            shown = _echo(name)
            raise WireError(
                ErrorCode.INVALID_ARGUMENT,
                f"{shown}: unknown field for op {spec.op.value!r}",
                shown,
                rid=rid,
            )
    try:
        return _fast_object(spec.shape, frame, max_batch)
    except _Explain:
        pass
    try:
        _check_object(spec.fields, frame, "", max_batch)
    except WireError as exc:
        exc.rid = rid
        raise
    raise AssertionError("the fast check refused a frame the full check accepts")


class _Explain(Exception):
    """The fast check met something it does not accept: the full check says what."""


def _fast_object(shape: _Shape, obj: Mapping[str, Any], max_batch: int | None) -> dict[str, Any]:
    """:func:`_check_object` for the frames that pass, without building error paths.

    Every request goes through here first; a frame with any fault raises ``_Explain``
    and is checked again by :func:`_check_object`, which names the field. It accepts
    exactly what that accepts for the types a JSON decoder makes (anything unusual,
    such as a ``str`` subclass, goes the slow way) and returns the same dict, in the same
    order. The caller has refused any name ``obj`` holds that is not one of the fields,
    except a request's envelope (``op``, ``rid``), which is skipped here.
    """
    out = shape.template.copy()
    for name, default in shape.list_defaults:
        out[name] = list(default)
    by_name = shape.by_name
    for name, value in obj.items():
        f = by_name.get(name)
        if f is None:
            continue  # the envelope (see above)
        kind = f.kind
        if value is None and kind is not _ANY:
            if f.required:
                raise _Explain
            continue  # null means absent: the default stays
        if kind is _ANY:
            pass  # any JSON value (the payload)
        elif kind is _STRING:
            if type(value) is not str or (f.nonempty and not value):
                raise _Explain
        elif kind is _INTEGER:
            if type(value) is not int or not INT_MIN <= value <= INT_MAX:
                raise _Explain
        elif kind is _NUMBER:
            if type(value) is not float and type(value) is not int:
                raise _Explain
        elif kind is _BOOLEAN:
            if type(value) is not bool:
                raise _Explain
        elif kind is _OBJECT:
            if type(value) is not dict or not f.item_names.issuperset(value):
                raise _Explain
            value = _fast_object(f.item_shape, value, max_batch)
        else:
            if (
                type(value) is not list
                or (f.nonempty and not value)
                or (f.batch and max_batch is not None and len(value) > max_batch)
            ):
                raise _Explain
            if kind is _STRINGS:
                for item in value:
                    if type(item) is not str:
                        raise _Explain
                if f.unique and len(set(value)) != len(value):
                    raise _Explain
                value = list(value)
            elif f.each:
                value = list(value)  # each entry is checked on its own, by the op
            elif f.string_pair is not None:
                a, b = f.string_pair
                for item in value:
                    if (
                        type(item) is not dict
                        or len(item) != 2
                        or type(item.get(a)) is not str
                        or type(item.get(b)) is not str
                    ):
                        value = _pairs_and_more(f, value, max_batch)
                        break
                else:
                    value = list(value)  # the entries are exactly {a, b}: kept as they are
            else:
                names, items = f.item_names, f.item_shape
                checked = []
                for item in value:
                    if type(item) is not dict or not names.issuperset(item):
                        raise _Explain
                    checked.append(_fast_object(items, item, max_batch))
                value = checked
        out[name] = value
    if shape.required and not obj.keys() >= shape.required:
        raise _Explain  # a required field is missing
    return out


class MoreThanPairs(list[Any]):
    """The checked entries of a ``string_pair`` field (``ack_batch.items``) of which some
    hold more than the pair (an ack's ``result``): an op tells them from the usual plain
    ``list`` of bare pairs by their type, with no walk over the entries."""


def _pairs_and_more(f: Field, value: list[Any], max_batch: int | None) -> MoreThanPairs:
    """The entries of a ``string_pair`` field when some hold more than the pair (an ack's
    ``result``): those are checked against the entry's fields, the others kept as they
    are. Raises ``_Explain`` for an entry the fast check cannot pass."""
    a, b = f.string_pair or ("", "")
    names, shape, more = f.item_names, f.item_shape, len(f.items) > 2
    checked = MoreThanPairs()
    for item in value:
        if type(item) is not dict:
            raise _Explain
        if len(item) == 2 and type(item.get(a)) is str and type(item.get(b)) is str:
            checked.append(item)
        elif more and names.issuperset(item):
            checked.append(_fast_object(shape, item, max_batch))
        else:
            raise _Explain
    return checked


def _check_object(
    fields: tuple[Field, ...], obj: Mapping[str, Any], prefix: str, max_batch: int | None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        path = prefix + f.name
        if f.name in obj and (obj[f.name] is not None or f.kind is Kind.ANY):
            out[f.name] = _check_value(f, obj[f.name], path, max_batch)
        elif f.required:
            problem = "is missing" if f.name not in obj else "must not be null"
            raise WireError(ErrorCode.INVALID_ARGUMENT, f"{path}: {problem}", path)
        elif isinstance(f.default, tuple):
            out[f.name] = list(f.default)
        else:
            out[f.name] = f.default
    return out


def _check_value(f: Field, value: Any, path: str, max_batch: int | None) -> Any:
    kind = f.kind
    if kind is Kind.ANY:
        return value
    if kind is Kind.STRING:
        if not isinstance(value, str):
            raise _wrong_type(path, "a string", value)
        if f.nonempty and not value:
            raise WireError(ErrorCode.INVALID_ARGUMENT, f"{path}: must not be empty", path)
        return value
    if kind is Kind.INTEGER:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _wrong_type(path, "an integer", value)
        if not INT_MIN <= value <= INT_MAX:
            raise WireError(
                ErrorCode.INVALID_ARGUMENT, f"{path}: {_RANGE_PROBLEM}, got {_big(value)}", path
            )
        return value
    if kind is Kind.NUMBER:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _wrong_type(path, "a number", value)
        return value
    if kind is Kind.BOOLEAN:
        if not isinstance(value, bool):
            raise _wrong_type(path, "true or false", value)
        return value
    if kind is Kind.OBJECT:
        return _check_entry(f, value, path, max_batch)
    # An array kind.
    if not isinstance(value, list):
        raise _wrong_type(path, "an array", value)
    if f.nonempty and not value:
        raise WireError(ErrorCode.INVALID_ARGUMENT, f"{path}: must not be empty", path)
    if f.batch and max_batch is not None and len(value) > max_batch:
        raise WireError(
            ErrorCode.TOO_LARGE,
            f"{path}: holds {len(value)} entries, over the limit of {max_batch}",
            path,
        )
    if kind is Kind.STRINGS:
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise _wrong_type(f"{path}[{i}]", "a string", item)
        if f.unique and len(set(value)) != len(value):
            seen: set[str] = set()
            for i, item in enumerate(value):
                if item in seen:
                    raise WireError(
                        ErrorCode.INVALID_ARGUMENT,
                        f"{path}[{i}]: {_echo(item)!r} is listed twice",
                        f"{path}[{i}]",
                    )
                seen.add(item)
        return list(value)
    if f.each:
        return list(value)  # each entry is checked on its own, by the op
    checked = [_check_entry(f, item, f"{path}[{i}]", max_batch) for i, item in enumerate(value)]
    if f.string_pair is None:
        return checked
    # The shape the fast check gives (``string_pair``): a bare pair kept as it is, and the
    # entries a ``MoreThanPairs`` when some hold more than the pair.
    a, b = f.string_pair
    more = False
    for i, item in enumerate(value):
        if len(item) == 2 and type(item.get(a)) is str and type(item.get(b)) is str:
            checked[i] = item
        else:
            more = True
    return MoreThanPairs(checked) if more else checked


def _check_entry(f: Field, item: Any, where: str, max_batch: int | None) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise _wrong_type(where, "an object", item)
    for name in item:
        if name not in f.item_names:
            shown = f"{where}.{_echo(name)}"
            raise WireError(ErrorCode.INVALID_ARGUMENT, f"{shown}: unknown field", shown)
    return _check_object(f.items, item, where + ".", max_batch)


def check_entry(f: Field, item: Any, index: int) -> dict[str, Any]:
    """Entry ``index`` of the ``each`` field ``f``, checked, with defaults filled in.

    The request's own check left the entries of such a field as they came (see
    ``Field.each``); the op calls this for each one, so that one bad entry is refused on
    its own. Raises ``WireError`` (``invalid_argument``) naming the member under the
    entry's path (``"jobs[3].priority"``).
    """
    if type(item) is dict and f.item_names.issuperset(item):
        try:
            return _fast_object(f.item_shape, item, None)
        except _Explain:
            pass
    _check_entry(f, item, f"{f.name}[{index}]", None)
    raise AssertionError("the fast check refused an entry the full check accepts")


_RANGE_PROBLEM = "must be an integer in [-2^63, 2^63 - 1]"


def _big(value: int) -> str:
    """An out-of-range integer, short enough to echo back."""
    text = str(value)
    return text if len(text) <= 24 else f"an integer of {len(text)} digits"


def _wrong_type(path: str, expected: str, value: Any) -> WireError:
    return WireError(
        ErrorCode.INVALID_ARGUMENT, f"{path}: expected {expected}, got {_json_type(value)}", path
    )


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _echo(text: str) -> str:
    """A peer-supplied name, cut short enough to echo back in an error."""
    return text if len(text) <= _MAX_ECHO else text[:_MAX_ECHO] + "..."


# --------------------------------------------------------------------------- outgoing frames


class JobSnapshot(Protocol):
    """What :func:`job_info` and :func:`pushed_job` read from a job (the engine's ``Job``)."""

    @property
    def id(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def payload_json(self) -> bytes: ...
    @property
    def priority(self) -> int: ...
    @property
    def attempts(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def visibility_timeout_s(self) -> float: ...
    @property
    def backoff_base_s(self) -> float: ...
    @property
    def backoff_max_s(self) -> float: ...
    @property
    def enqueued_at(self) -> float: ...
    @property
    def ready_at(self) -> float: ...
    @property
    def expires_at(self) -> float | None: ...
    @property
    def worker_id(self) -> str | None: ...
    @property
    def deadline(self) -> float | None: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def died_at(self) -> float | None: ...
    @property
    def key(self) -> str | None: ...
    @property
    def timeout_s(self) -> float | None: ...
    @property
    def partition(self) -> str | None: ...
    @property
    def result_json(self) -> bytes | None: ...
    @property
    def completed_at(self) -> float | None: ...
    @property
    def progress_json(self) -> bytes | None: ...
    @property
    def after(self) -> tuple[str, ...]: ...
    @property
    def waiting_for(self) -> int: ...


class ClaimSnapshot(Protocol):
    """What :func:`pushed_job` reads from a claim (the engine's ``JobHandle``)."""

    @property
    def id(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def payload_json(self) -> bytes: ...
    @property
    def attempt(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def lease(self) -> str: ...
    @property
    def deadline(self) -> float: ...
    @property
    def priority(self) -> int: ...
    @property
    def visibility_timeout_s(self) -> float: ...
    @property
    def timeout_s(self) -> float | None: ...
    @property
    def partition(self) -> str | None: ...
    @property
    def dependencies(self) -> int: ...


#: The members of a job object in a ``get_job`` reply, in order (docs/protocol.md, "get_job").
#: The fields of docs/contract.md JOB-3, less the lease (a worker's secret) and ``seq``
#: (internal).
JOB_INFO_FIELDS: Final = (
    "id",
    "queue",
    "state",
    "payload",
    "priority",
    "attempts",
    "max_attempts",
    "visibility_timeout_s",
    "backoff_base_s",
    "backoff_max_s",
    "enqueued_at",
    "ready_at",
    "expires_at",
    "worker_id",
    "deadline",
    "last_error",
    "died_at",
    "key",
    "timeout_s",
    "partition",
    "result",
    "completed_at",
    "progress",
    "after",
    "waiting_for",
)

#: The members of each job of a ``jobs`` push, in order (docs/protocol.md, "Pushes").
PUSHED_JOB_FIELDS: Final = (
    "id",
    "queue",
    "payload",
    "attempt",
    "max_attempts",
    "lease",
    "deadline",
    "priority",
    "visibility_timeout_s",
    "timeout_s",
    "partition",
    "dependencies",
)


#: The states a job object's ``state`` names (docs/protocol.md, "get_job"), in the order a
#: job usually passes them. A stored job is ``pending``, ``processing`` or ``dead``; a
#: pending one is ``ready`` once its ``ready_at`` has come, ``scheduled`` before.
JOB_STATES: Final = ("ready", "scheduled", "processing", "completed", "dead", "waiting")


def job_state(job: JobSnapshot, now: float) -> str:
    """The name of ``job``'s state at ``now``: one of :data:`JOB_STATES`."""
    state = str(job.state)
    if state == "pending":
        return "ready" if job.ready_at <= now else "scheduled"
    return state


def job_info(job: JobSnapshot, now: float) -> dict[str, Any]:
    """A job object for a ``get_job`` reply, its state as of ``now`` (the broker's clock:
    a pending job is ``ready`` or ``scheduled`` by its ``ready_at``); the stored payload
    bytes are spliced, not decoded."""
    return {
        "id": job.id,
        "queue": job.queue,
        "state": job_state(job, now),
        "payload": raw_json(job.payload_json),
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "visibility_timeout_s": job.visibility_timeout_s,
        "backoff_base_s": job.backoff_base_s,
        "backoff_max_s": job.backoff_max_s,
        "enqueued_at": job.enqueued_at,
        "ready_at": job.ready_at,
        "expires_at": job.expires_at,
        "worker_id": job.worker_id,
        "deadline": job.deadline,
        "last_error": job.last_error,
        "died_at": job.died_at,
        "key": job.key,
        "timeout_s": job.timeout_s,
        "partition": job.partition,
        "result": None if (result := job.result_json) is None else raw_json(result),
        "completed_at": job.completed_at,
        "progress": None if (progress := job.progress_json) is None else raw_json(progress),
        "after": list(job.after),
        "waiting_for": job.waiting_for,
    }


def pushed_job(claim: ClaimSnapshot) -> dict[str, Any]:
    """One entry of a ``jobs`` push for a job just claimed (or re-pushed).

    ``claim`` is what the claim made of the job (the engine's ``JobHandle``): ``attempt``
    is this claim's attempt number and ``deadline`` its lease's end.
    """
    return {
        "id": claim.id,
        "queue": claim.queue,
        "payload": raw_json(claim.payload_json),
        "attempt": claim.attempt,
        "max_attempts": claim.max_attempts,
        "lease": claim.lease,
        "deadline": claim.deadline,
        "priority": claim.priority,
        "visibility_timeout_s": claim.visibility_timeout_s,
        "timeout_s": claim.timeout_s,
        "partition": claim.partition,
        "dependencies": claim.dependencies,
    }


def ok_reply(rid: Rid, result: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A success reply: ``{"rid": rid, "ok": true, **result}``.

    Send nothing instead when the request had no ``rid`` (fire-and-forget).
    """
    frame: dict[str, Any] = {"rid": rid, "ok": True}
    if result:
        frame.update(result)
    return frame


def jobs_push(jobs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A ``jobs`` push frame carrying entries made by :func:`pushed_job`."""
    return {"push": Push.JOBS.value, "jobs": list(jobs)}


def cancelled_push(ids: Iterable[str]) -> dict[str, Any]:
    """A ``cancelled`` push frame naming jobs this connection held that were cancelled."""
    return {"push": Push.CANCELLED.value, "ids": list(ids)}
