"""Conveyor's client side: the wire protocol (``sdk._wire``), publishers and workers.

The SDK never imports ``broker``; the broker imports the SDK's wire definitions.
"""

__all__: list[str] = []
