"""``conveyor schedule ...`` and the queues file's ``[schedules.ID]`` tables, against
broker subprocesses: what people read, what ``--json`` gives scripts, the exit statuses,
``--every``'s intervals, and a file's schedules at start and across a restart."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.sdk._cli_admin import every

from .conftest import ROOT, Lines, conveyor, stop
from .test_cli_admin import EPOCH, PER_CALL, env, run, subcommands

# -- --every ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("5min", 300.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1.5s", 1.5),
        ("90", 90.0),
        (" 10S ", 10.0),
    ],
)
def test_every_reads_an_interval(text: str, seconds: float) -> None:
    assert every(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "m", "0s", "-5m", "five", "inf", "nan"])
def test_every_refuses_what_is_no_interval(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        every(text)


def test_a_bad_every_is_a_bad_argument() -> None:
    done = run("schedule", "set", "s", "q", "--every", "5 parsecs")
    assert done.returncode == 2 and "--every" in done.stderr


def test_set_needs_cron_or_every_not_both() -> None:
    for extra in ([], ["--cron", "* * * * *", "--every", "5m"]):
        done = run("schedule", "set", "s", "q", *extra)
        assert done.returncode == 2, done
        assert "give --cron EXPR or --every INTERVAL" in done.stderr


def test_a_payload_that_is_not_json_is_a_bad_argument() -> None:
    done = run("schedule", "set", "s", "q", "{nope", "--every", "5m")
    assert done.returncode == 2 and "not valid JSON" in done.stderr


# -- --help -----------------------------------------------------------------------------


def schedule_actions() -> dict[str, Any]:
    (actions,) = (a for a in subcommands()["schedule"]._actions if a.dest == "schedule_command")
    return dict(actions.choices)


@pytest.mark.parametrize("name", sorted(schedule_actions()))
def test_every_schedule_option_names_its_variable_or_has_none(name: str) -> None:
    done = subprocess.run(
        conveyor("schedule", name, "--help"), capture_output=True, text=True, timeout=15, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    helps = " ".join(done.stdout.split())
    for action in schedule_actions()[name]._actions:
        if not action.option_strings or action.dest == "help":
            continue
        described = " ".join((action.help or "").split())
        assert described in helps
        assert re.search(r"\bCONVEYOR_[A-Z_]+\b", described) or PER_CALL in described, (
            name,
            action.option_strings,
        )


# -- a broker with a queues file --------------------------------------------------------


def start(db: Path, queues: Path) -> tuple[subprocess.Popen[str], Lines, str]:
    proc = subprocess.Popen(
        conveyor(
            "serve",
            "--port",
            "0",
            "--db",
            str(db),
            "--queues",
            str(queues),
            "--log-level",
            "warning",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env=env(),
    )
    assert proc.stdout is not None
    lines = Lines(proc.stdout)
    line = lines.next(timeout=15)
    assert line.startswith("conveyor listening on ws://"), line
    return proc, lines, line.split()[3]


def finish(proc: subprocess.Popen[str], lines: Lines) -> None:
    stop(proc)
    lines.join()
    assert proc.stdout is not None
    proc.stdout.close()


QUEUES = """
[queues.reports]
max_attempts = 3

[schedules.nightly]
queue = "reports"
cron = "30 2 * * *"
tz = "Europe/Paris"
payload = { kind = "daily" }
missed = "skip"

[schedules.tick]
queue = "ticks"
every_s = 1
"""


@pytest.fixture(scope="module")
def file_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    where = tmp_path_factory.mktemp("schedules")
    queues = where / "queues.toml"
    queues.write_text(QUEUES)
    proc, lines, url = start(where / "conveyor.db", queues)
    try:
        yield url
    finally:
        finish(proc, lines)


def as_json(*args: str) -> Any:
    done = run(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_files_schedules_are_there_at_start(file_broker: str) -> None:
    found = {s["id"]: s for s in as_json("schedule", "list", "--url", file_broker)}
    assert set(found) >= {"nightly", "tick"}
    nightly = found["nightly"]
    assert (nightly["cron"], nightly["tz"], nightly["missed"]) == (
        "30 2 * * *",
        "Europe/Paris",
        "skip",
    )
    assert nightly["payload"] == {"kind": "daily"} and nightly["next_at"] > time.time()
    assert found["tick"]["every_s"] == 1


def test_list_shows_a_table_for_people(file_broker: str) -> None:
    done = run("schedule", "list", "--url", file_broker)
    assert done.returncode == 0 and done.stderr == ""
    head, *rows = done.stdout.splitlines()
    assert head.split()[:4] == ["ID", "QUEUE", "TIMING", "STATE"]
    nightly = next(row for row in rows if row.startswith("nightly"))
    assert "cron 30 2 * * * (Europe/Paris)" in nightly and "active" in nightly
    assert "(in " in nightly  # the next fire: a local time and how far it is
    assert not EPOCH.search(done.stdout)


def test_set_show_pause_resume_run_delete(file_broker: str) -> None:
    # Ticks of --every count from the epoch unless --start says otherwise: a start an
    # hour away keeps the broker's own firing out of the count of the runs below.
    url = ("--url", file_broker)
    every = ("--every", "5m", "--start", str(int(time.time()) + 3600))
    done = run("schedule", "set", "cleanup", "maint", '{"older_than": "7d"}', *every, *url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("set schedule cleanup: every 5 min on maint; next ")
    made = as_json("schedule", "set", "cleanup", "maint", *every, "--priority", "3", *url)
    assert made["every_s"] == 300 and made["priority"] == 3 and made["payload"] is None

    shown = run("schedule", "show", "cleanup", *url)
    assert shown.returncode == 0
    assert re.search(r"^timing: +every 5 min$", shown.stdout, re.M), shown.stdout
    assert re.search(r"^state: +active$", shown.stdout, re.M)
    assert not EPOCH.search(shown.stdout)

    paused = run("schedule", "pause", "cleanup", *url)
    assert (paused.returncode, paused.stdout) == (0, "paused schedule cleanup\n")
    assert as_json("schedule", "show", "cleanup", *url)["paused"] is True
    resumed = run("schedule", "resume", "cleanup", *url)
    assert resumed.returncode == 0 and resumed.stdout.startswith("resumed schedule cleanup; next ")

    ran = as_json("schedule", "run", "cleanup", *url)
    job = as_json("job", ran["id"], *url)
    assert job["queue"] == "maint" and job["priority"] == 3
    text = run("schedule", "run", "cleanup", *url)
    assert re.fullmatch(r"enqueued \S+ from schedule cleanup\n", text.stdout)
    assert as_json("schedule", "show", "cleanup", *url)["fired"] == 2

    deleted = run("schedule", "delete", "cleanup", *url)
    assert (deleted.returncode, deleted.stdout) == (
        0,
        "deleted schedule cleanup (the jobs it made stay)\n",
    )
    assert as_json("job", ran["id"], *url)["id"] == ran["id"]


@pytest.mark.parametrize("action", ["show", "delete", "pause", "resume", "run"])
def test_an_unknown_schedule_exits_1_saying_so(file_broker: str, action: str) -> None:
    done = run("schedule", action, "nobody", "--url", file_broker)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == "conveyor: nobody: no such schedule\n"


def test_a_refused_schedule_exits_1_naming_the_field(file_broker: str) -> None:
    done = run("schedule", "set", "s", "q", "--cron", "* * *", "--url", file_broker)
    assert done.returncode == 1
    assert done.stderr.startswith("conveyor: invalid_argument: schedule.cron: ")
    zone = run("schedule", "set", "s", "q", "--every", "5m", "--tz", "Nowhere/Atlantis",
               "--url", file_broker)  # fmt: skip
    assert zone.returncode == 1 and "schedule.tz: " in zone.stderr


def test_a_bad_schedule_in_the_file_stops_the_start_naming_it(tmp_path: Path) -> None:
    queues = tmp_path / "queues.toml"
    queues.write_text('[schedules.nightly]\nqueue = "reports"\ncron = "30 25 * * *"\n')
    done = subprocess.run(
        conveyor("serve", "--port", "0", "--db", str(tmp_path / "c.db"), "--queues", str(queues)),
        capture_output=True,
        text=True,
        timeout=15,
        cwd=ROOT,
        env=env(),
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"conveyor: {queues}: [schedules.nightly] cron: "), line
    for table, field in (
        ('queue = "r"\nevery_s = "5m"', "every_s"),
        ('queue = "r"\nevery_s = 5\ntz = "Mars/Olympus"', "tz"),
        ('queue = "r"\nevery_s = 5\nmissed = "all"', "missed"),
        ('queue = "r"\nevery_s = 5\npriority = 99999999999', "priority"),
        ('queue = "r"\nevery_s = 5\nsoon = true', "soon"),
        ('every_s = 5', "queue"),
    ):  # fmt: skip
        queues.write_text(f"[schedules.s1]\n{table}\n")
        done = subprocess.run(
            conveyor("serve", "--port", "0", "--queues", str(queues)),
            capture_output=True,
            text=True,
            timeout=15,
            cwd=ROOT,
            env=env(),
        )
        assert done.returncode == 2, (table, done)
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"conveyor: {queues}: [schedules.s1] {field}"), line


def test_a_restart_with_the_same_file_keeps_the_schedules_progress(tmp_path: Path) -> None:
    queues = tmp_path / "queues.toml"
    queues.write_text('[schedules.tick]\nqueue = "ticks"\nevery_s = 1\nmissed = "each"\n')
    db = tmp_path / "conveyor.db"
    proc, lines, url = start(db, queues)
    try:
        deadline = time.monotonic() + 10
        while True:  # until it has fired twice: the broker's own ticks, on its clock
            (first,) = as_json("schedule", "list", "--url", url)
            if first["fired"] >= 2 or time.monotonic() > deadline:
                break
        assert first["fired"] >= 2
    finally:
        finish(proc, lines)
    proc, lines, url = start(db, queues)
    try:
        (again,) = as_json("schedule", "list", "--url", url)
    finally:
        finish(proc, lines)
    assert again["created_at"] == first["created_at"]
    assert again["fired"] >= first["fired"]
    assert again["last_at"] is not None and again["last_at"] >= first["last_at"]
