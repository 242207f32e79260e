"""The ``conveyor`` command (and ``python -m conveyor``).

``conveyor serve`` runs the broker; its flags are in ``broker.config``. Once listening it
prints two lines on stdout: ``conveyor listening on ws://HOST:PORT/ws (store: ...)`` and
``dashboard: http://HOST:PORT/``. Its exit status:

* 0: stopped cleanly (SIGTERM or SIGINT).
* 1: cannot listen on the address.
* 2: refused at start: a bad setting, or a store it cannot open or account for (a
  damaged file, commits lost: ``--accept-loss`` starts anyway); one line on stderr says
  which file and what is wrong.
* 3: the store failed while running (a write or an fsync): the broker stopped after
  logging it (CRITICAL), and answered nothing that depended on it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import resource
import sys
import urllib.parse
from collections.abc import Sequence

from ..sdk._cli import add_client_commands
from ..sdk._loop import UVLOOP_MISSING, loop_factory
from . import __version__
from .admission import is_loopback
from .config import ConfigError, add_serve_arguments, config_from_args
from .server import Broker, serve_until_signalled
from .store import StoreError

__all__ = ["main"]

EXIT_REFUSED = 2  # a bad setting, or a store refused at start
EXIT_STORE_FAILED = 3  # the store failed while running

log = logging.getLogger("conveyor")


def _raise_fd_limit() -> None:
    """Allow as many open sockets as the system lets us: each connection holds one."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):  # not allowed here: keep the limit we have
        pass


def _serve(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"conveyor: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    _raise_fd_limit()
    # websockets logs its own view of peer faults; ours are enough.
    logging.getLogger("websockets").setLevel(logging.CRITICAL)
    if not config.tokens and not is_loopback(config.host):
        log.warning(
            "!!! conveyor is bound to %s with NO TOKENS: anyone who can reach this port "
            "may enqueue, take and delete jobs. Set --admin-token/--publish-token/"
            "--work-token/--read-token (or CONVEYOR_*_TOKENS). !!!",
            config.host,
        )

    def ready(broker: Broker) -> None:
        # The cyclic collector was off while the store loaded: restoring makes millions
        # of objects that all live on, and it would have walked the growing table again
        # and again, finding nothing (its cost: docs/benchmarks.md). What exists now, the
        # restored table above all, lives as long as the process or is freed by reference
        # counting (a job row holds no cycle once deleted), so it is frozen out of the
        # collector: later full collections do not walk it (each such walk stopped the
        # broker for the whole walk; see docs/benchmarks.md).
        gc.freeze()
        # A collection of the youngest generation every 10,000 new objects, not 700: a
        # job makes a few long-lived objects, and each young collection promotes them a
        # step toward the full collections (the collector's time measured: see
        # docs/benchmarks.md, "Why the code is shaped this way").
        gc.set_threshold(10_000, 10, 10)
        gc.enable()
        where = {
            "sqlite": f"sqlite {config.db_path}",
            "postgres": f"postgres {_without_password(config.db_path)}",
        }.get(config.store, config.store)
        print(f"conveyor listening on {broker.url} (store: {where})", flush=True)
        print(f"dashboard: {dashboard_url(broker.url)}", flush=True)

    try:
        factory = loop_factory(config.loop)
    except ImportError:
        print(UVLOOP_MISSING, file=sys.stderr)
        return EXIT_REFUSED
    gc.disable()  # until ready(): see there
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            failed = runner.run(serve_until_signalled(config, ready))
    except (StoreError, ConfigError) as exc:  # (a schedule the job table refused at start)
        print(f"conveyor: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:
        print(f"conveyor: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    return 0 if failed is None else EXIT_STORE_FAILED


def dashboard_url(url: str) -> str:
    """The dashboard's address on the broker whose WebSocket endpoint is ``url``: the
    same host and port over HTTP (HTTPS with TLS), at ``/``."""
    parts = urllib.parse.urlsplit(url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return urllib.parse.urlunsplit((scheme, parts.netloc, "/", "", ""))


def _without_password(url: str) -> str:
    """``url`` as it may be printed: a password in it replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conveyor",
        description="Conveyor: a job queue broker that pushes work over WebSockets.",
    )
    parser.add_argument("--version", action="version", version=f"conveyor {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the broker")
    add_serve_arguments(serve)
    serve.set_defaults(run=_serve)
    add_client_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.run(args)
    return result
