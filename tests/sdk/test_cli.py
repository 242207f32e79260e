"""The client commands of ``conveyor`` (``python -m conveyor``) against a broker subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT, WAIT, Lines, conveyor, free_port, stop


def run(*args: str, timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        conveyor(*args), capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def ok(*args: str) -> Any:
    """Run a command that must succeed with ``--json``; return the JSON it printed."""
    done = run(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_enqueue_job_cancel_and_stats(broker_process: str) -> None:
    url = broker_process
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    enqueued = ok(
        "enqueue", queue, '{"to": "a@b.c"}', "--priority", "3", "--delay", "60",
        "--max-attempts", "2", "--key", "k1", "--url", url,
    )  # fmt: skip
    job_id = enqueued["id"]

    job = ok("job", job_id, "--url", url)
    assert job["id"] == job_id and job["queue"] == queue
    assert job["payload"] == {"to": "a@b.c"}
    assert (job["priority"], job["max_attempts"], job["key"]) == (3, 2, "k1")
    assert job["ready_at"] == pytest.approx(job["enqueued_at"] + 60.0)

    stats = ok("stats", "--queue", queue, "--url", url)
    assert list(stats) == [queue]
    assert stats[queue]["scheduled"] == 1 and stats[queue]["totals"]["enqueued"] == 1
    assert queue in ok("stats", "--url", url)

    assert ok("cancel", job_id, "--url", url) == {"cancelled": True}
    again = run("cancel", job_id, "--url", url, "--json")  # nothing to cancel: exit 1
    assert (again.returncode, json.loads(again.stdout)) == (1, {"cancelled": False})
    gone = run("job", job_id, "--url", url, "--json")
    assert (gone.returncode, json.loads(gone.stdout)) == (1, None)


def test_an_unreachable_broker_exits_1_with_a_message() -> None:
    done = run("stats", "--url", f"ws://127.0.0.1:{free_port()}", "--timeout", "0.5")
    assert done.returncode == 1
    assert "cannot reach the broker" in done.stderr and "is it running?" in done.stderr
    assert done.stdout == ""


def test_a_bad_json_payload_exits_2_with_a_message(broker_process: str) -> None:
    done = run("enqueue", "q", "{to: nowhere", "--url", broker_process)
    assert done.returncode == 2
    assert "not valid JSON" in done.stderr
    assert done.stdout == ""


def test_a_refused_request_exits_1_naming_the_error(broker_process: str) -> None:
    done = run("enqueue", "bad queue name", "{}", "--url", broker_process)
    assert done.returncode == 1
    assert "invalid_argument" in done.stderr


WORKER_MODULE = """
    from conveyor.sdk import Job, Worker

    worker = Worker({url!r}, queues=[{queue!r}], prefetch=1)


    @worker.handler({queue!r})
    async def handle(job: Job) -> None:
        print("handled", job.payload, flush=True)
"""


@contextlib.contextmanager
def worker_process(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], Lines]]:
    """``conveyor worker tasks:worker ARGS`` run in ``cwd``; yields it and its stdout's
    lines. Stopped (SIGTERM, then SIGKILL) and its streams closed at the end."""
    proc = subprocess.Popen(
        conveyor("worker", "tasks:worker", *args),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        yield proc, out
    finally:
        stop(proc)
        out.join()
        err.join()
        proc.stdout.close()
        proc.stderr.close()


def test_worker_runs_a_worker_object_until_sigterm(broker_process: str, tmp_path: Path) -> None:
    url = broker_process
    queue = f"cli-work-{uuid.uuid4().hex[:8]}"
    (tmp_path / "tasks.py").write_text(textwrap.dedent(WORKER_MODULE.format(url=url, queue=queue)))
    with worker_process(tmp_path) as (proc, out):
        first = ok("enqueue", queue, "1", "--url", url)["id"]
        second = ok("enqueue", queue, "2", "--url", url)["id"]
        assert out.next(timeout=15) == "handled 1\n"
        assert out.next() == "handled 2\n"
        # prefetch=1: the second job came only once the first was acked.
        assert run("job", first, "--url", url).returncode == 1  # gone

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 0
        # Graceful: the job it had just handled was reported before it exited.
        assert run("job", second, "--url", url).returncode == 1  # gone


def test_worker_with_a_bad_target_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty.py").write_text("nothing = None\n")
    done = subprocess.run(
        conveyor("worker", "empty:nothing"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert done.returncode != 0
    assert "is not a sdk.Worker" in done.stderr


LOOP_WORKER_MODULE = """
    import asyncio

    from conveyor.sdk import Job, Worker

    worker = Worker({url!r}, queues=[{queue!r}, {queue!r} + "-sync"], prefetch=1)


    @worker.handler({queue!r})
    async def handle(job: Job) -> None:
        loop = type(asyncio.get_running_loop())
        print("loop", loop.__module__.partition(".")[0], flush=True)


    @worker.handler({queue!r} + "-sync")
    def handle_in_a_thread(job: Job) -> None:  # a plain def: the worker runs it in a thread
        print("sync", job.payload, flush=True)
"""


def hide_uvloop(where: Path) -> str:
    """A directory whose ``uvloop`` fails to import, as on a machine without it; put it
    first on PYTHONPATH."""
    (where / "uvloop").mkdir()
    (where / "uvloop" / "__init__.py").write_text("raise ImportError('no uvloop here')\n")
    return str(where)


def worker_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env.update(extra)
    return env


@pytest.mark.parametrize(
    ("args", "env", "hidden", "expected"),
    [
        ([], {}, False, "uvloop"),  # auto: uvloop, a dependency (not on Windows)
        (["--loop", "asyncio"], {}, False, "asyncio"),
        ([], {"CONVEYOR_LOOP": "asyncio"}, False, "asyncio"),
        (["--loop", "uvloop"], {"CONVEYOR_LOOP": "asyncio"}, False, "uvloop"),  # flag wins
        ([], {}, True, "asyncio"),  # auto without uvloop: asyncio's loop, no complaint
    ],
    ids=["auto", "flag asyncio", "env asyncio", "flag over env", "auto, no uvloop"],
)
def test_worker_runs_on_the_event_loop_asked_for(
    broker_process: str,
    tmp_path: Path,
    args: list[str],
    env: dict[str, str],
    hidden: bool,
    expected: str,
) -> None:
    url = broker_process
    queue = f"cli-loop-{uuid.uuid4().hex[:8]}"
    (tmp_path / "tasks.py").write_text(
        textwrap.dedent(LOOP_WORKER_MODULE.format(url=url, queue=queue))
    )
    if hidden:
        env = {**env, "PYTHONPATH": hide_uvloop(tmp_path)}
    with worker_process(tmp_path, *args, env=worker_env(**env)) as (proc, out):
        ok("enqueue", queue, "1", "--url", url)
        assert out.next(timeout=15) == f"loop {expected}\n"
        ok("enqueue", f"{queue}-sync", "2", "--url", url)  # a sync handler, on that loop
        assert out.next(timeout=15) == "sync 2\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 0  # graceful on either loop


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--loop", "uvloop"], {}, "--loop uvloop: uvloop is not installed (pip install uvloop)"),
        (
            [],
            {"CONVEYOR_LOOP": "uvloop"},
            "--loop uvloop: uvloop is not installed (pip install uvloop)",
        ),
        ([], {"CONVEYOR_LOOP": "trio"}, "loop: must be auto, uvloop or asyncio, got 'trio'"),
    ],
    ids=["flag", "env", "unknown"],
)
def test_worker_on_a_loop_it_cannot_have_exits_2_saying_why(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    (tmp_path / "tasks.py").write_text("raise SystemExit('the target must not be loaded')\n")
    done = subprocess.run(
        conveyor("worker", "tasks:worker", *args),
        cwd=tmp_path,
        env=worker_env(PYTHONPATH=hide_uvloop(tmp_path), **env),
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert done.returncode == 2
    assert done.stderr == f"conveyor: {message}\n"
    assert done.stdout == ""
