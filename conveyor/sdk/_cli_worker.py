"""``conveyor worker module.path:name``: run a ``Worker`` defined in the application's code.

Registered by ``_cli.add_client_commands``. The flags override what the ``Worker`` was
made with, each also read from an environment variable (the flag wins):

* ``--url`` (``CONVEYOR_URL``): the broker URL(s), in place of the Worker's own;
* ``--queues a,b`` (``CONVEYOR_QUEUES``): subscribe to these queues instead of the
  Worker's own (each needs a handler or a task);
* ``--prefetch N`` (``CONVEYOR_PREFETCH``): jobs pushed ahead, and handlers run at once;
* ``--loop`` (``CONVEYOR_LOOP``): the event loop;
* ``--log-level`` (``CONVEYOR_LOG_LEVEL``, default ``info``): the level of the root
  handler this command configures, which shows the Worker's ``conveyor.worker`` lines.

Exits 0 after a graceful stop (SIGTERM, SIGINT), 1 when the broker refused the worker
(a wrong token, say), 2 for a bad argument, with one line on stderr saying which.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from typing import Any

from ._cli_admin import say
from ._errors import ConveyorError
from ._loop import LOOP_HELP, LOOPS, UVLOOP_MISSING, loop_factory, loop_problem
from ._worker import Worker

__all__ = ["add_worker_command"]

LOG_LEVELS = ("debug", "info", "warning", "error")


def _queues(value: str) -> list[str]:
    """``--queues``' value: comma-separated names, none empty, none twice."""
    names = [name.strip() for name in value.split(",")]
    if not value.strip() or any(not name for name in names):
        raise argparse.ArgumentTypeError(f"must be comma-separated queue names, got {value!r}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"names a queue twice: {value!r}")
    return names


def _prefetch(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value!r}")
    return number


def _log_level(value: str) -> str:
    level = value.strip().lower()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return level


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
        say(problem)
        return 2
    try:
        factory = loop_factory(choice)
    except ImportError:
        print(UVLOOP_MISSING, file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    worker = _load_worker(args.target)
    if args.url is not None:
        worker.urls = args.url
    if args.queues is not None:
        missing = [queue for queue in args.queues if queue not in worker.handlers]
        if missing:
            names = ", ".join(repr(queue) for queue in missing)
            say(
                f"--queues: no handler for {names} in {args.target} "
                f"(it handles {', '.join(worker.handlers) or 'none'})"
            )
            return 2
        worker.queues = list(args.queues)
    if args.prefetch is not None:
        worker.prefetch = args.prefetch
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(worker.run())
    except ConveyorError as exc:
        say(f"{exc.code}: {exc.message}")
        return 1
    return 0


def _env(name: str, parse: Any, flag: str) -> Any:
    """The environment variable ``name`` parsed as ``flag``'s value would be, ``None``
    when unset or empty; a bad value is a bad argument naming the variable."""
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return parse(value)
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"conveyor: {name} (for {flag}): {exc}") from None


def add_worker_command(commands: Any, url_type: Any, url_help: str) -> None:
    """Add ``conveyor worker`` to ``conveyor``'s subparsers; ``url_type`` and ``url_help``
    are the other client commands' ``--url`` parsing and help."""
    worker = commands.add_parser("worker", help="run a Worker defined in your code")
    worker.add_argument("target", help="module.path:name of a sdk.Worker object")
    # uvloop by default, as the broker: a busy worker takes more jobs per second on it
    # than on asyncio's loop (docs/benchmarks.md).
    worker.add_argument("--loop", choices=LOOPS, help=LOOP_HELP)
    worker.add_argument(
        "--url",
        type=url_type,
        default=os.environ.get("CONVEYOR_URL") or None,
        help=f"{url_help} (CONVEYOR_URL; default: the Worker's own)",
    )
    worker.add_argument(
        "--queues",
        type=_queues,
        metavar="A,B",
        help="subscribe to these queues (comma-separated, in order of precedence) instead "
        "of the Worker's own; each needs a handler (CONVEYOR_QUEUES)",
    )
    worker.add_argument(
        "--prefetch",
        type=_prefetch,
        metavar="N",
        help="jobs the broker may push ahead, and so handlers run at once "
        "(CONVEYOR_PREFETCH; default: the Worker's own)",
    )
    worker.add_argument(
        "--log-level",
        type=_log_level,
        metavar="{" + ",".join(LOG_LEVELS) + "}",
        help="what to log: info shows the connection and one line per job "
        "(CONVEYOR_LOG_LEVEL; default info)",
    )
    worker.set_defaults(run=_with_env)


def _with_env(args: argparse.Namespace) -> int:
    """``_worker``, with each flag not given taken from its environment variable. (Read
    here, not as argparse defaults, so that a bad variable is named as the variable.)"""
    try:
        if args.queues is None:
            args.queues = _env("CONVEYOR_QUEUES", _queues, "--queues")
        if args.prefetch is None:
            args.prefetch = _env("CONVEYOR_PREFETCH", _prefetch, "--prefetch")
        if args.log_level is None:
            args.log_level = _env("CONVEYOR_LOG_LEVEL", _log_level, "--log-level") or "info"
    except SystemExit as exc:
        print(exc.code, file=sys.stderr)
        return 2
    return _worker(args)
