"""enqueue_each: independent enqueues in one frame, each answered on its own."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.broker.engine import Queue

from .conftest import BOTH_STORES, ClientFactory, with_config

pytestmark = BOTH_STORES


def error_of(result: dict[str, Any]) -> tuple[str, str]:
    """(code, field) of a refused entry, checking that its message starts with the field."""
    error = result["error"]
    assert error["message"].startswith(f"{error['field']}: "), error
    return error["code"], error["field"]


@with_config(max_payload_bytes=1024)
async def test_a_bad_job_fails_alone_and_the_others_are_stored_in_order(
    client: ClientFactory,
) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w", queues=["each"], prefetch=10)
    jobs: list[Any] = [
        {"queue": "each", "payload": "first"},
        5,
        {"queue": "each", "payload": 1, "bogus": 1},
        {"queue": "no spaces!", "payload": 1},
        {"queue": "each", "payload": "second", "priority": 0, "key": "k2"},
        {"queue": "each", "payload": 1, "priority": 2**40},
        {"queue": "each", "payload": "x" * 2000},
        {"queue": "each", "payload": 1, "priority": True},
        {"queue": "each"},
        {"queue": "each", "payload": None},
    ]
    results = (await publisher.call("enqueue_each", jobs=jobs))["results"]

    assert len(results) == len(jobs)
    assert [error_of(r) for r in results if "error" in r] == [
        ("invalid_argument", "jobs[1]"),
        ("invalid_argument", "jobs[2].bogus"),
        ("invalid_argument", "jobs[3].queue"),
        ("invalid_argument", "jobs[5].priority"),
        ("too_large", "jobs[6].payload"),
        ("invalid_argument", "jobs[7].priority"),
        ("invalid_argument", "jobs[8].payload"),
    ]
    stored = [r["id"] for r in results if "id" in r]
    assert [i for i, r in enumerate(results) if "id" in r] == [0, 4, 9]
    pushed = await worker.jobs(3)
    assert [j["id"] for j in pushed] == stored
    assert [j["payload"] for j in pushed] == ["first", "second", None]
    stats = (await publisher.call("stats", queue="each"))["queues"]["each"]
    assert stats["totals"]["enqueued"] == 3
    job = (await publisher.call("get_job", id=stored[1]))["job"]
    assert job["key"] == "k2"


async def test_keys_work_per_job_within_one_frame_and_across_frames(
    client: ClientFactory,
) -> None:
    publisher = await client()
    jobs = [
        {"queue": "keys", "payload": 1, "key": "same"},
        {"queue": "keys", "payload": 2, "key": "same"},
        {"queue": "keys", "payload": 3, "key": "other"},
    ]
    first = [r["id"] for r in (await publisher.call("enqueue_each", jobs=jobs))["results"]]
    assert first[0] == first[1] != first[2]
    again = [r["id"] for r in (await publisher.call("enqueue_each", jobs=jobs))["results"]]
    assert again == first  # a resent frame stores nothing new
    stats = (await publisher.call("stats", queue="keys"))["queues"]["keys"]
    assert stats["totals"]["enqueued"] == 2


async def test_jobs_may_go_to_several_queues_with_their_own_options(
    client: ClientFactory,
) -> None:
    publisher = await client()
    worker = await client()
    await worker.call("subscribe", worker_id="w", queues=["a", "b"], prefetch=10)
    jobs = [
        {"queue": "a", "payload": "a-low"},
        {"queue": "b", "payload": "b", "max_attempts": 7},
        {"queue": "a", "payload": "a-high", "priority": 5},
        {"queue": "a", "payload": "later", "delay_s": 3600},
    ]
    results = (await publisher.call("enqueue_each", jobs=jobs))["results"]
    assert all("id" in r for r in results)
    pushed = await worker.jobs(3)
    assert {j["payload"] for j in pushed} == {"a-low", "a-high", "b"}
    assert next(j for j in pushed if j["queue"] == "b")["max_attempts"] == 7
    stats = (await publisher.call("stats"))["queues"]
    assert stats["a"]["scheduled"] == 1 and stats["b"]["totals"]["enqueued"] == 1


async def test_an_empty_frame_is_answered_with_no_results(client: ClientFactory) -> None:
    publisher = await client()
    assert (await publisher.call("enqueue_each", jobs=[]))["results"] == []


async def test_our_bug_in_one_job_answers_internal_for_it_alone(
    client: ClientFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    resolve = Queue.resolve

    def flaky(self: Queue, payload: Any, *options: Any) -> tuple[Any, ...]:
        if payload.data == b'"boom"':
            raise RuntimeError("a bug of ours")
        return resolve(self, payload, *options)

    monkeypatch.setattr(Queue, "resolve", flaky)
    publisher = await client()
    jobs = [{"queue": "bug", "payload": p} for p in ("a", "boom", "b")]
    results = (await publisher.call("enqueue_each", jobs=jobs))["results"]
    assert "id" in results[0] and "id" in results[2]
    # The peer learns nothing of the bug but that it was ours; the log has it whole.
    assert results[1] == {"error": {"code": "internal", "message": "internal error", "field": None}}
    assert "a bug of ours" in caplog.text
    stats = (await publisher.call("stats", queue="bug"))["queues"]["bug"]
    assert stats["totals"]["enqueued"] == 2
