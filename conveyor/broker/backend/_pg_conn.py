"""Connections to PostgreSQL, as the backend and the database clock make them, and the
error for a database that cannot be reached now (``Unavailable``)."""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..store import StoreError

__all__ = ["Conn", "Unavailable", "close_quietly", "connect", "unavailable", "why"]

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

# Connection settings given unless the DSN names them: a connect that cannot finish, and
# a peer gone without a word (a half-open TCP connection), end in bounded time.
CONNECT_DEFAULTS = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}


class Unavailable(StoreError):
    """The database cannot be reached now (a lost connection, a server restarting, a
    transaction the server gave up on): the call did not take effect, or its outcome is
    unknown (its COMMIT went unanswered). Retry later: the backend reconnects by itself.
    Unlike its base class, not a reason for the broker to stop."""


def why(exc: BaseException) -> str:
    """``exc`` in one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def unavailable(reason: str) -> Unavailable:
    return Unavailable(f"postgres: unavailable: {reason}")


def conninfo(dsn: str) -> str:
    """``dsn`` with ``CONNECT_DEFAULTS`` for what it does not name."""
    given = conninfo_to_dict(dsn)
    extra = {key: value for key, value in CONNECT_DEFAULTS.items() if key not in given}
    return make_conninfo(dsn, **extra)


async def connect(dsn: str) -> Conn:
    """An autocommit connection to ``dsn``; raises psycopg's errors or ``OSError``."""
    return await psycopg.AsyncConnection.connect(conninfo(dsn), autocommit=True)


async def close_quietly(conn: Conn) -> None:
    """Close ``conn``; a connection already lost closes as well."""
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()
