"""``conveyor serve`` as a real process: its two lines, /healthz, signals, settings.

The broker runs as ``python -m conveyor serve`` in a subprocess; the tests wait on its
output and on frames, each wait bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from .conftest import RawClient

ROOT = Path(__file__).resolve().parents[2]
START = 10.0  # seconds the process may take to start listening
STOP = 5.0  # seconds it may take to stop after a signal
LISTENING = re.compile(
    rb"conveyor listening on ws://([0-9.]+):(\d+)/ws \(store: (?:memory|sqlite [^)]+)\)\n"
)
WARNING = "NO TOKENS"


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without any CONVEYOR_* setting, plus ``extra``.

    The store is memory unless ``extra`` says otherwise: these tests are about the
    process, and must not leave a database file in the working tree.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["CONVEYOR_STORE"] = "memory"
    env.update(extra)
    return env


async def start(*args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "conveyor",
        "serve",
        *args,
        cwd=ROOT,
        env=env if env is not None else environment(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


@dataclass
class Served:
    proc: asyncio.subprocess.Process
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    async def stop(self, sig: int = signal.SIGTERM) -> tuple[int, bytes, bytes]:
        """Signal the broker; its exit status and the rest of its stdout and stderr."""
        self.proc.send_signal(sig)
        out, err = await asyncio.wait_for(self.proc.communicate(), STOP)
        assert self.proc.returncode is not None
        return self.proc.returncode, out, err


@contextlib.asynccontextmanager
async def serving(*args: str, env: dict[str, str] | None = None) -> AsyncIterator[Served]:
    """``conveyor serve --port 0 ARGS``, once it has printed its listening line."""
    proc = await start("--port", "0", *args, env=env)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), START)
        match = LISTENING.fullmatch(line)
        assert match, line
        # The dashboard's address, next to the listening line.
        dashboard = await asyncio.wait_for(proc.stdout.readline(), START)
        assert dashboard == f"dashboard: http://{match[1].decode()}:{match[2].decode()}/\n".encode()
        yield Served(proc, match[1].decode(), int(match[2]))
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()


async def http_get(url: str) -> tuple[int, str, bytes]:
    def get() -> tuple[int, str, bytes]:
        with urllib.request.urlopen(url, timeout=STOP) as response:
            return response.status, response.headers["Content-Type"], response.read()

    return await asyncio.to_thread(get)


async def test_serve_prints_its_url_and_the_dashboards_and_answers_healthz() -> None:
    async with serving() as served:
        assert served.host == "127.0.0.1"
        status, content_type, body = await http_get(f"http://127.0.0.1:{served.port}/")
        assert (status, content_type.split(";")[0]) == (200, "text/html")
        assert b"<html" in body.lower()
        status, content_type, body = await http_get(f"http://127.0.0.1:{served.port}/healthz")
        assert status == 200
        assert content_type == "application/json"
        assert json.loads(body)["status"] == "ok"
        code, out, err = await served.stop()
    assert code == 0
    assert out == b""  # the two lines were the only ones
    assert WARNING not in err.decode()  # loopback without tokens is fine


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_closes_clients_with_1001_and_exits_0(sig: int) -> None:
    async with serving("--publish-token", "tok-1") as served:
        conn = RawClient(await connect(served.url))
        await conn.call("hello", token="tok-1")
        await conn.call("enqueue", queue="q", payload=1)
        # A connection the broker closed itself (a wrong token) must not hold up the exit.
        refused = RawClient(await connect(served.url))
        await refused.request("hello", token="wrong")
        assert await refused.closed() == 1008

        loop = asyncio.get_running_loop()
        started = loop.time()
        served.proc.send_signal(sig)
        assert await conn.closed(timeout=STOP) == 1001
        out, _ = await asyncio.wait_for(served.proc.communicate(), STOP)
        assert served.proc.returncode == 0
        assert out == b""
        assert loop.time() - started < STOP


@pytest.mark.parametrize(
    ("args", "env", "toml", "named"),
    [
        ([], {"CONVEYOR_PORT": "abc"}, None, ["CONVEYOR_PORT", "abc"]),
        (["--port", "70000"], {}, None, ["port", "70000"]),
        (["--tls-cert", "cert.pem"], {}, None, ["tls"]),
        ([], {}, "[queues.emails]\nvisibility_timeout = 60\n", ["emails", "visibility_timeout"]),
        ([], {}, "[queues.emails]\nmax_attempts = 0\n", ["emails", "max_attempts"]),
        ([], {}, "[queues.emails\n", ["not valid TOML"]),
        ([], {}, "[queues.api]\nconcurrency = 0\n", ["api", "concurrency"]),
        ([], {}, "[queues.api]\nburst = 5\n", ["api", "burst", "rate"]),
        ([], {}, '[queues.api]\nrate = "100/min"\n', ["api", "rate"]),
        ([], {"CONVEYOR_LOOP": "trio"}, None, ["loop: must be auto, uvloop or asyncio", "trio"]),
    ],
    ids=[
        "env port",
        "port range",
        "tls half",
        "unknown option",
        "option range",
        "bad toml",
        "limit range",
        "burst without rate",
        "limit type",
        "env loop",
    ],
)
async def test_a_bad_setting_exits_2_naming_it(
    tmp_path: Path, args: list[str], env: dict[str, str], toml: str | None, named: list[str]
) -> None:
    if toml is not None:
        path = tmp_path / "queues.toml"
        path.write_text(toml)
        args = [*args, "--queues", str(path)]
        named = [*named, str(path)]
    proc = await start(*args, env=environment(**env))
    out, err = await asyncio.wait_for(proc.communicate(), START)
    assert proc.returncode == 2
    assert out == b""
    message = err.decode()
    assert message.startswith("conveyor: "), message
    for word in named:
        assert word in message, (word, message)


@pytest.mark.parametrize(("tokens", "warned"), [([], True), (["--admin-token", "t"], False)])
async def test_binding_a_public_address_without_tokens_warns(
    tokens: list[str], warned: bool
) -> None:
    # Bound to every interface only for as long as it takes to see the warning.
    async with serving("--host", "0.0.0.0", *tokens) as served:
        assert served.host == "0.0.0.0"
        code, _, err = await served.stop()
    assert code == 0
    warnings = [line for line in err.decode().splitlines() if WARNING in line]
    if warned:
        assert len(warnings) == 1, err
        assert "WARNING" in warnings[0]
        assert "0.0.0.0" in warnings[0]
        assert "--admin-token" in warnings[0]  # it says what to do
    else:
        assert warnings == []


@pytest.mark.parametrize("how", ["flag", "env"])
async def test_per_queue_options_from_a_toml_file_take_effect(tmp_path: Path, how: str) -> None:
    path = tmp_path / "queues.toml"
    path.write_text("[queues.emails]\nvisibility_timeout_s = 42.5\nmax_attempts = 7\n")
    if how == "flag":
        context = serving("--queues", str(path))
    else:
        context = serving(env=environment(CONVEYOR_QUEUES=str(path)))
    async with context as served:
        conn = RawClient(await connect(served.url))
        emails = (await conn.call("enqueue", queue="emails", payload=1))["id"]
        other = (await conn.call("enqueue", queue="other", payload=2))["id"]
        job = (await conn.call("get_job", id=emails))["job"]
        assert (job["visibility_timeout_s"], job["max_attempts"]) == (42.5, 7)
        job = (await conn.call("get_job", id=other))["job"]
        assert (job["visibility_timeout_s"], job["max_attempts"]) == (300.0, 3)
        # A per-job option still wins over the queue's.
        mine = await conn.call("enqueue", queue="emails", payload=3, visibility_timeout_s=5)
        job = (await conn.call("get_job", id=mine["id"]))["job"]
        assert job["visibility_timeout_s"] == 5
        # The worker is told the lease length it must heartbeat within.
        worker = RawClient(await connect(served.url))
        await worker.call("subscribe", worker_id="w", queues=["emails"], prefetch=1)
        [pushed] = await worker.jobs(1)
        assert (pushed["id"], pushed["visibility_timeout_s"]) == (emails, 42.5)
        code, _, _ = await served.stop()
    assert code == 0


async def test_limits_from_the_toml_file_hold_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "queues.toml"
    path.write_text(
        "[queues.api]\nmax_attempts = 4\nconcurrency = 1\nrate = 100\nper_s = 60\n"
        "partition_concurrency = 1\n"
    )
    async with serving("--queues", str(path)) as served:
        conn = RawClient(await connect(served.url))
        stats = (await conn.call("stats", queue="api"))["queues"]["api"]
        assert stats["limits"]["concurrency"] == 1
        assert (stats["limits"]["rate"], stats["limits"]["per_s"]) == (100, 60)
        for i in range(2):
            await conn.call("enqueue", queue="api", payload=i)
        worker = RawClient(await connect(served.url))
        await worker.call("subscribe", worker_id="w", queues=["api"], prefetch=5)
        [pushed] = await worker.jobs(1)  # one slot: the other job waits on it
        assert pushed["max_attempts"] == 4
        stats = (await conn.call("stats", queue="api"))["queues"]["api"]
        assert (stats["processing"], stats["ready"], stats["limited"]) == (1, 1, 1)
        code, _, _ = await served.stop()
    assert code == 0


async def test_loop_uvloop_without_uvloop_exits_2_and_auto_serves_on_asyncio(
    tmp_path: Path,
) -> None:
    # A uvloop that fails to import, as on a machine without it.
    (tmp_path / "uvloop").mkdir()
    (tmp_path / "uvloop" / "__init__.py").write_text("raise ImportError('no uvloop here')\n")
    hidden = environment(PYTHONPATH=str(tmp_path))
    proc = await start("--loop", "uvloop", env=hidden)
    out, err = await asyncio.wait_for(proc.communicate(), START)
    assert proc.returncode == 2
    assert out == b""
    assert err == b"conveyor: --loop uvloop: uvloop is not installed (pip install uvloop)\n"
    async with serving(env=hidden) as served:  # auto falls back without a word
        code, out, err = await served.stop()
    assert (code, out) == (0, b"")
    assert b"uvloop" not in err


# Frames that once stopped a durable broker, or fooled its decoder, as sent on the wire.
HOSTILE = [
    '{"rid":1,"op":"enqueue","queue":"q","payload":1,"max_attempts":9223372036854775808}',
    '{"rid":1,"op":"enqueue","queue":"q","payload":1,"max_attempts":2147483648}',
    '{"rid":1e400,"rid":1,"op":"enqueue","queue":"q","payload":1,"key":"\\ud800"}',
    '{"rid":1,"op":"enqueue","queue":"q","payload":1,"key":"\\ud800"}',
    '{"rid":' + "9" * 400 + ',"op":"ping"}',
    '{"rid":1,"op":"enqueue","queue":"q","payload":1,"max_attempts":1' + "0" * 400 + "}",
    '{"rid":1,"op":"subscribe","worker_id":"\\ud800","queues":["q"]}',
    '{"rid":1,"op":"enqueue","queue":"q","payload":"\\udfff"}',
]


async def test_no_frame_stops_a_durable_broker(tmp_path: Path) -> None:
    env = environment(CONVEYOR_STORE="sqlite", CONVEYOR_DB=str(tmp_path / "conveyor.db"))
    async with serving(env=env) as served:
        conn = RawClient(await connect(served.url))
        for frame in HOSTILE:
            await conn.send(frame)
            reply = await conn.recv()
            assert reply["ok"] is False, frame
            assert reply["error"]["code"] in {"bad_json", "invalid_argument"}, reply
            assert (await conn.request("ping"))["ok"] is True  # between, so none is "in a row"
        job_id = (await conn.call("enqueue", queue="q", payload="after"))["id"]
        code, _out, err = await served.stop()
    assert code == 0
    assert b"Traceback" not in err and b"CRITICAL" not in err, err.decode()
    # What was answered is there after a restart; nothing hostile was stored.
    async with serving(env=env) as served:
        conn = RawClient(await connect(served.url))
        assert (await conn.call("get_job", id=job_id))["job"]["payload"] == "after"
        assert (await conn.call("stats", queue="q"))["queues"]["q"]["ready"] == 1
        await served.stop()
