"""Argument guards and limits (``docs/contract.md``, ENQ-7 to ENQ-9 and LIM-1 to LIM-6).

Each guard returns the value in its stored form or raises ``InvalidArgument`` naming
the field. A bool is never a number here, although Python says ``True == 1``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ._errors import DependencyCycle, InvalidArgument, PayloadTooLarge
from ._types import Limits, QueueOpts, RawJSON

__all__ = [
    "MAX_AFTER",
    "MAX_ATTEMPTS_MAX",
    "MAX_ERROR_CHARS",
    "MAX_KEY_LEN",
    "MAX_PAYLOAD_DEPTH",
    "MAX_WORKER_ID_LEN",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "check_limits",
    "check_opts",
    "encode_payload",
    "error_text",
    "finite",
    "key",
    "nonneg",
    "optional",
    "positive",
    "positive_int",
    "priority",
    "queue_name",
    "worker_id",
]

PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1
# Every integer the table stores fits a signed 32- or 64-bit column, whatever a caller
# passes: a value no store can hold must be refused here, not fail a commit later (LIM-4).
MAX_ATTEMPTS_MAX = 2**31 - 1
MAX_KEY_LEN = 1024
MAX_WORKER_ID_LEN = 256
# A longer error string is cut to this many characters (and marked so): an error is
# kept with its job and shown on the dashboard, a traceback of any length is not refused
# (LIM-3).
MAX_ERROR_CHARS = 4096
# orjson, which decodes every frame, refuses deeper nesting than this, so deeper
# payloads could not travel anyway; refusing them here keeps the walk bounded (LIM-6).
MAX_PAYLOAD_DEPTH = 254
# The most dependencies one job may name (DEP-9): each is an edge kept until the job goes.
MAX_AFTER = 1000

_QUEUE_NAME = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def finite(field: str, value: object) -> float:
    """A real number (int or float, never bool: ENQ-8) that is finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(field, f"must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        raise InvalidArgument(field, "must be finite, got a number too large") from None
    if not math.isfinite(number):
        raise InvalidArgument(field, f"must be finite, got {_describe(value)}")
    return number


def nonneg(field: str, value: object) -> float:
    """A finite number >= 0."""
    number = finite(field, value)
    if number < 0:
        raise InvalidArgument(field, f"must be >= 0, got {_describe(value)}")
    return number


def positive(field: str, value: object) -> float:
    """A finite number > 0."""
    number = finite(field, value)
    if number <= 0:
        raise InvalidArgument(field, f"must be > 0, got {_describe(value)}")
    return number


def positive_int(field: str, value: object, limit: int = MAX_ATTEMPTS_MAX) -> int:
    """An int in ``[1, limit]`` (never a bool, never a float; LIM-4 for ``max_attempts``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be an int, got {type(value).__name__}")
    if value < 1:
        raise InvalidArgument(field, f"must be >= 1, got {_describe(value)}")
    if value > limit:
        raise InvalidArgument(field, f"must be at most {limit}, got {_describe(value)}")
    return value


def priority(value: object) -> int:
    """An int in [-2**31, 2**31 - 1] (JOB-3, ENQ-9)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument("priority", f"must be an int, got {type(value).__name__}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidArgument(
            "priority", f"must be in [{PRIORITY_MIN}, {PRIORITY_MAX}], got {_describe(value)}"
        )
    return value


def optional(check: Any, field: str, value: object) -> Any:
    """``check(field, value)``, or ``None`` when value is ``None`` (the option is not set)."""
    return None if value is None else check(field, value)


def queue_name(value: object) -> str:
    """1 to 128 characters, each a letter, a digit or one of ``. _ - :`` (JOB-3)."""
    if not isinstance(value, str):
        raise InvalidArgument("queue", f"must be a string, got {type(value).__name__}")
    if not _QUEUE_NAME.fullmatch(value):
        raise InvalidArgument(
            "queue",
            f"must be 1 to 128 of A-Z a-z 0-9 . _ - : (no spaces), got {_describe(value)}",
        )
    return value


def _unicode(field: str, value: str) -> str:
    """``value`` if it is valid Unicode text: no lone surrogate, which no store (and no
    JSON encoder) can write. Frames cannot carry one (the decoder refuses them); this is
    for callers of the table itself (LIM-5)."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(field, "holds a lone surrogate, not valid Unicode") from None
    return value


def worker_id(value: object) -> str:
    """A string of 1 to ``MAX_WORKER_ID_LEN`` characters (CLM-9, LIM-2)."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument("worker_id", f"must be a non-empty string, got {_describe(value)}")
    if len(value) > MAX_WORKER_ID_LEN:
        raise InvalidArgument(
            "worker_id", f"must be at most {MAX_WORKER_ID_LEN} characters, got {len(value)}"
        )
    return _unicode("worker_id", value)


def key(value: object, field: str = "key") -> str | None:
    """``None``, or a string of at most ``MAX_KEY_LEN`` characters; ``""`` means no key
    (LIM-1; FLW-3 for a partition key, ``field="partition"``)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a string or null, got {type(value).__name__}")
    if len(value) > MAX_KEY_LEN:
        raise InvalidArgument(field, f"must be at most {MAX_KEY_LEN} characters, got {len(value)}")
    return _unicode(field, value) if value else None


def error_text(field: str, value: object) -> str | None:
    """An error string; ``None`` and ``""`` both mean "no error given". A string over
    ``MAX_ERROR_CHARS`` characters is cut to that length, its end marked with "..." (HND-4,
    LIM-3)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a string or null, got {type(value).__name__}")
    if len(value) > MAX_ERROR_CHARS:
        value = value[: MAX_ERROR_CHARS - 3] + "..."
    return _unicode(field, value) if value else None


def after(value: object, refs: int = 0) -> tuple[str | int, ...]:
    """The dependencies of one job (DEP-1, DEP-9): a list or tuple of at most
    ``MAX_AFTER`` job ids (strings), and with ``refs`` (a group of that many jobs) also
    member indexes in ``[0, refs)``; each named once (a repeat is dropped), in order."""
    if not isinstance(value, list | tuple):
        raise InvalidArgument("after", f"must be a list of job ids, got {type(value).__name__}")
    if len(value) > MAX_AFTER:
        raise InvalidArgument("after", f"must name at most {MAX_AFTER} jobs, got {len(value)}")
    seen: dict[str | int, None] = {}
    for i, item in enumerate(value):
        if isinstance(item, str):
            if not item or len(item) > MAX_KEY_LEN:
                raise InvalidArgument(f"after[{i}]", f"is not a job id: {_describe(item)}")
        elif refs and isinstance(item, int) and not isinstance(item, bool):
            if not 0 <= item < refs:
                raise InvalidArgument(
                    f"after[{i}]", f"must be a job id or a member index in [0, {refs}), got {item}"
                )
        else:
            wanted = "a job id or a member index" if refs else "a job id (a string)"
            raise InvalidArgument(f"after[{i}]", f"must be {wanted}, got {_describe(item)}")
        seen[item] = None
    return tuple(seen)


def group_order(afters: list[tuple[str | int, ...]]) -> list[int]:
    """The members of a group (each one's checked ``after``) in an order where each comes
    after the members it names (DEP-4, DEP-6): Kahn's algorithm, O(members + edges).
    Raises ``DependencyCycle`` naming ``jobs[i].after`` of a member of a circle."""
    count = len(afters)
    needs = [0] * count
    named_by: list[list[int]] = [[] for _ in range(count)]
    for i, after in enumerate(afters):
        for item in after:
            if isinstance(item, int):
                needs[i] += 1
                named_by[item].append(i)
    order = [i for i in range(count) if needs[i] == 0]
    for i in order:  # (grows as it goes)
        for j in named_by[i]:
            needs[j] -= 1
            if needs[j] == 0:
                order.append(j)
    if len(order) < count:
        stuck = next(i for i in range(count) if needs[i])
        raise DependencyCycle(
            f"jobs[{stuck}].after", "the group's jobs depend on each other in a circle"
        )
    return order


def check_opts(opts: object) -> QueueOpts:
    """A ``QueueOpts`` whose every field is in range, numbers stored as floats (ENQ-3,
    ENQ-4, ENQ-9)."""
    if not isinstance(opts, QueueOpts):
        raise InvalidArgument("opts", f"must be a QueueOpts, got {type(opts).__name__}")
    base = nonneg("backoff_base_s", opts.backoff_base_s)
    cap = nonneg("backoff_max_s", opts.backoff_max_s)
    if base > cap:
        raise InvalidArgument("backoff_base_s", f"must be <= backoff_max_s ({cap}), got {base}")
    return QueueOpts(
        visibility_timeout_s=positive("visibility_timeout_s", opts.visibility_timeout_s),
        max_attempts=positive_int("max_attempts", opts.max_attempts),
        backoff_base_s=base,
        backoff_max_s=cap,
        expires_s=optional(positive, "expires_s", opts.expires_s),
        dead_letter_retention_s=optional(
            nonneg, "dead_letter_retention_s", opts.dead_letter_retention_s
        ),
        completed_retention_s=optional(nonneg, "completed_retention_s", opts.completed_retention_s),
    )


def check_limits(limits: object) -> Limits:
    """A ``Limits`` whose every field is in range, periods stored as floats (FLW-1)."""
    if not isinstance(limits, Limits):
        raise InvalidArgument("limits", f"must be a Limits, got {type(limits).__name__}")
    counts = {}
    for name in ("concurrency", "rate", "burst"):
        for scope in ("", "partition_"):
            field = scope + name
            counts[field] = optional(positive_int, field, getattr(limits, field))
    for scope in ("", "partition_"):
        if counts[scope + "burst"] is not None and counts[scope + "rate"] is None:
            raise InvalidArgument(scope + "burst", f"needs {scope}rate: a burst of what rate?")
    return Limits(
        concurrency=counts["concurrency"],
        rate=counts["rate"],
        per_s=positive("per_s", limits.per_s),
        burst=counts["burst"],
        partition_concurrency=counts["partition_concurrency"],
        partition_rate=counts["partition_rate"],
        partition_per_s=positive("partition_per_s", limits.partition_per_s),
        partition_burst=counts["partition_burst"],
    )


def _check_json(value: object) -> None:
    """Raise unless ``value`` is strict JSON: str-keyed objects, arrays, finite numbers."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item is None or isinstance(item, str | bool | int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidArgument("payload", f"must be strict JSON, holds {item!r}")
            continue
        if depth >= MAX_PAYLOAD_DEPTH:
            raise InvalidArgument("payload", f"nests deeper than {MAX_PAYLOAD_DEPTH} levels")
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise InvalidArgument(
                        "payload", f"object keys must be strings, got {type(k).__name__}"
                    )
                stack.append((v, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)
        else:
            raise InvalidArgument("payload", f"must be strict JSON, holds a {type(item).__name__}")


def result(data: object, limit: int) -> bytes:
    """An ack's result: encoded JSON bytes (the broker's decoder checked it), at most
    ``limit`` bytes, as a payload (RES-2)."""
    if not isinstance(data, bytes):
        raise InvalidArgument("result", "must be encoded JSON bytes")
    if len(data) > limit:
        raise PayloadTooLarge(
            "result", f"is {len(data)} bytes encoded, over the limit of {limit} bytes"
        )
    return data


def progress(data: object, limit: int) -> bytes:
    """A progress report's value: encoded JSON bytes (the broker's decoder checked it),
    at most ``limit`` bytes (PRG-3)."""
    if not isinstance(data, bytes):
        raise InvalidArgument("progress", "must be encoded JSON bytes")
    if len(data) > limit:
        raise PayloadTooLarge(
            "progress", f"is {len(data)} bytes encoded, over the limit of {limit} bytes"
        )
    return data


def encode_payload(payload: object, limit: int) -> bytes:
    """The payload as compact UTF-8 JSON bytes, at most ``limit`` bytes long (ENQ-9)."""
    if isinstance(payload, RawJSON):
        data = payload.data
        if not isinstance(data, bytes):
            raise InvalidArgument("payload", "RawJSON must hold bytes")
    else:
        _check_json(payload)
        try:
            data = json.dumps(
                payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")
            ).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument("payload", "holds a string that is not valid Unicode") from None
        except ValueError as exc:  # e.g. an int too long to convert to text
            raise InvalidArgument("payload", f"cannot be encoded as JSON: {exc}") from None
    if len(data) > limit:
        raise PayloadTooLarge(
            "payload", f"is {len(data)} bytes encoded, over the limit of {limit} bytes"
        )
    return data
