"""The client commands of ``conveyor``: ``worker`` (``_cli_worker``) and the one-shot ones
(``_cli_admin``).

``broker.cli`` registers them beside ``serve``. The one-shot commands (``enqueue``,
``job``, ``jobs``, ``dead``, ``stats``, ``cancel``, ``pause``, ``resume``, ``redrive``,
``purge``, ``schedule ...``) talk to a running broker at ``--url`` (``CONVEYOR_URL``, default
``ws://127.0.0.1:8765/ws``; several comma-separated URLs of brokers sharing one job table
fail over between them) with ``--token`` (``CONVEYOR_TOKEN``), print text for people or
``--json`` for scripts, and exit 0 on success, 1 when the broker refused, could not be
reached or nothing happened, 2 for bad arguments; errors go to stderr in one line.
``worker`` takes ``--url`` (or ``CONVEYOR_URL``) too, in place of the ``Worker``'s own.
"""

from __future__ import annotations

from typing import Any

from ._cli_admin import add_admin_commands, add_schedule_commands
from ._cli_worker import add_worker_command
from ._urls import URL_HELP, url_argument

__all__ = ["add_client_commands"]


def add_client_commands(commands: Any) -> None:
    """Add the client subcommands to ``conveyor``'s subparsers."""
    add_worker_command(commands, url_argument, URL_HELP)
    add_admin_commands(commands)
    add_schedule_commands(commands)
