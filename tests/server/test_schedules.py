"""Schedules through the real server (docs/protocol.md, "Schedules"): every bad member of
``set_schedule`` answered naming it with its code, who may change and list schedules,
and ticks that make exactly their jobs, on the broker's clock moved by the test (a
``SteppedScheduler``): time passes when a test advances it, never by waiting."""

from __future__ import annotations

import datetime
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conveyor.broker.config import (
    Config,
    ConfigError,
    load_queues,
    load_schedules,
    schedules_pausing,
)
from conveyor.broker.engine import ScheduleSpec
from conveyor.broker.scheduler import SteppedScheduler
from conveyor.broker.server import running_broker
from conveyor.sdk._wire import Role

from .conftest import BASE, BOTH_STORES, ClientFactory, RawClient, with_config

# A round minute, so that ticks of "every 10 s" fall on whole tens from here.
T0 = 1_800_000_000.0


@pytest.fixture
def scheduler() -> SteppedScheduler:
    """The broker's clock, moved by the tests."""
    return SteppedScheduler(start=T0)


def schedule(**members: Any) -> dict[str, Any]:
    return {"id": "s1", "queue": "q", "every_s": 10, **members}


def without(name: str) -> dict[str, Any]:
    found = schedule()
    del found[name]
    return found


# (the schedule object sent, code, the field named)
BAD_SCHEDULES: dict[str, tuple[Any, str, str]] = {
    "not an object": ("every minute", "invalid_argument", "schedule"),
    "no id": (without("id"), "invalid_argument", "schedule.id"),
    "no queue": (without("queue"), "invalid_argument", "schedule.queue"),
    "an unknown member": (schedule(every="5m"), "invalid_argument", "schedule.every"),
    "id not a string": (schedule(id=5), "invalid_argument", "schedule.id"),
    "id with a space": (schedule(id="a b"), "invalid_argument", "schedule.id"),
    "id too long": (schedule(id="s" * 129), "invalid_argument", "schedule.id"),
    "bad queue name": (schedule(queue="a/b"), "invalid_argument", "schedule.queue"),
    "neither cron nor every_s": (without("every_s"), "invalid_argument", "schedule.cron"),
    "both cron and every_s": (schedule(cron="* * * * *"), "invalid_argument", "schedule.every_s"),
    "cron not a string": (
        {**without("every_s"), "cron": 5},
        "invalid_argument",
        "schedule.cron",
    ),
    "cron of four fields": (
        {**without("every_s"), "cron": "* * * *"},
        "invalid_argument",
        "schedule.cron",
    ),
    "cron out of range": (
        {**without("every_s"), "cron": "61 * * * *"},
        "invalid_argument",
        "schedule.cron",
    ),
    "every_s a string": (schedule(every_s="5m"), "invalid_argument", "schedule.every_s"),
    "every_s zero": (schedule(every_s=0), "invalid_argument", "schedule.every_s"),
    "every_s negative": (schedule(every_s=-5), "invalid_argument", "schedule.every_s"),
    "an unknown zone": (schedule(tz="Mars/Olympus"), "invalid_argument", "schedule.tz"),
    "tz not a string": (schedule(tz=1), "invalid_argument", "schedule.tz"),
    "start_at a string": (schedule(start_at="now"), "invalid_argument", "schedule.start_at"),
    "end_at before start_at": (
        schedule(start_at=T0 + 100, end_at=T0),
        "invalid_argument",
        "schedule.end_at",
    ),
    "an unknown policy": (schedule(missed="all"), "invalid_argument", "schedule.missed"),
    "max_catch_up zero": (schedule(max_catch_up=0), "invalid_argument", "schedule.max_catch_up"),
    "max_catch_up a number": (
        schedule(max_catch_up=1.5),
        "invalid_argument",
        "schedule.max_catch_up",
    ),
    "paused not a boolean": (schedule(paused="yes"), "invalid_argument", "schedule.paused"),
    "priority out of range": (
        schedule(priority=2**40),
        "invalid_argument",
        "schedule.priority",
    ),
    "max_attempts zero": (schedule(max_attempts=0), "invalid_argument", "schedule.max_attempts"),
    "a payload too large": (
        schedule(payload="x" * 2000),
        "too_large",
        "schedule.payload",
    ),
}


@with_config(max_payload_bytes=1024)
@pytest.mark.parametrize(
    ("sent", "code", "field"), list(BAD_SCHEDULES.values()), ids=list(BAD_SCHEDULES)
)
async def test_each_bad_member_of_a_schedule_is_named_with_its_code(
    client: ClientFactory, sent: Any, code: str, field: str, no_errors_logged: None
) -> None:
    conn = await client()
    reply = await conn.request("set_schedule", schedule=sent)
    assert reply["ok"] is False, reply
    error = reply["error"]
    assert (error["code"], error["field"]) == (code, field), error
    assert error["message"].startswith(f"{field}: "), error
    assert "Traceback" not in error["message"]
    # Nothing was made, and the connection goes on.
    assert (await conn.call("list_schedules"))["schedules"] == []


@pytest.mark.parametrize(
    ("op", "fields", "field"),
    [
        ("list_schedules", {"limit": 0}, "limit"),
        ("list_schedules", {"limit": 1001}, "limit"),
        ("list_schedules", {"ids": []}, "ids"),
        ("list_schedules", {"after": 3}, "after"),
        ("delete_schedule", {}, "id"),
        ("pause_schedule", {"id": 1}, "id"),
        ("run_schedule", {"id": None}, "id"),
    ],
)
async def test_bad_fields_of_the_other_schedule_ops_are_named(
    client: ClientFactory, op: str, fields: dict[str, Any], field: str
) -> None:
    conn = await client()
    reply = await conn.request(op, **fields)
    assert reply["ok"] is False and reply["error"]["field"] == field, reply
    assert reply["error"]["code"] == "invalid_argument"


READ, PUBLISH, ADMIN = "read-8c1f", "publish-77a0", "admin-4e2d"


@with_config(
    tokens={
        READ: frozenset({Role.READ}),
        PUBLISH: frozenset({Role.PUBLISH}),
        ADMIN: frozenset({Role.ADMIN}),
    }
)
async def test_only_the_admin_role_changes_schedules_and_readers_list_them(
    client: ClientFactory,
) -> None:
    admin = await client()
    await admin.call("hello", token=ADMIN)
    await admin.call("set_schedule", schedule=schedule())
    for token in (READ, PUBLISH):
        conn = await client()
        await conn.call("hello", token=token)
        for op, fields in (
            ("set_schedule", {"schedule": schedule(id="s2")}),
            ("delete_schedule", {"id": "s1"}),
            ("pause_schedule", {"id": "s1"}),
            ("resume_schedule", {"id": "s1"}),
            ("run_schedule", {"id": "s1"}),
        ):
            reply = await conn.request(op, **fields)
            assert reply["error"]["code"] == "forbidden", (token, op, reply)
            assert "admin role" in reply["error"]["message"]
        listed = (await conn.call("list_schedules"))["schedules"]
        assert [s["id"] for s in listed] == ["s1"]
        assert listed[0]["fired"] == 0  # nothing a refused call did took effect


async def subscribed(client: ClientFactory, queue: str = "q") -> RawClient:
    worker = await client()
    await worker.call("subscribe", worker_id="w", queues=[queue], prefetch=100)
    return worker


async def nothing_pushed(conn: RawClient) -> None:
    """No job was pushed: a round trip, which any earlier push precedes."""
    await conn.call("ping")
    assert [p for p in conn.pushes if p.get("push") == "jobs"] == []


def keys_of(jobs: list[dict[str, Any]]) -> list[str]:
    return [job["key"] for job in jobs]


@BOTH_STORES
async def test_ticks_make_their_jobs_on_the_brokers_clock(
    client: ClientFactory, scheduler: SteppedScheduler
) -> None:
    admin = await client()
    made = (await admin.call("set_schedule", schedule=schedule(payload={"n": 1})))["schedule"]
    assert made["next_at"] == T0 + 10 and made["fired"] == 0 and made["last_job"] is None
    assert made["payload"] == {"n": 1} and made["tz"] == "UTC" and made["missed"] == "once"
    worker = await subscribed(client)
    await nothing_pushed(worker)

    scheduler.advance(10)
    (job,) = await worker.jobs(1)
    assert job["payload"] == {"n": 1}
    stored = (await admin.call("get_job", id=job["id"]))["job"]
    assert stored["key"] == f"schedule:s1:{round((T0 + 10) * 1000)}"
    for _ in range(3):  # each tick on its own, as the clock passes it
        scheduler.advance(10)
        await worker.jobs(1)
    (info,) = (await admin.call("list_schedules", ids=["s1"]))["schedules"]
    assert info["fired"] == 4 and info["last_at"] == T0 + 40 and info["next_at"] == T0 + 50
    assert info["last_job"] is not None


@BOTH_STORES
async def test_pause_resume_run_and_delete(
    client: ClientFactory, scheduler: SteppedScheduler
) -> None:
    admin = await client()
    await admin.call("set_schedule", schedule=schedule())
    worker = await subscribed(client)

    paused = (await admin.call("pause_schedule", id="s1"))["schedule"]
    assert paused["paused"] is True and paused["next_at"] is None
    scheduler.advance(30)
    await nothing_pushed(worker)

    job_id = (await admin.call("run_schedule", id="s1"))["id"]  # even while paused
    (job,) = await worker.jobs(1)
    assert job["id"] == job_id

    resumed = (await admin.call("resume_schedule", id="s1"))["schedule"]
    assert resumed["paused"] is False and resumed["next_at"] == T0 + 40
    scheduler.advance(10)
    await worker.jobs(1)

    assert (await admin.call("delete_schedule", id="s1"))["deleted"] is True
    assert (await admin.call("delete_schedule", id="s1"))["deleted"] is False
    scheduler.advance(60)
    await nothing_pushed(worker)
    for op in ("pause_schedule", "resume_schedule"):
        assert (await admin.call(op, id="s1"))["schedule"] is None
    assert (await admin.call("run_schedule", id="s1"))["id"] is None
    assert (await admin.call("list_schedules"))["schedules"] == []


async def test_listing_pages_in_id_order(client: ClientFactory) -> None:
    admin = await client()
    ids = [f"s{n:02}" for n in range(7)]
    for schedule_id in reversed(ids):
        await admin.call("set_schedule", schedule=schedule(id=schedule_id))
    seen: list[str] = []
    after = None
    while True:
        page = await admin.call("list_schedules", limit=3, **({"after": after} if after else {}))
        seen += [s["id"] for s in page["schedules"]]
        after = page["next"]
        if after is None:
            break
    assert seen == ids
    named = await admin.call("list_schedules", ids=["s03", "nobody", "s01"])
    assert [s["id"] for s in named["schedules"]] == ["s03", "s01"] and named["next"] is None


async def test_a_payload_with_markup_comes_back_as_it_was_sent(client: ClientFactory) -> None:
    admin = await client()
    payload = {"html": "<script>alert(1)</script>", "n": [1, 2.5, None]}
    made = (await admin.call("set_schedule", schedule=schedule(payload=payload)))["schedule"]
    assert made["payload"] == payload
    (listed,) = (await admin.call("list_schedules"))["schedules"]
    assert json.dumps(listed["payload"]) == json.dumps(payload)


def test_the_queues_file_reads_schedules_with_toml_date_times(tmp_path: Path) -> None:
    path = tmp_path / "queues.toml"
    path.write_text(
        "[queues.reports]\nmax_attempts = 3\n\n"
        "[schedules.nightly]\nqueue = 'reports'\ncron = '@daily'\ntz = 'Asia/Tokyo'\n"
        "start_at = 2027-01-01T00:00:00Z\nend_at = 1900000000\n"
        "payload = { kind = 'daily', pages = [1, 2] }\npriority = 2\nmissed = 'each'\n"
    )
    (spec,) = load_schedules(path).values()
    start = datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC).timestamp()
    assert spec == ScheduleSpec(
        id="nightly",
        queue="reports",
        payload={"kind": "daily", "pages": [1, 2]},
        cron="@daily",
        tz="Asia/Tokyo",
        start_at=start,
        end_at=1900000000,
        missed="each",
        priority=2,
    )
    assert load_queues(path)[0]["reports"].max_attempts == 3  # the queues still read
    path.write_text("[schedule.nightly]\nqueue = 'r'\n")
    with pytest.raises(ConfigError, match=r"unknown top-level key 'schedule'.*\[schedules\.ID\]"):
        load_schedules(path)


async def test_a_pause_made_at_run_time_outlasts_a_restart_unless_the_file_says_paused(
    tmp_path: Path,
) -> None:
    """The queues file is applied at every start; a schedule's progress survives that
    (SCH-5), and so does an operator's pause, unless the file itself sets ``paused``."""
    path = tmp_path / "queues.toml"
    entry = "[schedules.nightly]\nqueue = 'reports'\ncron = '@daily'\n"
    path.write_text(entry)
    base = replace(
        BASE,
        store="sqlite",
        db_path=str(tmp_path / "conveyor.db"),
        schedules=load_schedules(path),
        schedules_pausing=schedules_pausing(path),
        queues_file=str(path),
    )

    async def started(config: Config) -> ScheduleSpec:
        scheduler = SteppedScheduler(start=T0)
        async with running_broker(config, scheduler=scheduler) as broker:
            (info,) = await broker.backend.schedules(ids=["nightly"])
            if not info.spec.paused:
                await broker.backend.pause_schedule("nightly", True)
            return info.spec

    assert (await started(base)).paused is False  # then paused at run time
    assert (await started(base)).paused is True  # the same file, the pause kept
    path.write_text(entry + "paused = false\n")
    resumed = replace(
        base, schedules=load_schedules(path), schedules_pausing=schedules_pausing(path)
    )
    assert (await started(resumed)).paused is False  # the file says so in so many words
