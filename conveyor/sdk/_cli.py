"""The client commands of ``conveyor``: ``worker``, ``enqueue``, ``job``, ``cancel``, ``stats``.

``broker.cli`` registers them beside ``serve``. Each talks to a running broker at
``--url`` (``CONVEYOR_URL``, default ``ws://127.0.0.1:8765/ws``; several comma-separated
URLs of brokers sharing one job table fail over between them) with ``--token``
(``CONVEYOR_TOKEN``), prints JSON on stdout, and exits 0 on success, 1 when the broker
refused or could not be reached, 2 for bad arguments; errors go to stderr in one line.
``worker`` (``_cli_worker``) takes ``--url`` too, in place of the ``Worker``'s own.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from ._client import Client
from ._errors import ConnectionFailed, ConveyorError
from ._urls import DEFAULT_URL, brokers, parse_urls
from ._wire import WireError, decode_value, encode

__all__ = ["add_client_commands"]


URL_HELP = (
    "broker URL, or several comma-separated (ws://a:8765,ws://b:8765) of brokers sharing "
    "one job table: one is used, the next tried at once when it cannot be reached"
)


def _urls(value: str) -> tuple[str, ...]:
    """``--url``'s value (or ``CONVEYOR_URL``'s) as the URLs it lists; a bad one is a bad
    argument (exit 2) naming it."""
    try:
        return parse_urls(value)
    except ConveyorError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _connection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        type=_urls,  # (applied to the default too, so a bad CONVEYOR_URL is refused alike)
        default=os.environ.get("CONVEYOR_URL") or DEFAULT_URL,
        help=f"{URL_HELP} (CONVEYOR_URL; default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--token", default=os.environ.get("CONVEYOR_TOKEN") or None, help="(CONVEYOR_TOKEN)"
    )
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the broker (5)"
    )


def _print(value: Any) -> None:
    print(encode(value).decode())


def _with_client(args: argparse.Namespace, action: Callable[[Client], Awaitable[Any]]) -> int:
    # One-shot commands report an unreachable broker themselves, once.
    logging.getLogger("conveyor.sdk").setLevel(logging.ERROR)

    async def main() -> Any:
        async with Client(
            args.url, args.token, connect_timeout=args.timeout, request_timeout=args.timeout
        ) as client:
            return await action(client)

    try:
        result = asyncio.run(main())
    except ConnectionFailed:
        running = "is it running?" if len(args.url) == 1 else "is one running?"
        print(f"conveyor: cannot reach {brokers(args.url)}; {running}", file=sys.stderr)
        return 1
    except ConveyorError as exc:
        print(f"conveyor: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    _print(result)
    return 0


def _enqueue(args: argparse.Namespace) -> int:
    try:
        payload = decode_value(args.payload)
    except WireError as exc:
        print(f"conveyor: the payload is not valid JSON: {exc}", file=sys.stderr)
        return 2
    options = {
        name: getattr(args, name)
        for name in ("priority", "delay_s", "run_at", "expires_s", "max_attempts", "key")
        if getattr(args, name) is not None
    }
    return _with_client(args, lambda c: _enqueue_one(c, args.queue, payload, options))


async def _enqueue_one(client: Client, queue: str, payload: Any, options: dict[str, Any]) -> Any:
    return {"id": await client.enqueue(queue, payload, **options)}


async def _job(client: Client, job_id: str) -> Any:
    info = await client.get_job(job_id)
    return None if info is None else dataclasses.asdict(info)


def add_client_commands(commands: Any) -> None:
    """Add the client subcommands to ``conveyor``'s subparsers."""
    # (In a module of its own: it has flags and a runtime of its own.)
    from ._cli_worker import add_worker_command

    add_worker_command(commands, _urls, URL_HELP)

    enqueue = commands.add_parser("enqueue", help="enqueue one job")
    enqueue.add_argument("queue")
    enqueue.add_argument("payload", help='the payload as JSON, e.g. \'{"to": "a@b.c"}\'')
    enqueue.add_argument("--priority", type=int)
    enqueue.add_argument("--delay", dest="delay_s", type=float, help="seconds")
    enqueue.add_argument("--run-at", dest="run_at", type=float, help="epoch seconds")
    enqueue.add_argument("--expires", dest="expires_s", type=float, help="seconds")
    enqueue.add_argument("--max-attempts", dest="max_attempts", type=int)
    enqueue.add_argument("--key", help="idempotency key")
    _connection_args(enqueue)
    enqueue.set_defaults(run=_enqueue)

    job = commands.add_parser("job", help="show one job")
    job.add_argument("id")
    _connection_args(job)
    job.set_defaults(run=lambda a: _with_client(a, lambda c: _job(c, a.id)))

    cancel = commands.add_parser("cancel", help="cancel one job")
    cancel.add_argument("id")
    _connection_args(cancel)
    cancel.set_defaults(
        run=lambda a: _with_client(a, lambda c: _cancelled(c, a.id)),
    )

    stats = commands.add_parser("stats", help="counts per queue")
    stats.add_argument("--queue")
    _connection_args(stats)
    stats.set_defaults(run=lambda a: _with_client(a, lambda c: c.stats(a.queue)))


async def _cancelled(client: Client, job_id: str) -> Any:
    return {"cancelled": await client.cancel(job_id)}
