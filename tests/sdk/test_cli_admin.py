"""The one-shot client commands of ``conveyor`` (``conveyor/sdk/_cli_admin.py``) against a
broker subprocess: what people read, what ``--json`` gives scripts, the exit status and
the errors."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import http.server
import json
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from conveyor.broker.cli import build_parser
from conveyor.sdk import Client, Fail, Job, Worker

from .conftest import ROOT, WAIT, Lines, conveyor, free_port, stop


def env(**extra: str) -> dict[str, str]:
    """This environment without CONVEYOR_* settings, plus ``extra``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    return {**clean, **extra}


def run(*args: str, timeout: float = 15.0, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        conveyor(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env(**variables),
    )


def text(*args: str) -> str:
    """Run a command that must succeed; what it printed for people."""
    done = run(*args)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def as_json(*args: str) -> Any:
    done = run(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def queue_name() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}"


# An epoch float (what the text output must never show): ten digits, a point, digits.
EPOCH = re.compile(r"\b1\d{9}\.\d")


def kill(url: str, queue: str, payloads: list[Any]) -> list[str]:
    """Enqueue ``payloads`` on ``queue`` and have a worker fail each (max_attempts 1):
    their ids, all dead letters once this returns."""

    async def main() -> list[str]:
        async with Client(url, connect_timeout=WAIT) as client:
            ids = [await client.enqueue(queue, p, max_attempts=1) for p in payloads]
        failed: set[str] = set()
        all_failed = asyncio.Event()
        worker = Worker(url, queues=[queue], prefetch=len(payloads))

        @worker.handler(queue)
        async def fail(job: Job) -> None:
            failed.add(job.id)
            if failed >= set(ids):
                all_failed.set()
            raise Fail(f"boom {job.payload}")

        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(all_failed.wait(), WAIT)
        worker.stop()
        await asyncio.wait_for(running, WAIT)  # (its reports sent before it returns)
        return ids

    return asyncio.run(main())


# -- stats ----------------------------------------------------------------------------


def test_stats_prints_a_table_whose_columns_fit(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    for _ in range(12):
        as_json("enqueue", queue, "{}", "--url", url)
    as_json("enqueue", queue, "{}", "--delay", "600", "--url", url)
    lines = text("stats", "--queue", queue, "--url", url).splitlines()
    assert len(lines) == 2
    head, row = lines
    assert head.split() == [
        "QUEUE", "READY", "SCHEDULED", "PROCESSING", "WAITING", "LIMITED", "DEAD", "PAUSED",
        "OLDEST",
        "READY", "ENQUEUED", "COMPLETED",
    ]  # fmt: skip
    # The queue's column is as wide as its name; numbers end under their headings.
    assert head.startswith(f"QUEUE{' ' * (len(queue) - 5)}  READY")
    assert row.startswith(f"{queue}     12          1")
    assert row.split()[7] == "no"
    # Every queue, by name, without --queue.
    every = text("stats", "--url", url).splitlines()
    assert any(line.startswith(f"{queue} ") for line in every)
    assert every[1:] == sorted(every[1:])


def test_limits_sets_shows_and_clears_a_queues_limits(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    unknown = run("limits", queue, "--url", url)
    assert unknown.returncode == 1 and "no queue named" in unknown.stderr
    said = text(
        "limits", queue, "--concurrency", "10", "--rate", "100/min", "--burst", "5",
        "--partition-concurrency", "2", "--url", url,
    )  # fmt: skip
    assert said == (
        f"{queue}: concurrency 10; rate 100 per 60 s, burst 5; per key: concurrency 2\n"
    )
    shown = as_json("limits", queue, "--url", url)
    assert shown["limits"]["rate"] == 100 and shown["limits"]["per_s"] == 60
    # Setting replaces every limit: what is not given is gone.
    as_json("limits", queue, "--partition-rate", "3/1.5s", "--url", url)
    limits = as_json("stats", "--queue", queue, "--url", url)[queue]["limits"]
    assert (limits["concurrency"], limits["partition_rate"], limits["partition_per_s"]) == (
        None,
        3,
        1.5,
    )
    assert text("limits", queue, "--clear", "--url", url) == f"{queue}: no limits\n"


def test_limits_names_a_bad_value(broker_process: str) -> None:
    done = run("limits", queue_name(), "--concurrency", "0", "--url", broker_process)
    assert done.returncode != 0
    assert "concurrency" in done.stderr and "Traceback" not in done.stderr
    done = run("limits", queue_name(), "--rate", "ten/s", "--url", broker_process)
    assert done.returncode == 2 and "N/PERIOD" in done.stderr


def test_enqueue_takes_a_partition(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    job_id = as_json("enqueue", queue, "{}", "--partition", "acme", "--url", url)["id"]
    assert as_json("job", job_id, "--url", url)["partition"] == "acme"


def test_enqueue_after_makes_a_waiting_job_listed_and_counted_dep_1(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    first = as_json("enqueue", queue, "1", "--delay", "600", "--url", url)["id"]
    second = as_json("enqueue", queue, "2", "--url", url)["id"]
    out = text("enqueue", queue, "3", "--after", first, "--after", second, "--url", url)
    assert re.fullmatch(rf"enqueued (\S+) on {queue}, after 2 jobs\n", out), out
    waiting = as_json("jobs", queue, "--state", "waiting", "--url", url)
    (job,) = waiting["jobs"]
    assert job["state"] == "waiting" and job["after"] == [first, second]
    assert job["waiting_for"] == 2 and waiting["total"] == 1
    table = text("jobs", queue, "--state", "waiting", "--url", url)
    assert "WAITING FOR" in table and "2 of 2" in table
    assert as_json("stats", "--queue", queue, "--url", url)[queue]["waiting"] == 1
    refused = run("enqueue", queue, "4", "--after", "no-such-job", "--url", url)
    assert refused.returncode != 0 and "after[0]" in refused.stderr


def test_stats_json_keeps_its_shape(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    as_json("enqueue", queue, "1", "--url", url)
    stats = as_json("stats", "--queue", queue, "--url", url)
    assert list(stats) == [queue]
    assert {"ready", "scheduled", "processing", "dead", "paused", "totals"} <= set(stats[queue])
    assert stats[queue]["ready"] == 1


def test_conveyor_json_set_in_the_environment_prints_json(broker_process: str) -> None:
    done = run("stats", "--url", broker_process, CONVEYOR_JSON="1")
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), dict)


# -- enqueue and job --------------------------------------------------------------------


def test_enqueue_says_what_it_did_and_when_the_job_runs(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    out = text("enqueue", queue, "1", "--delay", "300", "--url", url)
    match = re.fullmatch(rf"enqueued (\S+) on {queue}, to run at (.+) \(in (.+)\)\n", out)
    assert match, out
    assert match[3] in ("5 min", "4 min 59 s")
    assert as_json("job", match[1], "--url", url)["queue"] == queue
    assert text("enqueue", queue, "2", "--url", url).startswith("enqueued ")


def test_enqueue_run_at_takes_an_iso_date_in_local_time(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    job_id = as_json("enqueue", queue, "1", "--run-at", "2999-01-02T03:04:05", "--url", url)["id"]
    expected = datetime.datetime(2999, 1, 2, 3, 4, 5).timestamp()  # local time
    assert as_json("job", job_id, "--url", url)["ready_at"] == pytest.approx(expected)
    with_zone = as_json(
        "enqueue", queue, "1", "--run-at", "2999-01-02T03:04:05+00:00", "--url", url
    )["id"]
    utc = datetime.datetime(2999, 1, 2, 3, 4, 5, tzinfo=datetime.UTC).timestamp()
    assert as_json("job", with_zone, "--url", url)["ready_at"] == pytest.approx(utc)
    epoch = as_json("enqueue", queue, "1", "--run-at", str(utc), "--url", url)["id"]
    assert as_json("job", epoch, "--url", url)["ready_at"] == pytest.approx(utc)
    bad = run("enqueue", queue, "1", "--run-at", "next tuesday", "--url", url)
    assert bad.returncode == 2 and "ISO 8601" in bad.stderr


def test_job_prints_its_fields_one_per_line_with_local_times(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    job_id = as_json(
        "enqueue", queue, '{"to": "a@b.c"}', "--delay", "60", "--priority", "3",
        "--max-attempts", "4", "--key", "k-1", "--url", url,
    )["id"]  # fmt: skip
    out = text("job", job_id, "--url", url)
    assert not EPOCH.search(out), out
    shown = dict(line.split(":", 1) for line in out.splitlines() if re.match(r"^\w[\w ]*:", line))
    shown = {name: value.strip() for name, value in shown.items()}
    assert shown["id"] == job_id and shown["queue"] == queue
    assert shown["priority"] == "3"
    assert shown["attempts"] == "0 of 4"
    assert shown["key"] == "k-1"
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(in (1 min|59 s|58 s)\)", shown["ready at"]
    )
    assert shown["enqueued"].endswith(" ago)") or shown["enqueued"].endswith("(now)")
    assert shown["lease ends"] == "-"
    # The payload as indented JSON, under its label.
    assert '  "to": "a@b.c"' in out


def test_job_of_an_unknown_id_exits_1_saying_so(broker_process: str) -> None:
    done = run("job", "no-such-id", "--url", broker_process)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("conveyor: no-such-id: no such job (")
    scripted = run("job", "no-such-id", "--url", broker_process, "--json")
    assert (scripted.returncode, scripted.stdout) == (1, "null\n")


# -- cancel -----------------------------------------------------------------------------


def test_cancel_says_what_it_cancelled_and_why_nothing_happened(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    job_id = as_json("enqueue", queue, "1", "--url", url)["id"]
    assert text("cancel", job_id, "--url", url) == f"cancelled {job_id}\n"
    again = run("cancel", job_id, "--url", url)
    assert again.returncode == 1
    assert again.stdout == ""
    assert again.stderr == (
        f"conveyor: {job_id}: nothing to cancel: no such job (it was acked, cancelled, "
        "purged or expired, or never enqueued)\n"
    )


def test_cancel_of_several_ids_reports_each(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    first = as_json("enqueue", queue, "1", "--url", url)["id"]
    second = as_json("enqueue", queue, "2", "--url", url)["id"]
    done = run("cancel", first, "gone-id", second, "--url", url)
    assert done.returncode == 1  # one of them was not there
    assert done.stdout == f"cancelled {first}\ncancelled {second}\n"
    assert done.stderr.startswith("conveyor: gone-id: nothing to cancel: no such job")
    third = as_json("enqueue", queue, "3", "--url", url)["id"]
    scripted = run("cancel", third, "gone-id", "--url", url, "--json")
    assert json.loads(scripted.stdout) == {
        "results": [{"id": third, "cancelled": True}, {"id": "gone-id", "cancelled": False}]
    }


# -- pause, resume ----------------------------------------------------------------------


def test_pause_and_resume_a_queue(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    as_json("enqueue", queue, "1", "--url", url)
    assert text("pause", queue, "--url", url) == f"paused {queue}\n"
    assert as_json("stats", "--queue", queue, "--url", url)[queue]["paused"] is True
    assert text("stats", "--queue", queue, "--url", url).splitlines()[1].split()[7] == "yes"
    assert as_json("resume", queue, "--url", url) == {"queue": queue, "paused": False}
    assert as_json("stats", "--queue", queue, "--url", url)[queue]["paused"] is False
    assert as_json("pause", queue, "--url", url) == {"queue": queue, "paused": True}
    assert text("resume", queue, "--url", url) == f"resumed {queue}\n"


# -- dead letters: dead, jobs, redrive, purge -------------------------------------------


def test_dead_lists_the_dead_letters_with_their_errors(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    ids = kill(url, queue, [{"n": 1}, {"n": 2}, {"n": 3}])
    out = text("dead", queue, "--url", url)
    assert not EPOCH.search(out), out
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "PRIORITY", "ATTEMPTS", "DIED", "ERROR", "PAYLOAD"]
    rows = lines[1:4]
    assert sorted(row.split()[0] for row in rows) == sorted(ids)
    assert all(
        "1/1" in row and "boom {" in row and (" ago)" in row or "(now)" in row) for row in rows
    ), rows
    assert lines[-1] == f"3 of 3 dead jobs in {queue}"
    # Pages: --limit and the cursor the page names.
    first = text("dead", queue, "--limit", "2", "--url", url).splitlines()
    assert len(first) == 1 + 2 + 2
    more = re.fullmatch(
        rf"2 of 3 dead jobs in {queue}; the next page: conveyor dead {queue} --cursor (\S+)",
        first[-1],
    )
    assert more, first[-1]
    rest = text("dead", queue, "--limit", "2", "--cursor", more[1], "--url", url).splitlines()
    shown = {line.split()[0] for line in [*first[1:3], *rest[1:-2]]}
    assert shown == set(ids)
    page = as_json("dead", queue, "--url", url)
    assert page["total"] == 3 and page["next"] is None
    assert {job["id"] for job in page["jobs"]} == set(ids)
    assert all(job["state"] == "dead" for job in page["jobs"])


def test_jobs_lists_a_queue_in_one_state_with_search_and_pages(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    ready = [
        as_json("enqueue", queue, json.dumps({"to": f"user{i}"}), "--url", url)["id"]
        for i in range(3)
    ]
    later = as_json("enqueue", queue, '{"to": "later"}', "--delay", "600", "--url", url)["id"]
    out = text("jobs", queue, "--state", "ready", "--url", url)
    lines = out.splitlines()
    assert lines[0].split() == [
        "ID",
        "PRIORITY",
        "ATTEMPTS",
        "READY",
        "SINCE",
        "ENQUEUED",
        "PAYLOAD",
    ]
    assert {line.split()[0] for line in lines[1:4]} == set(ready)
    assert lines[-1] == f"3 of 3 ready jobs in {queue}"
    scheduled = text("jobs", queue, "--state", "scheduled", "--url", url).splitlines()
    assert scheduled[0].split()[3:5] == ["RUNS", "AT"]
    assert scheduled[1].split()[0] == later and "(in 9 min" in scheduled[1]
    found = as_json("jobs", queue, "--state", "ready", "--search", "user1", "--url", url)
    assert [job["id"] for job in found["jobs"]] == [ready[1]]
    page = as_json("jobs", queue, "--state", "ready", "--limit", "2", "--url", url)
    assert len(page["jobs"]) == 2 and page["total"] == 3 and page["next"] is not None
    rest = as_json("jobs", queue, "--state", "ready", "--cursor", page["next"], "--url", url)
    assert {j["id"] for j in [*page["jobs"], *rest["jobs"]]} == set(ready)
    assert text("jobs", queue, "--state", "processing", "--url", url) == (
        f"no processing jobs in {queue}\n"
    )
    bad = run("jobs", queue, "--state", "pending", "--url", url)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_redrive_ids_puts_dead_jobs_back(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    first, second = kill(url, queue, [1, 2])
    assert text("redrive", first, "--url", url) == f"redrove {first}\n"
    assert as_json("job", first, "--url", url)["state"] == "ready"
    # Not dead (any more): nothing happens, and it says so.
    done = run("redrive", first, second, "--url", url)
    assert done.returncode == 1
    assert done.stdout == f"redrove {second}\n"
    assert done.stderr == (
        f"conveyor: {first}: not redriven: no dead job with this id (it is not dead, or gone)\n"
    )


def test_redrive_all_puts_back_every_dead_job_of_a_queue(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    ids = kill(url, queue, [1, 2, 3])
    assert text("redrive", "--all", queue, "--url", url) == f"redrove 3 dead jobs of {queue}\n"
    assert all(as_json("job", i, "--url", url)["state"] == "ready" for i in ids)
    assert as_json("redrive", "--all", queue, "--url", url) == {"queue": queue, "redriven": 0}


def test_redrive_needs_ids_or_all_not_both(broker_process: str) -> None:
    for args in ([], ["some-id", "--all", "q"]):
        done = run("redrive", *args, "--url", broker_process)
        assert done.returncode == 2
        assert "give job IDs or --all QUEUE" in done.stderr


def test_purge_deletes_the_dead_letters(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    ids = kill(url, queue, [1, 2])
    assert text("purge", queue, "--url", url) == f"purged 2 dead jobs of {queue}\n"
    assert run("job", ids[0], "--url", url).returncode == 1
    assert as_json("purge", queue, "--url", url) == {"purged": 0}


# -- errors -----------------------------------------------------------------------------


def test_a_broker_not_running_is_said_at_once_not_after_the_timeout() -> None:
    url = f"ws://127.0.0.1:{free_port()}/ws"
    started = time.monotonic()
    done = run("stats", "--url", url, "--timeout", "30", timeout=60)
    assert time.monotonic() - started < 10  # far under the 30 s it was allowed
    assert done.returncode == 1
    assert done.stderr == (
        f"conveyor: cannot reach the broker at {url}: connection refused; is it running?\n"
    )


def test_a_broker_not_running_is_skipped_for_the_next_url(broker_process: str) -> None:
    dead = f"ws://127.0.0.1:{free_port()}/ws"
    started = time.monotonic()
    # (the order is shuffled: either way the dead one must not cost the timeout)
    done = run("stats", "--url", f"{dead},{broker_process}", "--timeout", "30", timeout=60)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 10


@contextlib.contextmanager
def http_404_server() -> Iterator[str]:
    """A plain HTTP server answering 404 to everything; yields a ws:// URL to it."""

    class NotFound(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # (as a web server answers a WebSocket handshake)

        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"ws://127.0.0.1:{server.server_address[1]}/ws"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT)


def test_an_http_404_is_no_broker_at_the_url_not_unauthorized() -> None:
    with http_404_server() as url:
        done = run("stats", "--url", url, "--timeout", "30", timeout=60)
    assert done.returncode == 1
    assert f"{url}: no Conveyor broker at this URL (HTTP 404" in done.stderr
    assert "unauthorized" not in done.stderr


@pytest.fixture(scope="module")
def secured_broker() -> Iterator[str]:
    """A broker subprocess with tokens: ``reader`` (read), ``pub`` (publish)."""
    proc = subprocess.Popen(
        conveyor(
            "serve",
            "--port",
            "0",
            "--store",
            "memory",
            "--log-level",
            "warning",
            "--read-token",
            "reader",
            "--publish-token",
            "pub",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env=env(),
    )
    assert proc.stdout is not None
    lines = Lines(proc.stdout)
    try:
        line = lines.next(timeout=15)
        assert line.startswith("conveyor listening on ws://"), line
        yield line.split()[3]
    finally:
        stop(proc)
        lines.join()
        proc.stdout.close()


def test_forbidden_names_the_command_and_the_role_it_needs(secured_broker: str) -> None:
    done = run("enqueue", "q", "1", "--url", secured_broker, "--token", "reader")
    assert done.returncode == 1
    assert done.stderr == (
        "conveyor: forbidden: enqueue: this token may not call enqueue; it needs the publish role\n"
    )
    assert "enqueue_each" not in done.stderr
    paused = run("pause", "q", "--url", secured_broker, CONVEYOR_TOKEN="pub")
    assert paused.returncode == 1
    assert "pause: this token may not call pause; it needs the admin role" in paused.stderr


def test_a_wrong_token_is_unauthorized(secured_broker: str) -> None:
    done = run("stats", "--url", secured_broker, "--token", "wrong")
    assert done.returncode == 1
    assert done.stderr.startswith("conveyor: unauthorized: ")
    assert "refused the token (HTTP 401: unknown token)" in done.stderr


def test_a_bad_conveyor_timeout_is_a_bad_argument() -> None:
    done = run("stats", CONVEYOR_TIMEOUT="soon")
    assert done.returncode == 2
    assert "--timeout: invalid float value: 'soon'" in done.stderr


# -- --help -----------------------------------------------------------------------------


def subcommands() -> dict[str, Any]:
    parser = build_parser()
    (commands,) = (a for a in parser._actions if a.dest == "command")
    return dict(commands.choices)  # type: ignore[arg-type]


# Options whose value belongs to one call (a job's priority, a listing's cursor): a
# value left in the environment would apply to every later call, so they have none and
# their help says so.
PER_CALL = "(no variable: it belongs to one call)"


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_option_names_its_environment_variable_in_help(name: str) -> None:
    done = subprocess.run(
        conveyor(name, "--help"), capture_output=True, text=True, timeout=15, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    helps = " ".join(done.stdout.split())  # argparse wraps lines anywhere
    parser = subcommands()[name]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag = max(action.option_strings, key=len)
        described = " ".join((action.help or "").split())
        assert described in helps, (name, flag)  # (the help checked is what --help shows)
        assert re.search(r"\bCONVEYOR_[A-Z_]+\b", described) or PER_CALL in described, (
            f"conveyor {name} {flag}: its help names no CONVEYOR_* variable: {described!r}"
        )


def test_per_call_options_are_only_the_requests_own() -> None:
    per_call = {
        (name, max(action.option_strings, key=len))
        for name, parser in subcommands().items()
        for action in parser._actions
        if PER_CALL in (action.help or "")
    }
    assert per_call == {
        ("enqueue", "--priority"), ("enqueue", "--delay"), ("enqueue", "--run-at"),
        ("enqueue", "--expires"), ("enqueue", "--max-attempts"), ("enqueue", "--key"),
        ("enqueue", "--time-limit"), ("enqueue", "--partition"), ("enqueue", "--after"),
        ("limits", "--concurrency"), ("limits", "--rate"), ("limits", "--burst"),
        ("limits", "--partition-concurrency"), ("limits", "--partition-rate"),
        ("limits", "--partition-burst"), ("limits", "--clear"),
        ("jobs", "--state"), ("jobs", "--search"), ("jobs", "--cursor"),
        ("dead", "--cursor"), ("stats", "--queue"), ("redrive", "--all"),
    }  # fmt: skip


# -- watch ------------------------------------------------------------------------------


def test_watch_prints_each_progress_and_the_end_then_exits_0(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    (job_id,) = asyncio.run(_enqueued(url, queue, {"pages": 2}))
    proc = subprocess.Popen(
        conveyor("watch", job_id, "--url", url),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env=env(),
    )
    assert proc.stdout is not None
    lines = Lines(proc.stdout)

    async def work() -> tuple[str, str]:
        worker = Worker(url, queues=[queue], progress_interval_s=0.01)
        shown = asyncio.Event()

        @worker.handler(queue)
        async def build(job: Job) -> dict[str, int]:
            await job.progress(0.5, "page 1")
            await shown.wait()  # the line is out before the job goes on
            return {"pages": 2}

        running = asyncio.create_task(worker.run())
        try:
            first = await asyncio.to_thread(lines.next)
            shown.set()
            last = await asyncio.to_thread(lines.next)
        finally:
            worker.stop()
            await asyncio.wait_for(running, WAIT)
        return first, last

    try:
        first, last = asyncio.run(work())
        assert first.split() == ["progress", "50%", "page", "1", "(attempt", "1)"]
        assert last.strip() == 'completed {"pages": 2}'
        assert proc.wait(WAIT) == 0
    finally:
        stop(proc)
        lines.join()
        proc.stdout.close()


async def _enqueued(url: str, queue: str, *payloads: Any) -> list[str]:
    async with Client(url, connect_timeout=WAIT) as client:
        return [await client.enqueue(queue, p) for p in payloads]


def test_watch_of_a_dead_or_unknown_job_exits_1(broker_process: str) -> None:
    url, queue = broker_process, queue_name()
    (dead,) = kill(url, queue, [1])
    done = run("watch", dead, "--url", url)
    assert done.returncode == 1
    assert done.stdout.strip() == "dead      boom 1"
    done = run("watch", "no-such-job", "--url", url, "--json")
    assert done.returncode == 1
    (line,) = done.stdout.splitlines()
    assert json.loads(line)["state"] == "unknown"
