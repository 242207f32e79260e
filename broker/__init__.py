"""Conveyor's broker: the job table engine, its storage, and the WebSocket server."""

__version__ = "0.1.0"
