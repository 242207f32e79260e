"""The dashboard's feed: ``watch`` and the ``snapshot`` pushes (docs/protocol.md §7, §8).

Every test runs a real broker on port 0 and talks to it with raw WebSocket clients.
Tests wait for a snapshot that shows the expected state (each wait bounded), never for
time to pass; the two that are about time itself (the pace of snapshots, the rates)
read frames until a deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from conveyor.broker import __version__
from conveyor.broker.connection import Connection
from conveyor.broker.server import Broker
from conveyor.sdk._wire import Role

from .conftest import ClientFactory, RawClient, stalled_socket, with_config

Snapshot = dict[str, Any]

# Members every snapshot carries (docs/protocol.md §8, "snapshot").
SNAPSHOT_MEMBERS = {
    "push",
    "at",
    "server",
    "queues",
    "history",
    "throughput",
    "workers",
    "worker",
    "job",
    "dead",
}
SERVER_MEMBERS = {"version", "store", "started_at", "connections"}
QUEUE_MEMBERS = {
    "ready",
    "scheduled",
    "processing",
    "dead",
    "paused",
    "totals",
    "rates",
    "last_hour",
}
TOTALS = {"enqueued", "completed", "retried", "dead", "expired", "cancelled"}
RATES = ("enqueued", "completed", "retried", "dead")  # also the history columns, in order
WORKER_MEMBERS = {
    "worker_id",
    "queues",
    "prefetch",
    "in_hand",
    "oldest_since",
    "connected_at",
    "last_seen_at",
}
DEAD_JOB_MEMBERS = {"id", "last_error", "attempts", "died_at", "payload_preview"}

# A snapshot showing a change made just before: the next tick (0.25 s) carries it.
SHOWN = 3.0


async def snapshot_where(
    viewer: RawClient, check: Callable[[Snapshot], bool], timeout: float = SHOWN
) -> Snapshot:
    """The first snapshot (kept or coming) for which ``check`` holds, within ``timeout``."""
    seen: Snapshot | None = None
    try:
        async with asyncio.timeout(timeout):
            while True:
                seen = await viewer.next_push("snapshot", timeout)
                if check(seen):
                    return seen
    except TimeoutError:
        pytest.fail(f"no snapshot matched within {timeout} s; the last one seen: {seen}")


def queue_of(snapshot: Snapshot, name: str) -> dict[str, Any]:
    return snapshot["queues"].get(name, {})


def counts(snapshot: Snapshot, name: str) -> tuple[int, int, int, int] | None:
    """(ready, scheduled, processing, dead) of queue ``name``, or None when not listed."""
    q = queue_of(snapshot, name)
    return (q["ready"], q["scheduled"], q["processing"], q["dead"]) if q else None


async def enqueue(publisher: RawClient, queue: str, payload: Any, **options: Any) -> str:
    return str((await publisher.call("enqueue", queue=queue, payload=payload, **options))["id"])


async def make_dead(
    client: ClientFactory, publisher: RawClient, queue: str, payloads: list[Any], errors: list[str]
) -> list[str]:
    """Enqueue ``payloads`` to ``queue`` and fail each (in order, with ``errors``): the ids,
    in the order they died."""
    reply = await publisher.call(
        "enqueue_batch", queue=queue, jobs=[{"payload": p, "max_attempts": 1} for p in payloads]
    )
    ids: list[str] = reply["ids"]
    killer = await client()
    await killer.call("subscribe", worker_id=f"killer-{queue}", queues=[queue], prefetch=len(ids))
    leases = {job["id"]: job["lease"] for job in await killer.jobs(len(ids))}
    for job_id, error in zip(ids, errors, strict=True):
        await killer.call("fail", id=job_id, lease=leases[job_id], error=error)
    await killer.ws.close()
    return ids


# --------------------------------------------------------------------------- the snapshot


async def test_watch_answers_ok_and_a_full_snapshot_follows_at_once(
    broker: Broker, client: ClientFactory
) -> None:
    publisher = await client()
    await enqueue(publisher, "emails", {"to": "a@b.c"})
    viewer = await client()
    started = time.monotonic()
    reply = await viewer.request("watch")
    assert reply == {"rid": reply["rid"], "ok": True}
    snapshot = await viewer.next_push("snapshot", timeout=1.0)
    # A new viewer is answered at once, not at the next quarter-second tick at best.
    assert time.monotonic() - started < 1.0

    assert set(snapshot) >= SNAPSHOT_MEMBERS
    assert snapshot["push"] == "snapshot"
    assert abs(snapshot["at"] - time.time()) < 5.0  # the broker's (wall) clock
    server = snapshot["server"]
    assert set(server) >= SERVER_MEMBERS
    assert server["version"] == __version__
    assert server["store"] == "memory"
    assert server["started_at"] == broker.started_at <= snapshot["at"]
    assert server["connections"] == 2

    emails = queue_of(snapshot, "emails")
    assert set(emails) >= QUEUE_MEMBERS
    assert counts(snapshot, "emails") == (1, 0, 0, 0)
    assert emails["paused"] is False
    assert set(emails["totals"]) >= TOTALS
    assert emails["totals"]["enqueued"] == 1
    assert set(emails["rates"]) >= set(RATES)
    assert all(isinstance(v, int | float) for v in emails["rates"].values())
    assert isinstance(snapshot["history"], dict)
    for samples in snapshot["history"].values():
        assert all(len(sample) == 1 + len(RATES) for sample in samples)
    assert snapshot["workers"] == {"total": 0, "list": []}
    assert snapshot["job"] is None  # nothing followed
    assert snapshot["dead"] is None


async def test_queue_counts_follow_enqueue_claim_ack_retry_and_fail(client: ClientFactory) -> None:
    viewer = await client()
    await viewer.call("watch")
    publisher = await client()
    for i in range(4):
        await enqueue(publisher, "q", i)
    await snapshot_where(viewer, lambda s: counts(s, "q") == (4, 0, 0, 0))

    worker = await client()
    await worker.call("subscribe", worker_id="w", queues=["q"], prefetch=3)
    jobs = await worker.jobs(3)
    await snapshot_where(viewer, lambda s: counts(s, "q") == (1, 0, 3, 0))

    await worker.call("ack", id=jobs[0]["id"], lease=jobs[0]["lease"])
    [fourth] = await worker.jobs(1)  # the freed slot takes the last ready job
    shown = await snapshot_where(
        viewer, lambda s: queue_of(s, "q").get("totals", {}).get("completed") == 1
    )
    assert counts(shown, "q") == (0, 0, 3, 0)

    await worker.call("retry", id=jobs[1]["id"], lease=jobs[1]["lease"], delay_s=3600)
    await worker.call("fail", id=jobs[2]["id"], lease=jobs[2]["lease"], error="boom")
    shown = await snapshot_where(viewer, lambda s: counts(s, "q") == (0, 1, 1, 1))
    totals = queue_of(shown, "q")["totals"]
    assert (totals["enqueued"], totals["completed"], totals["retried"], totals["dead"]) == (
        4,
        1,
        1,
        1,
    )

    await publisher.call("cancel", id=fourth["id"])
    shown = await snapshot_where(viewer, lambda s: counts(s, "q") == (0, 1, 0, 1))
    assert queue_of(shown, "q")["totals"]["cancelled"] == 1

    await publisher.call("pause", queue="q")
    await snapshot_where(viewer, lambda s: queue_of(s, "q").get("paused") is True)


async def test_rates_and_history_show_traffic_within_a_few_seconds(client: ClientFactory) -> None:
    viewer = await client()
    await viewer.call("watch")
    publisher = await client()
    await enqueue(publisher, "r", "first")
    # The feed has seen the queue before the traffic to measure starts.
    await snapshot_where(viewer, lambda s: "r" in s["queues"])

    worker = await client()
    await worker.call("subscribe", worker_id="w", queues=["r"], prefetch=50)
    await publisher.call("enqueue_batch", queue="r", jobs=[{"payload": i} for i in range(20)])
    jobs = await worker.jobs(21)
    await worker.call("ack_batch", items=[{"id": j["id"], "lease": j["lease"]} for j in jobs[:19]])
    await worker.call("retry", id=jobs[19]["id"], lease=jobs[19]["lease"], delay_s=3600)
    await worker.call("fail", id=jobs[20]["id"], lease=jobs[20]["lease"])

    # Samples are taken once a second; the traffic may straddle two of them, so collect
    # until every rate has been non-zero somewhere (in `rates` and in the history).
    rates_seen: set[str] = set()
    history_seen: set[str] = set()
    sample_times: list[float] = []
    deadline = time.monotonic() + 3.0
    while rates_seen != set(RATES) or history_seen != set(RATES):
        left = deadline - time.monotonic()
        assert left > 0, f"rates seen non-zero: {rates_seen}, in history: {history_seen}"
        snapshot = await viewer.next_push("snapshot", timeout=left)
        rates = queue_of(snapshot, "r")["rates"]
        rates_seen |= {name for name in RATES if rates[name] > 0}
        samples = snapshot["history"].get("r", [])
        for t, *values in samples:
            sample_times.append(t)
            assert t <= snapshot["at"]
            history_seen |= {name for name, v in zip(RATES, values, strict=True) if v > 0}
    # After the first snapshot, each carries only samples newer than the one before.
    assert sample_times == sorted(set(sample_times))
    # The rates are over the last minute: a second with no traffic leaves them up.
    quiet = await snapshot_where(
        viewer, lambda s: [0.0] * 4 in [v[1:] for v in s["history"].get("r", [])]
    )
    assert queue_of(quiet, "r")["rates"]["completed"] > 0
    # A new viewer gets the hour's minutes in its first snapshot; failed: the job that died.
    fresh = await client()
    await fresh.call("watch")
    hour = await fresh.next_push("snapshot", SHOWN)
    assert queue_of(hour, "r")["last_hour"] == {"completed": 19, "failed": 1}
    assert sum(bucket[1] for bucket in hour["throughput"]["r"]) == 19
    assert sum(bucket[2] for bucket in hour["throughput"]["r"]) == 1


async def test_snapshots_come_at_most_four_a_second_however_busy(
    client: ClientFactory,
) -> None:
    viewer = await client()
    await viewer.call("watch")
    publisher = await client()
    other = await client()
    await other.call("watch")
    await viewer.next_push("snapshot")

    async def busy() -> None:  # jobs keep changing the state; another viewer re-watches
        for i in range(1_000_000):
            await publisher.call("enqueue", queue="busy", payload=i)
            if i % 10 == 0:
                await other.call("watch", dead_queue="busy", dead_offset=i % 7)

    traffic = asyncio.create_task(busy())
    try:
        frames = 0
        deadline = time.monotonic() + 1.5
        while (left := deadline - time.monotonic()) > 0:
            try:
                await viewer.next_push("snapshot", timeout=left)
            except TimeoutError:
                break
            frames += 1
    finally:
        traffic.cancel()
    # Four a second over 1.5 s is 6; allow for ticks at both ends of the window.
    assert 2 <= frames <= 8, frames


# --------------------------------------------------------------------------- what it follows


async def test_a_followed_job_is_shown_live_until_it_is_gone(client: ClientFactory) -> None:
    publisher = await client()
    job_id = await enqueue(publisher, "mail", {"to": "<b>x</b>"}, priority=3)
    viewer = await client()
    await viewer.call("watch", job=job_id)

    pending = await snapshot_where(viewer, lambda s: s["job"] is not None)
    info = (await publisher.call("get_job", id=job_id))["job"]
    assert pending["job"] == info  # every member of get_job, equal
    assert pending["job"]["state"] == "ready"
    assert pending["job"]["payload"] == {"to": "<b>x</b>"}

    worker = await client()
    await worker.call("subscribe", worker_id="w-9", queues=["mail"], prefetch=1)
    [job] = await worker.jobs(1)
    processing = await snapshot_where(viewer, lambda s: s["job"]["state"] == "processing")
    assert processing["job"]["worker_id"] == "w-9"
    assert processing["job"]["attempts"] == 1
    assert processing["job"]["deadline"] == job["deadline"]

    await worker.call("ack", id=job_id, lease=job["lease"])
    await snapshot_where(viewer, lambda s: s["job"] == {"id": job_id, "gone": True})

    # Watching again changes what is followed; an id that never existed is gone at once.
    await viewer.call("watch", job="no-such-job")
    await snapshot_where(viewer, lambda s: s["job"] == {"id": "no-such-job", "gone": True})
    await viewer.call("watch")
    await snapshot_where(viewer, lambda s: s["job"] is None)


async def test_dead_letter_page_newest_first_paged_with_total_and_raw_text(
    client: ClientFactory,
) -> None:
    publisher = await client()
    script = "<script>alert('x')</script>"
    payloads: list[Any] = [
        {"n": 0},
        "x" * 300,  # its JSON is 302 characters: the preview keeps 200
        "\u00e9" * 300,  # cut by characters, not bytes
        {"html": script},
        {"n": 4},
    ]
    errors = ["e0", "e1", "e2", f"ValueError: {script}", "e4"]
    ids = await make_dead(client, publisher, "dlq", payloads, errors)

    viewer = await client()
    await viewer.call("watch", dead_queue="dlq", dead_limit=2)
    page = (await snapshot_where(viewer, lambda s: s["dead"] is not None))["dead"]
    assert {k: page[k] for k in ("queue", "offset", "limit", "total")} == {
        "queue": "dlq",
        "offset": 0,
        "limit": 2,
        "total": 5,
    }
    assert [job["id"] for job in page["jobs"]] == [ids[4], ids[3]]  # the latest death first
    newest, with_script = page["jobs"]
    assert set(newest) >= DEAD_JOB_MEMBERS
    assert newest["last_error"] == "e4"
    assert newest["attempts"] == 1
    assert newest["payload_preview"] == '{"n":4}'
    assert isinstance(newest["died_at"], float)
    assert with_script["died_at"] <= newest["died_at"]
    # Markup comes through as the very characters sent: the page escapes, not the broker.
    assert with_script["last_error"] == f"ValueError: {script}"
    assert with_script["payload_preview"] == '{"html":"' + script + '"}'

    await viewer.call("watch", dead_queue="dlq", dead_offset=2, dead_limit=2)
    page = (await snapshot_where(viewer, lambda s: s["dead"]["offset"] == 2))["dead"]
    assert page["total"] == 5
    assert [job["id"] for job in page["jobs"]] == [ids[2], ids[1]]
    accents, long_x = page["jobs"]
    assert accents["payload_preview"] == '"' + "\u00e9" * 199
    assert long_x["payload_preview"] == '"' + "x" * 199

    await viewer.call("watch", dead_queue="dlq", dead_offset=4, dead_limit=100)
    page = (await snapshot_where(viewer, lambda s: s["dead"]["offset"] == 4))["dead"]
    assert [job["id"] for job in page["jobs"]] == [ids[0]]
    await viewer.call("watch", dead_queue="dlq", dead_offset=50, dead_limit=1)
    page = (await snapshot_where(viewer, lambda s: s["dead"]["offset"] == 50))["dead"]
    assert (page["total"], page["jobs"]) == (5, [])

    # A queue nobody made has an empty page, and watching it does not make it.
    await viewer.call("watch", dead_queue="nowhere")
    shown = await snapshot_where(viewer, lambda s: s["dead"]["queue"] == "nowhere")
    assert (shown["dead"]["total"], shown["dead"]["jobs"]) == (0, [])
    assert "nowhere" not in shown["queues"]
    assert "nowhere" not in (await publisher.call("stats"))["queues"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"dead_limit": 0}, "dead_limit"),
        ({"dead_limit": 101}, "dead_limit"),
        ({"dead_offset": -1}, "dead_offset"),
        ({"dead_offset": 1.5}, "dead_offset"),
        ({"job": 7}, "job"),
        ({"dead_page": 1}, "dead_page"),
    ],
)
async def test_a_bad_watch_is_invalid_argument_naming_the_field(
    client: ClientFactory, fields: dict[str, Any], field: str
) -> None:
    viewer = await client()
    reply = await viewer.request("watch", dead_queue="q", **fields)
    assert reply["ok"] is False
    assert reply["error"]["code"] == "invalid_argument"
    assert reply["error"]["field"] == field
    # The connection stays usable, and the limits themselves are accepted.
    await viewer.call("watch", dead_queue="q", dead_offset=0, dead_limit=100)
    await viewer.call("watch", dead_queue="q", dead_limit=1)


async def test_the_workers_list_shows_each_subscribed_worker(client: ClientFactory) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="host-1-ab12", queues=["a", "b"], prefetch=5)
    await publisher.call("enqueue_batch", queue="b", jobs=[{"payload": 1}, {"payload": 2}])
    await worker.jobs(2)
    viewer = await client()
    await viewer.call("watch")

    def held_two(s: Snapshot) -> bool:
        return [w["in_hand"] for w in s["workers"]["list"]] == [2]

    workers = (await snapshot_where(viewer, held_two))["workers"]
    assert workers["total"] == 1  # the publisher and the viewer are no workers
    [listed] = workers["list"]
    assert set(listed) >= WORKER_MEMBERS
    assert listed["worker_id"] == "host-1-ab12"
    assert listed["queues"] == ["a", "b"]
    assert listed["prefetch"] == 5
    assert listed["connected_at"] <= listed["last_seen_at"] <= time.time() + 1
    assert listed["connected_at"] <= listed["oldest_since"] <= time.time() + 1
    assert workers_of_each_snapshot_have_no_jobs(workers)

    # Its detail, for the viewer that opened it: each job it holds, oldest first.
    await viewer.call("watch", worker="host-1-ab12")
    detail = (await snapshot_where(viewer, lambda s: s["worker"] is not None))["worker"]
    assert detail["worker_id"] == "host-1-ab12"
    assert (detail["here"], detail["connections"], detail["held"]) == (True, 1, 2)
    assert [(j["queue"], j["attempt"], j["reattached"]) for j in detail["jobs"]] == [
        ("b", 1, False),
        ("b", 1, False),
    ]
    assert detail["jobs"][0]["since"] == listed["oldest_since"]

    await worker.ws.close()
    gone = await snapshot_where(viewer, lambda s: s["workers"] == {"total": 0, "list": []})
    assert gone["worker"] == {"worker_id": "host-1-ab12", "gone": True}


def workers_of_each_snapshot_have_no_jobs(workers: dict[str, Any]) -> bool:
    """The shared workers list carries counts, never job lists (its cost stays bounded)."""
    return all("jobs" not in entry for entry in workers["list"])


# --------------------------------------------------------------------------- who may watch

READ, PUBLISH, WORK, ADMIN = "read-token-1", "publish-token-1", "work-token-1", "admin-token-1"


@with_config(
    tokens={
        READ: frozenset({Role.READ}),
        PUBLISH: frozenset({Role.PUBLISH}),
        WORK: frozenset({Role.WORK}),
        ADMIN: frozenset({Role.ADMIN}),
    }
)
async def test_read_and_admin_may_watch_publish_and_work_may_not(client: ClientFactory) -> None:
    refused: list[RawClient] = []
    for token in (PUBLISH, WORK):
        other = await client()
        await other.call("hello", token=token)
        reply = await other.request("watch")
        assert reply["ok"] is False
        assert reply["error"]["code"] == "forbidden"
        refused.append(other)
    anonymous = await client()
    assert (await anonymous.request("watch"))["error"]["code"] == "unauthorized"
    refused.append(anonymous)

    viewers = []
    for token in (READ, ADMIN):
        viewer = await client(additional_headers={"Authorization": f"Bearer {token}"})
        await viewer.call("watch")
        viewers.append(viewer)
    # A tick after the refusals has reached the viewers, so it has been decided for every
    # connection: a ping round trip then shows that none came to the refused ones.
    for viewer in viewers:
        await viewer.next_push("snapshot")
    for other in refused:
        await other.call("ping")
        assert [frame for frame in other.pushes if frame["push"] == "snapshot"] == []


# --------------------------------------------------------------------------- a frozen viewer

JOBS = 20_000
BATCH = 1000
PREFETCH = 16
DEAD_ROWS = 100
ERROR_CHARS = 8000  # 100 dead rows of this: a snapshot of the page is ~800 KB


async def run_jobs(
    publisher: RawClient, worker: RawClient, n: int, after_ack: Callable[[], None]
) -> float:
    """Enqueue ``n`` jobs and have ``worker`` ack them all; seconds from first enqueue to
    the last ack confirmed."""
    started = time.perf_counter()

    async def publish() -> None:
        for start in range(0, n, BATCH):
            jobs = [{"payload": {"n": i, "pad": "x" * 100}} for i in range(start, start + BATCH)]
            await publisher.call("enqueue_batch", queue="work", jobs=jobs)

    async def work() -> None:
        landed, rid = 0, 0
        while landed < n:
            frame = await worker.recv()
            if frame.get("push") == "jobs":
                rid += 1
                items = [{"id": job["id"], "lease": job["lease"]} for job in frame["jobs"]]
                await worker.send({"op": "ack_batch", "rid": f"a{rid}", "items": items})
                after_ack()
            else:
                assert frame.get("ok") is True, frame
                landed += sum(frame["landed"])

    await asyncio.wait_for(asyncio.gather(publish(), work()), 15)
    return time.perf_counter() - started


def server_side(broker: Broker, local: Any) -> Connection:
    """The broker's connection object for the client socket at address ``local``."""
    [conn] = [c for c in broker.connections if c.ws.remote_address[:2] == local[:2]]
    return conn


async def test_a_frozen_viewer_never_slows_job_delivery_nor_grows_a_buffer(
    broker: Broker, client: ClientFactory
) -> None:
    publisher = await client()
    # Big snapshots for the frozen viewer, so that its socket buffers fill at once.
    await make_dead(
        client,
        publisher,
        "dlq",
        [{"n": i} for i in range(DEAD_ROWS)],
        [f"{i}: " + "e" * ERROR_CHARS for i in range(DEAD_ROWS)],
    )
    worker = await client()
    await worker.call("subscribe", worker_id="w", queues=["work"], prefetch=PREFETCH)
    live = await client()  # a viewer that reads: it shows that the feed keeps ticking
    await live.call("watch")

    baseline = await run_jobs(publisher, worker, JOBS, lambda: None)

    frozen = await client(sock=stalled_socket(broker.url), max_queue=1, ping_interval=None)
    try:
        await frozen.call("watch", dead_queue="dlq", dead_limit=DEAD_ROWS)
        frozen.ws.transport.pause_reading()  # the tab freezes: nothing is read from now on
        conn = server_side(broker, frozen.ws.local_address)
        # Wait (bounded) until the broker really cannot write to it any more.
        async with asyncio.timeout(5):
            while conn.ws.transport.get_write_buffer_size() == 0:
                await live.next_push("snapshot")

        most_queued = 0

        def sample() -> None:
            nonlocal most_queued
            most_queued = max(most_queued, len(conn._outbox))

        with_frozen = await run_jobs(publisher, worker, JOBS, sample)
        # More ticks pass while it stays frozen (a snapshot queued at each would show),
        # and still nothing piles up.
        for _ in range(4):
            await live.next_push("snapshot")
            sample()
        assert conn in broker.connections  # not dropped: it is merely behind
    finally:
        frozen.ws.transport.abort()

    stats = (await publisher.call("stats", queue="work"))["queues"]["work"]
    assert stats["totals"]["completed"] == 2 * JOBS
    assert (stats["ready"], stats["processing"]) == (0, 0)
    assert most_queued <= 2, most_queued
    # Timings are noisy: only a frozen viewer that really slowed delivery fails this.
    assert with_frozen < 3 * baseline, (with_frozen, baseline)
