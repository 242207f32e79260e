"""Conveyor's broker: the job table engine, its storage, and the WebSocket server."""

from .. import __version__

__all__ = ["__version__"]
