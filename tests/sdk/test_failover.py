"""Several broker URLs: the SDK connects to one and fails over to the next.

Real brokers on port 0, each with its own memory store (the brokers of a deployment
share one job table; these do not, so a job enqueued on one is not seen by the other,
which lets the tests tell where each request went). To show that failing over does not
wait out the backoff, the backoff is made a minute long: a test that waited for it
would time out instead of passing slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import subprocess
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from conveyor.broker.server import Broker, running_broker
from conveyor.sdk import Client, ConnectionFailed, InvalidArgument, Job, SyncClient, Worker
from conveyor.sdk._session import Session
from conveyor.sdk._urls import connection_order, parse_urls

from .conftest import BASE_CONFIG, ROOT, WAIT, Lines, Probe, Proxy, conveyor, free_ports, running
from .conftest import stop as stop_process


def dead_url() -> str:
    """The URL of a port nothing listens on: connecting is refused at once."""
    (url,) = dead_urls(1)
    return url


def dead_urls(n: int) -> list[str]:
    """``n`` different such URLs."""
    return [f"ws://127.0.0.1:{port}/ws" for port in free_ports(n)]


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


@pytest.fixture
def long_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every session backs off a minute after a whole round of failed tries."""
    monkeypatch.setattr(Session, "_backoff", lambda self, tries: 60.0)


@contextlib.asynccontextmanager
async def stoppable() -> AsyncIterator[tuple[Broker, contextlib.AsyncExitStack]]:
    """A broker and the stack that stops it (``await stack.aclose()``), or the block's end."""
    async with contextlib.AsyncExitStack() as stack:
        broker = await stack.enter_async_context(running_broker(BASE_CONFIG))
        yield broker, stack


@pytest.fixture
async def second() -> AsyncIterator[Broker]:
    async with running_broker(BASE_CONFIG) as broker:
        yield broker


def sdk_lines(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "conveyor.sdk" and needle in r.getMessage()
    ]


# -- connecting -----------------------------------------------------------------------------


@pytest.mark.usefixtures("long_backoff")
async def test_a_client_skips_a_dead_url_without_backing_off(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="conveyor.sdk")
    dead = dead_url()
    async with Client(
        [dead, broker.url], shuffle_urls=False, connect_timeout=WAIT, request_timeout=WAIT
    ) as client:
        assert client.urls == (dead, broker.url)
        assert client.url == broker.url
        job_id = await client.enqueue("failover-a", {"n": 1})
        assert (await client.get_job(job_id)) is not None
    assert client.url is None  # closed
    # The dead URL is named once, when the outage starts; the connection once, by its URL.
    assert sdk_lines(caplog, "cannot reach") == [
        f"cannot reach the broker at {dead}; trying the next broker"
    ]
    assert len(sdk_lines(caplog, f"to the broker at {broker.url}")) == 1


async def test_the_first_connection_logs_one_info_line_naming_its_url(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="conveyor.sdk")
    async with Client(broker.url, connect_timeout=WAIT) as client:
        assert client.url == broker.url
    records = [r for r in caplog.records if r.name == "conveyor.sdk"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.INFO, f"connected to the broker at {broker.url}")
    ]


async def test_a_client_that_reaches_no_broker_names_them_all() -> None:
    urls = dead_urls(2)
    with pytest.raises(ConnectionFailed) as caught:
        async with Client(urls, connect_timeout=0.5):
            pass
    assert caught.value.message == (
        f"cannot reach any of the brokers at {urls[0]}, {urls[1]} within 0.5 s"
    )


@pytest.mark.usefixtures("long_backoff")
async def test_the_backoff_comes_only_after_every_url_failed_in_a_row() -> None:
    tries: list[int] = []

    def refusing(n: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            tries.append(n)  # a TCP connection, closed before the WebSocket handshake
            writer.close()

        return handle

    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for n in range(3):
            server = await asyncio.start_server(refusing(n), "127.0.0.1", 0)
            stack.push_async_callback(server.wait_closed)
            stack.callback(server.close)
            urls.append(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/ws")
        with pytest.raises(ConnectionFailed):
            async with Client(urls, shuffle_urls=False, connect_timeout=1.0):
                pass
    # One round, each URL once in order, then the (minute-long) backoff outlasted entering.
    assert tries == [0, 1, 2]


async def test_the_comma_separated_form_is_the_list_form(broker: Broker) -> None:
    dead = dead_url()
    async with Client(
        f"{dead.removesuffix('/ws')} , {broker.url}", shuffle_urls=False, connect_timeout=WAIT
    ) as client:
        assert client.urls == (dead, broker.url)  # each normalized, spaces dropped
        assert client.url == broker.url
        assert await client.enqueue("failover-comma", 1)


def test_urls_are_tried_in_the_order_given_or_a_random_order_per_session() -> None:
    urls = ("ws://a/ws", "ws://b/ws", "ws://c/ws")
    assert connection_order(urls, shuffle=False) == urls
    orders = {connection_order(urls, shuffle=True, rng=random.Random(seed)) for seed in range(60)}
    assert all(sorted(order) == sorted(urls) for order in orders)  # each tried, once a round
    assert {order[0] for order in orders} == set(urls)  # so workers spread over the brokers
    assert parse_urls(["ws://a", "ws://a/ws", "ws://b"]) == ("ws://a/ws", "ws://b/ws")


# -- failing over ---------------------------------------------------------------------------


@pytest.mark.usefixtures("long_backoff")
async def test_a_client_moves_to_the_next_broker_when_its_broker_stops(
    second: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="conveyor.sdk")
    async with stoppable() as (first, stop_first):
        client = Client(
            [first.url, second.url], shuffle_urls=False, connect_timeout=WAIT, request_timeout=WAIT
        )
        async with client:
            assert client.url == first.url
            await client.enqueue("failover-move", "on the first")
            await stop_first.aclose()
            job_id = await client.enqueue("failover-move", "on the second")
            assert client.url == second.url
            info = await client.get_job(job_id)
            assert info is not None and info.payload == "on the second"
            stats = (await client.stats("failover-move"))["failover-move"]
            assert stats["totals"]["enqueued"] == 1  # the second broker's own table
    assert sdk_lines(caplog, "lost the connection") == [
        f"lost the connection to the broker at {first.url}; trying the next broker"
    ]
    assert len(sdk_lines(caplog, f"reconnected to the broker at {second.url}")) == 1


@pytest.mark.usefixtures("long_backoff")
async def test_an_enqueue_unanswered_when_the_connection_drops_is_resent_to_the_next_broker(
    broker: Broker, second: Broker, probe: Probe
) -> None:
    async with Proxy(port_of(broker.url)) as proxy:
        proxy.cut_after = b"enqueue"  # the first broker gets it; its reply is lost
        async with Client(
            [proxy.url, second.url], shuffle_urls=False, connect_timeout=WAIT, request_timeout=WAIT
        ) as client:
            job_id = await asyncio.wait_for(client.enqueue("failover-resend", {"n": 1}), WAIT)
            assert proxy.cuts == 1
            assert client.url == second.url
            sent = probe.handled("enqueue")
            assert len(sent) == 2  # once to each broker...
            assert sent[0].fields["key"] == sent[1].fields["key"]  # ...with the same key,
            # which a shared job table stores once; these two brokers have a table each.
            assert sent[1].result["id"] == job_id
            info = await client.get_job(job_id)
            assert info is not None and info.key == sent[0].fields["key"]


@pytest.mark.usefixtures("long_backoff")
async def test_a_worker_fails_over_re_attaching_its_leases_and_works_on(
    second: Broker, probe: Probe
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    handled: dict[str, asyncio.Event] = {}
    leases: dict[str, str] = {}
    where: dict[str, str | None] = {}  # job -> the worker's url while its handler ran

    async with stoppable() as (first, stop_first):
        worker = Worker(
            [first.url, second.url],
            queues=["failover-w"],
            shuffle_urls=False,
            shutdown_timeout_s=1.0,
        )

        @worker.handler("failover-w")
        async def handle(job: Job) -> None:
            leases[job.payload] = job.lease
            where[job.payload] = worker.url
            if job.payload == "long":
                started.set()
                await release.wait()
            handled.setdefault(job.payload, asyncio.Event()).set()

        assert worker.url is None  # not running yet
        async with running(worker, probe):
            async with Client(first.url, connect_timeout=WAIT) as on_first:
                long_id = await on_first.enqueue("failover-w", "long")
            await asyncio.wait_for(started.wait(), WAIT)
            assert where["long"] == first.url

            await stop_first.aclose()  # the broker dies under the running job
            again = await probe.count("subscribe", 2)
            # The job still running is re-attached by its lease, as on any reconnect (a
            # table shared with the first broker would still hold it).
            assert again[1].fields["worker_id"] == worker.worker_id
            assert again[1].fields["leases"] == [{"id": long_id, "lease": leases["long"]}]

            async with Client(second.url, connect_timeout=WAIT) as on_second:
                job_id = await on_second.enqueue("failover-w", "after")
                await asyncio.wait_for(handled.setdefault("after", asyncio.Event()).wait(), WAIT)
                assert (await probe.report("ack", job_id)).result == {"landed": True}
                assert where["after"] == second.url
                assert await on_second.get_job(job_id) is None
            release.set()
            await asyncio.wait_for(handled.setdefault("long", asyncio.Event()).wait(), WAIT)
    assert worker.url is None  # stopped


# -- bad URLs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("urls", "message"),
    [
        (
            ["ws://127.0.0.1:8765", "http://127.0.0.1:8766"],
            "url: must start with ws:// or wss://, got 'http://127.0.0.1:8766' (entry 2 of 2)",
        ),
        (
            "ws://a:1,ftp://b:2,ws://c:3",
            "url: must start with ws:// or wss://, got 'ftp://b:2' (entry 2 of 3)",
        ),
        ("ws://a:1,ws://b:99999", "got 'ws://b:99999' (entry 2 of 2)"),
        ("ws://a:1,ws:///ws", "url: must name the broker's host, got 'ws:///ws' (entry 2 of 2)"),
        ("ws://a:1,,ws://b:2", "url: entry 2 of 'ws://a:1,,ws://b:2' is empty"),
        ("ws://a:1,", "url: entry 2 of 'ws://a:1,' is empty"),
        ([], "url: no broker URL given, got []"),
        ("", "url: no broker URL given, got ''"),
        (["ws://a:1", 7], "url: must be a URL, comma-separated URLs or a sequence of URLs"),
    ],
    ids=["list", "comma", "port", "host", "empty entry", "trailing comma", "none", "blank", "type"],
)
def test_a_bad_url_is_refused_naming_it(urls: object, message: str) -> None:
    for make in (Client, SyncClient, Worker):
        with pytest.raises(InvalidArgument) as caught:
            make(urls)  # type: ignore[arg-type]
        assert caught.value.field == "url"
        assert message in caught.value.message, caught.value.message


# -- the sync client ------------------------------------------------------------------------


def test_the_sync_client_skips_a_dead_url(broker_process: str) -> None:
    dead = dead_url()
    client = SyncClient(f"{dead},{broker_process}", shuffle_urls=False, connect_timeout=WAIT)
    assert client.urls == (dead, broker_process)
    assert client.url is None  # not connected outside `with`
    with client:
        assert client.url == broker_process
        job_id = client.enqueue(f"failover-sync-{uuid.uuid4().hex[:8]}", {"n": 1})
        assert client.get_job(job_id) is not None
    assert client.url is None


# -- the CLI and CONVEYOR_URL ---------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    return subprocess.run(
        conveyor(*args),
        capture_output=True,
        text=True,
        timeout=15,
        cwd=ROOT,
        env={**base, **(env or {})},
    )


def test_the_cli_takes_several_urls_by_flag_or_by_conveyor_url(broker_process: str) -> None:
    urls = f"{dead_url()},{broker_process}"
    queue = f"failover-cli-{uuid.uuid4().hex[:8]}"
    by_flag = cli("enqueue", queue, "1", "--url", urls)
    assert by_flag.returncode == 0, by_flag.stderr
    by_env = cli("stats", "--queue", queue, "--json", env={"CONVEYOR_URL": urls})
    assert by_env.returncode == 0, by_env.stderr
    assert f'"{queue}"' in by_env.stdout and '"enqueued":1' in by_env.stdout


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_cli_refuses_a_bad_url_in_the_list_naming_it(how: str) -> None:
    urls = "ws://127.0.0.1:1,wss//oops"
    if how == "flag":
        done = cli("stats", "--url", urls)
    else:
        done = cli("stats", env={"CONVEYOR_URL": urls})
    assert done.returncode == 2
    assert "url: must start with ws:// or wss://, got 'wss//oops' (entry 2 of 2)" in done.stderr


def test_the_cli_names_every_url_it_could_not_reach() -> None:
    urls = dead_urls(2)
    done = cli("stats", "--url", ",".join(urls), "--timeout", "0.5")
    assert done.returncode == 1
    assert "cannot reach any of the brokers: " in done.stderr
    assert f"{urls[0]}: connection refused" in done.stderr
    assert f"{urls[1]}: connection refused" in done.stderr
    assert "is one running?" in done.stderr


WORKER_MODULE = """
    from conveyor.sdk import Job, Worker

    worker = Worker({url!r}, queues=[{queue!r}], prefetch=1)


    @worker.handler({queue!r})
    async def handle(job: Job) -> None:
        print("handled", job.payload, flush=True)
"""


@pytest.mark.parametrize("how", ["flag", "env"])
def test_conveyor_worker_takes_its_urls_from_the_command_line(
    broker_process: str, tmp_path: Path, how: str
) -> None:
    queue = f"failover-worker-{uuid.uuid4().hex[:8]}"
    # The module's own URL is dead: the worker can only work through --url / CONVEYOR_URL.
    module = WORKER_MODULE.format(url=dead_url(), queue=queue)
    (tmp_path / "tasks.py").write_text(textwrap.dedent(module))
    urls = f"{dead_url()},{broker_process}"
    # (This checkout's SDK, not whichever one is installed, runs in tmp_path too.)
    base = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    args, env = (["--url", urls], base) if how == "flag" else ([], {**base, "CONVEYOR_URL": urls})
    proc = subprocess.Popen(
        conveyor("worker", "tasks:worker", *args),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    out = Lines(proc.stdout)
    try:
        assert cli("enqueue", queue, "7", "--url", broker_process).returncode == 0
        assert out.next(timeout=15) == "handled 7\n"
    finally:
        code = stop_process(proc)
        out.join()
        proc.stdout.close()
    assert code == 0  # a graceful stop
