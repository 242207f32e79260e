"""Tokens: what a bearer token grants, and how many connections may hold each one.

The roles themselves are the configuration's (``Config.roles_for``); this module keeps
the per-token connection count (docs/protocol.md §4, §12) and reads bearer headers.
"""

from __future__ import annotations

from websockets.datastructures import Headers

from ..sdk._wire import ErrorCode, WireError

__all__ = ["TokenSlots", "bearer"]


def bearer(headers: Headers) -> str | None:
    """The token of an ``Authorization: Bearer`` header; ``""`` for another scheme or an
    empty token (which no token matches), ``None`` without the header."""
    value = headers.get("Authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else ""


class TokenSlots:
    """How many open connections hold each token, up to ``limit`` per token."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}

    def take(self, token: str) -> None:
        """Count one more connection on ``token``; ``limit_exceeded`` when it has all."""
        held = self._held.get(token, 0)
        if held >= self.limit:
            raise WireError(
                ErrorCode.LIMIT_EXCEEDED,
                f"token: at most {self.limit} connections per token",
                "token",
            )
        self._held[token] = held + 1

    def release(self, token: str) -> None:
        """A connection holding ``token`` ended, or moved to another token."""
        left = self._held[token] - 1
        if left:
            self._held[token] = left
        else:
            del self._held[token]

    def held(self, token: str) -> int:
        return self._held.get(token, 0)
