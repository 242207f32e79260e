"""``conveyor worker``'s flags and environment variables, against a broker subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest

from conveyor import __version__

from .conftest import ROOT, WAIT, Lines, conveyor
from .test_cli import ok, worker_env

MODULE = """
    from conveyor.sdk import Job, Retry, Worker

    worker = Worker({url!r}, queues=[{queue!r}], prefetch=3)


    @worker.handler({queue!r})
    async def first(job: Job) -> None:
        print("first", job.payload, flush=True)


    @worker.handler({queue!r} + "-b")
    async def second(job: Job) -> None:
        print("second", job.payload, flush=True)
        if job.payload == "again" and job.attempt == 1:
            raise Retry(delay_s=0, error="once more")
"""


def write_module(where: Path, url: str) -> str:
    queue = f"cliw-{uuid.uuid4().hex[:8]}"
    (where / "tasks.py").write_text(textwrap.dedent(MODULE.format(url=url, queue=queue)))
    return queue


def start(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        conveyor("worker", "tasks:worker", *args),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def until(lines: Lines, text: str, timeout: float = 15.0) -> tuple[str, list[str]]:
    """The first line holding ``text``, and the lines before it."""
    before: list[str] = []
    while True:
        line = lines.next(timeout=timeout)
        assert line, f"the stream ended before a line with {text!r}; saw {before}"
        if text in line:
            return line, before
        before.append(line)


def finish(proc: subprocess.Popen[str], *streams: Lines) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for lines in streams:
            lines.join()
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    return code


@pytest.mark.parametrize("by", ["flags", "env"])
def test_queues_and_prefetch_replace_the_workers_own_and_the_connection_is_logged(
    broker_process: str, tmp_path: Path, by: str
) -> None:
    url = broker_process
    queue = write_module(tmp_path, "ws://127.0.0.1:1/ws")  # wrong on purpose: --url wins
    if by == "flags":
        args = ["--url", url, "--queues", f"{queue}-b", "--prefetch", "7", "--log-level", "info"]
        env = worker_env()
    else:
        args = []
        env = worker_env(
            CONVEYOR_URL=url,
            CONVEYOR_QUEUES=f"{queue}-b",
            CONVEYOR_PREFETCH="7",
            CONVEYOR_LOG_LEVEL="INFO",
        )
    proc = start(tmp_path, *args, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        line, _ = until(err, "connected to")
        assert f"connected to {url} (conveyor {__version__}); queues {queue}-b; prefetch 7" in line
        assert "INFO conveyor.worker:" in line
        ok("enqueue", queue, '"not mine"', "--url", url)  # the Worker's own queue: not served
        job_id = ok("enqueue", f"{queue}-b", '"again"', "--url", url)["id"]
        assert out.next(timeout=15) == "second again\n"
        retried, _ = until(err, f"job {job_id} ")
        assert f"job {job_id} {queue}-b retry (attempt 1/3) in " in retried
        assert retried.rstrip().endswith("again in 0.0 ms: once more")
        assert out.next(timeout=15) == "second again\n"
        done, _ = until(err, f"job {job_id} ")
        assert f"INFO conveyor.worker.jobs: job {job_id} {queue}-b ok in " in done
        assert done.rstrip().endswith(" ms")
    finally:
        code = finish(proc, out, err)
    assert code == 0
    stats = ok("stats", "--queue", queue, "--url", url)
    assert stats[queue]["ready"] == 1  # never taken


def test_log_level_warning_hides_the_info_lines(broker_process: str, tmp_path: Path) -> None:
    url = broker_process
    queue = write_module(tmp_path, url)
    proc = start(tmp_path, env=worker_env(CONVEYOR_LOG_LEVEL="warning"))
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        ok("enqueue", queue, "1", "--url", url)
        assert out.next(timeout=15) == "first 1\n"
    finally:
        code = finish(proc, out, err)
    assert code == 0
    rest = []
    while line := err.next():
        rest.append(line)
    assert rest == []  # no connection line, no job line


def run_worker(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        conveyor("worker", "tasks:worker", *args),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=15,
    )


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--queues", "{q},nope,{q}-c"], {}, "--queues: no handler for 'nope', '{q}-c' in"),
        ([], {"CONVEYOR_QUEUES": "nope"}, "--queues: no handler for 'nope' in tasks:worker"),
        (["--queues", "a,,b"], {}, "argument --queues: must be comma-separated queue names"),
        (["--prefetch", "0"], {}, "argument --prefetch: must be an integer >= 1, got '0'"),
        ([], {"CONVEYOR_PREFETCH": "many"}, "CONVEYOR_PREFETCH (for --prefetch): must be an"),
        ([], {"CONVEYOR_LOG_LEVEL": "loud"}, "CONVEYOR_LOG_LEVEL (for --log-level): must be"),
        (["--log-level", "loud"], {}, "argument --log-level: must be one of debug, info,"),
    ],
    ids=["unknown queues", "env queues", "empty name", "prefetch 0", "env prefetch",
         "env level", "flag level"],
)  # fmt: skip
def test_a_bad_flag_or_variable_exits_2_naming_it(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    queue = write_module(tmp_path, "ws://127.0.0.1:1/ws")
    args = [a.replace("{q}", queue) for a in args]
    done = run_worker(tmp_path, *args, env=worker_env(**env))
    assert done.returncode == 2, done.stderr
    assert message.replace("{q}", queue) in done.stderr.strip().splitlines()[-1]  # one line
    assert done.stdout == ""


def test_every_flag_names_its_variable() -> None:
    done = subprocess.run(
        conveyor("worker", "--help"), capture_output=True, text=True, timeout=15, cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0
    for variable in ("CONVEYOR_URL", "CONVEYOR_QUEUES", "CONVEYOR_PREFETCH",
                     "CONVEYOR_LOG_LEVEL", "CONVEYOR_LOOP"):  # fmt: skip
        assert variable in done.stdout
