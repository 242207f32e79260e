"""The client commands of ``conveyor``: ``worker`` here, the one-shot ones in ``_cli_admin``.

``broker.cli`` registers them beside ``serve``. The one-shot commands (``enqueue``,
``job``, ``jobs``, ``dead``, ``stats``, ``cancel``, ``pause``, ``resume``, ``redrive``,
``purge``) talk to a running broker at ``--url`` (``CONVEYOR_URL``, default
``ws://127.0.0.1:8765/ws``; several comma-separated URLs of brokers sharing one job table
fail over between them) with ``--token`` (``CONVEYOR_TOKEN``), print text for people or
``--json`` for scripts, and exit 0 on success, 1 when the broker refused, could not be
reached or nothing happened, 2 for bad arguments; errors go to stderr in one line.
``worker`` takes ``--url`` (or ``CONVEYOR_URL``) too, in place of the ``Worker``'s own.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from typing import Any

from ._cli_admin import add_admin_commands
from ._errors import ConveyorError
from ._loop import LOOP_HELP, LOOPS, UVLOOP_MISSING, loop_factory, loop_problem
from ._urls import URL_HELP
from ._urls import url_argument as _urls
from ._worker import Worker

__all__ = ["add_client_commands"]


def _load_worker(target: str) -> Worker:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise SystemExit(f"conveyor: worker target must look like module.path:name, got {target!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"conveyor: cannot import {module_name!r}: {exc}") from None
    worker = getattr(module, attribute, None)
    if not isinstance(worker, Worker):
        raise SystemExit(f"conveyor: {target} is not a sdk.Worker (got {type(worker).__name__})")
    return worker


def _worker(args: argparse.Namespace) -> int:
    choice = args.loop or os.environ.get("CONVEYOR_LOOP") or "auto"
    problem = loop_problem(choice)
    if problem is not None:
        print(f"conveyor: {problem}", file=sys.stderr)
        return 2
    try:
        factory = loop_factory(choice)
    except ImportError:
        print(UVLOOP_MISSING, file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    worker = _load_worker(args.target)
    if args.url is not None:
        worker.urls = args.url
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(worker.run())
    except ConveyorError as exc:
        print(f"conveyor: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    return 0


def add_client_commands(commands: Any) -> None:
    """Add the client subcommands to ``conveyor``'s subparsers."""
    worker = commands.add_parser("worker", help="run a Worker defined in your code")
    worker.add_argument("target", help="module.path:name of a sdk.Worker object")
    # uvloop by default, as the broker: a busy worker takes more jobs per second on it
    # than on asyncio's loop (docs/benchmarks.md).
    worker.add_argument(
        "--loop",
        choices=LOOPS,
        help=LOOP_HELP,
    )
    worker.add_argument(
        "--url",
        type=_urls,
        default=os.environ.get("CONVEYOR_URL") or None,
        help=f"{URL_HELP} (CONVEYOR_URL; default: the Worker's own)",
    )
    worker.set_defaults(run=_worker)

    add_admin_commands(commands)
