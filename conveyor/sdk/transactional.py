"""Enqueue a job inside your own PostgreSQL transaction (docs/postgres.md).

When the broker keeps its job table in PostgreSQL, an application writing to that
database can store a job in the same transaction as its own rows: the job exists if and
only if the transaction commits, and the brokers push it to a worker once it has::

    from conveyor.sdk import enqueue_tx

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("INSERT INTO orders (id) VALUES (%s)", (order_id,))
        job_id = enqueue_tx(conn, "emails", {"order": order_id}, priority=5)

    async with conn.transaction():  # psycopg AsyncConnection; or an asyncpg connection
        job_id = await enqueue_tx_async(conn, "emails", {"order": order_id})

Both call the database function ``conveyor_enqueue`` (the broker's schema, version 3 on;
a ``partition`` needs version 9, ``after`` the version with dependencies), which checks
and resolves the options as the broker does (``docs/contract.md``, ENQ-2 to ENQ-10,
FLW-3, DEP-7). A refused job raises the error
``Client.enqueue`` raises for it: ``InvalidArgument`` or ``TooLarge``, naming the field.
Like any failed statement, a refused one leaves the transaction aborted: roll back, or
call inside a savepoint (``conn.transaction()`` nested) to carry on without the job.

The SDK imports neither psycopg nor asyncpg: the connection's own module says which
driver it is, so asyncpg needs installing only by those who use it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from ._errors import ConveyorError, InvalidArgument, TooLarge
from ._wire import WireError, encode_payload

if TYPE_CHECKING:
    import psycopg

__all__ = ["enqueue_tx", "enqueue_tx_async"]

# (Each option cast to the function's parameter type, so that one statement, prepared
# once, serves every call whatever Python type a driver would have picked.)
_CASTS = (
    ("priority", "numeric"),
    ("delay_s", "float8"),
    ("run_at", "float8"),
    ("expires_s", "float8"),
    ("visibility_timeout_s", "float8"),
    ("max_attempts", "numeric"),
    ("backoff_base_s", "float8"),
    ("key", "text"),
    ("timeout_s", "float8"),
)


def _psycopg_sql(casts: tuple[tuple[str, str], ...]) -> str:
    return (
        "SELECT conveyor_enqueue(%s::text, %s::json, "
        + ", ".join(f"{name} => %s::{cast}" for name, cast in casts)
        + ")"
    )


def _asyncpg_sql(casts: tuple[tuple[str, str], ...]) -> str:
    return (
        "SELECT conveyor_enqueue($1::text, $2::json, "
        + ", ".join(f"{name} => ${i}::{cast}" for i, (name, cast) in enumerate(casts, start=3))
        + ")"
    )


# A job with a partition key names the argument (schema 9 on), and one with dependencies
# ``after`` (the schema with dependencies); one without does not, so that it still works
# on a database of an older schema. Keyed by (partition given, after given).
_VARIANTS = {
    (part, after): (
        *_CASTS,
        *((("partition", "text"),) if part else ()),
        *((("after", "text[]"),) if after else ()),
    )
    for part in (False, True)
    for after in (False, True)
}
_PSYCOPG_SQL = {named: _psycopg_sql(casts) for named, casts in _VARIANTS.items()}
_ASYNCPG_SQL = {named: _asyncpg_sql(casts) for named, casts in _VARIANTS.items()}

# The codes the function's refusals start with, and the SDK's error for each.
_REFUSALS: dict[str, type[ConveyorError]] = {
    InvalidArgument.code: InvalidArgument,
    TooLarge.code: TooLarge,
}


class _AsyncpgConnection(Protocol):
    """What this module uses of an asyncpg connection (or pool connection)."""

    async def fetchval(self, query: str, *args: Any) -> Any: ...


def enqueue_tx(
    conn: psycopg.Connection[Any] | psycopg.Cursor[Any],
    queue: str,
    payload: Any,
    *,
    priority: int = 0,
    delay_s: float | None = None,
    run_at: float | None = None,
    expires_s: float | None = None,
    visibility_timeout_s: float | None = None,
    max_attempts: int | None = None,
    backoff_base_s: float | None = None,
    key: str | None = None,
    timeout_s: float | None = None,
    partition: str | None = None,
    after: Sequence[str] | None = None,
) -> str:
    """Store one job in ``conn``'s current transaction (a psycopg 3 connection or
    cursor); return its id. The job is there for the brokers when that transaction
    commits, and never if it rolls back; an autocommit connection commits it at once.

    Options as for ``Client.enqueue`` (``None``: not set, the queue's value applies). A
    ``key`` a live job of the queue holds returns that job's id and stores nothing
    (ENQ-10); unlike ``Client.enqueue`` no key is made up when none is given, since the
    transaction, not a resend, decides whether the job is stored. ``partition`` is the
    job's partition key (FLW-3: at most 1,024 characters; ``None`` or ``""`` for none),
    which holds it to its queue's per-key limits and turns. ``after``: the ids of jobs it
    waits for (DEP-1: it runs once each has been acked; each must be a job the table
    holds, and is held until the transaction ends). Raises
    ``InvalidArgument`` or ``TooLarge`` (naming the field) for a refused job, and the
    driver's own errors for anything else.
    """
    params = _params(
        queue, payload, priority, delay_s, run_at, expires_s, visibility_timeout_s,
        max_attempts, backoff_base_s, key, timeout_s, partition, after,
    )  # fmt: skip
    if _driver(conn) != "psycopg" or inspect.iscoroutinefunction(conn.execute):
        raise TypeError(
            "enqueue_tx: conn must be a psycopg 3 Connection or Cursor, got "
            f"{_name(conn)} (use enqueue_tx_async for an AsyncConnection or asyncpg)"
        )
    try:
        row = conn.execute(_PSYCOPG_SQL[_variant(params)], params).fetchone()
    except Exception as exc:
        _raise_refusal(exc)
        raise
    return _job_id(row)


async def enqueue_tx_async(
    conn: psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any] | _AsyncpgConnection,
    queue: str,
    payload: Any,
    *,
    priority: int = 0,
    delay_s: float | None = None,
    run_at: float | None = None,
    expires_s: float | None = None,
    visibility_timeout_s: float | None = None,
    max_attempts: int | None = None,
    backoff_base_s: float | None = None,
    key: str | None = None,
    timeout_s: float | None = None,
    partition: str | None = None,
    after: Sequence[str] | None = None,
) -> str:
    """``enqueue_tx`` on a psycopg 3 ``AsyncConnection`` (or ``AsyncCursor``) or an
    asyncpg connection (or a pool's connection): the job is stored in the connection's
    current transaction."""
    params = _params(
        queue, payload, priority, delay_s, run_at, expires_s, visibility_timeout_s,
        max_attempts, backoff_base_s, key, timeout_s, partition, after,
    )  # fmt: skip
    try:
        if _is_asyncpg(conn):
            value = await conn.fetchval(_ASYNCPG_SQL[_variant(params)], *params)
            return _job_id(None if value is None else (value,))
        if _is_psycopg_async(conn):
            cur = await conn.execute(_PSYCOPG_SQL[_variant(params)], params)
            return _job_id(await cur.fetchone())
    except Exception as exc:
        _raise_refusal(exc)
        raise
    raise TypeError(
        "enqueue_tx_async: conn must be a psycopg 3 AsyncConnection or AsyncCursor or an "
        f"asyncpg connection, got {_name(conn)} (use enqueue_tx for a sync connection)"
    )


def _is_asyncpg(conn: object) -> TypeGuard[_AsyncpgConnection]:
    return _driver(conn) == "asyncpg"


def _is_psycopg_async(
    conn: object,
) -> TypeGuard[psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]]:
    return _driver(conn) == "psycopg" and inspect.iscoroutinefunction(
        getattr(conn, "execute", None)
    )


def _driver(conn: object) -> str:
    """The top-level module of ``conn``'s class: ``psycopg``, ``asyncpg``, or another."""
    return type(conn).__module__.partition(".")[0]


def _name(conn: object) -> str:
    cls = type(conn)
    return f"{cls.__module__}.{cls.__qualname__}"


def _params(
    queue: Any,
    payload: Any,
    priority: Any,
    delay_s: Any,
    run_at: Any,
    expires_s: Any,
    visibility_timeout_s: Any,
    max_attempts: Any,
    backoff_base_s: Any,
    key: Any,
    timeout_s: Any,
    partition: Any,
    after: Any = None,
) -> tuple[Any, ...]:
    """The function's arguments, in its order (``partition`` and ``after`` only when
    given: a partition key as a str, the ids as a list, told apart by ``_variant``).
    Here are only the checks SQL's types cannot make (a bool or a float where an int
    belongs, a string PostgreSQL cannot hold); the function checks every value's range,
    for every language alike."""
    try:
        data = encode_payload(payload, field="payload")
    except WireError as exc:
        raise InvalidArgument(exc.message, field=exc.field) from None
    part = _text("partition", partition, null=True)
    if after is None:
        ids: list[str | None] = []
    elif isinstance(after, list | tuple):
        ids = [_text(f"after[{i}]", job_id, null=False) for i, job_id in enumerate(after)]
    else:
        raise InvalidArgument(
            f"after: must be a list of job ids, got {type(after).__name__}", field="after"
        )
    return (
        (
            _text("queue", queue, null=False),
            data.decode("utf-8"),
            _int("priority", 0 if priority is None else priority),
            _float("delay_s", delay_s),
            _float("run_at", run_at),
            _float("expires_s", expires_s),
            _float("visibility_timeout_s", visibility_timeout_s),
            None if max_attempts is None else _int("max_attempts", max_attempts),
            _float("backoff_base_s", backoff_base_s),
            _text("key", key, null=True),
            _float("timeout_s", timeout_s),
        )
        + (() if not part else (part,))
        + (() if not ids else (ids,))
    )


def _variant(params: tuple[Any, ...]) -> tuple[bool, bool]:
    """Which of the function's last arguments ``params`` carries: (partition, after)."""
    extra = params[len(_CASTS) + 2 :]
    return (
        any(isinstance(value, str) for value in extra),
        any(isinstance(value, list) for value in extra),
    )


def _int(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{field}: must be an int, got {type(value).__name__}", field=field)
    return value


def _float(field: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{field}: must be a number, got {type(value).__name__}", field=field)
    try:
        return float(value)
    except OverflowError:
        raise InvalidArgument(
            f"{field}: must be finite, got a number too large", field=field
        ) from None


def _text(field: str, value: Any, *, null: bool) -> str | None:
    if value is None and null:
        return None
    if not isinstance(value, str):
        wanted = "a string or null" if null else "a string"
        raise InvalidArgument(f"{field}: must be {wanted}, got {type(value).__name__}", field=field)
    if "\x00" in value:
        raise InvalidArgument(
            f"{field}: holds a NUL character, which PostgreSQL text cannot store",
            field=field,
        )
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(
                f"{field}: holds a lone surrogate, not valid Unicode", field=field
            ) from None
    return value


def _job_id(row: Any) -> str:
    if row is None or not isinstance(row[0], str):
        raise RuntimeError("conveyor_enqueue answered no job id")
    job_id: str = row[0]
    return job_id


def _raise_refusal(exc: BaseException) -> None:
    """Raise the SDK's error for a refusal of ``conveyor_enqueue`` (its message
    ``<code>: <field>: <problem>``), from either driver's exception; return for any
    other error, which the caller re-raises as it is."""
    diag = getattr(exc, "diag", None)  # psycopg
    if diag is not None:
        message = getattr(diag, "message_primary", None)
        column = getattr(diag, "column_name", None)
    else:  # asyncpg
        message = getattr(exc, "message", None)
        column = getattr(exc, "column_name", None)
    if getattr(exc, "sqlstate", None) not in {"22023", "54000"} or not isinstance(message, str):
        return
    code, _, rest = message.partition(": ")
    cls = _REFUSALS.get(code)
    if cls is None or not rest:
        return
    field = column if isinstance(column, str) and column else rest.partition(": ")[0]
    raise cls(rest, field=field) from exc
