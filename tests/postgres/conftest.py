"""Fixtures of the PostgreSQL tests: the SDK tests' ``probe`` (every request any
in-process broker handles)."""

from ..sdk.conftest import probe

__all__ = ["probe"]
