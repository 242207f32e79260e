"""The ``/metrics`` body without a server: the table's families written by hand in the
text format 0.0.4, the rest from prometheus_client, and the one-second cache.

The oracle for "the same families and values" is prometheus_client itself: the table's
counters put into its metric families and written by its ``generate_latest``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from conveyor.broker.engine import JobTable, Limits, QueueOpts, QueueStats
from conveyor.broker.metrics import Metrics, escape_label_value, render_table

TOTALS = ("enqueued", "completed", "retried", "dead_lettered", "expired", "cancelled")


class ManualClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def make_table() -> tuple[JobTable, ManualClock]:
    clock = ManualClock()
    return JobTable(clock=clock, rng=random.Random(3), id_prefix="t"), clock


def stats_of(table: JobTable) -> Callable[[], dict[str, QueueStats]]:
    """What the broker hands ``Metrics``: every queue's counts, read when called."""
    return lambda: {name: table.queue(name).stats() for name in table.queues()}


def busy_table() -> JobTable:
    """Queues with jobs in every state, a paused one and names using every allowed
    punctuation mark."""
    table, _clock = make_table()
    q = table.queue("mail.out_eu-1:hi", QueueOpts(max_attempts=1))
    for i in range(6):
        q.enqueue(i)
    q.enqueue("later", delay_s=60)
    first, second, third, fourth = (q.claim_one("w") for _ in range(4))
    assert first and second and third and fourth
    first.ack()
    second.fail("boom")  # one attempt allowed: dead-lettered
    third.retry(delay_s=30)  # its one attempt spent: dead-lettered too
    assert table.cancel(q.enqueue("gone"))
    table.queue("empty").pause()
    table.queue("x")
    # A limited queue: one slot, held, so its other ready jobs wait on the limit.
    limited = table.queue("limited")
    limited.set_limits(Limits(concurrency=1, rate=30, per_s=60.0))
    for i in range(3):
        limited.enqueue(i, partition=f"k{i}")
    assert limited.claim_one("w")
    return table


class ReferenceCollector(Collector):
    """The table's families built from prometheus_client's own metric objects."""

    def __init__(self, table: JobTable, workers: int, connections: int, now: float) -> None:
        self.table, self.workers, self.connections = table, workers, connections
        self.now = now

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "conveyor_queue_jobs", "Jobs in a queue by state.", labels=["queue", "state"]
        )
        paused = GaugeMetricFamily(
            "conveyor_queue_paused", "1 if the queue is paused.", labels=["queue"]
        )
        ages = GaugeMetricFamily(
            "conveyor_queue_oldest_ready_age_seconds",
            "Seconds the oldest ready job of a queue has waited since it became ready (0: none).",
            labels=["queue"],
        )
        limited = GaugeMetricFamily(
            "conveyor_queue_limited_jobs",
            "Ready jobs of a queue held back by a flow-control limit or back-off.",
            labels=["queue"],
        )
        limit = GaugeMetricFamily(
            "conveyor_queue_limit",
            "A queue's flow-control limit, by name (only the limits set; rates per their period).",
            labels=["queue", "limit"],
        )
        totals = {
            name: CounterMetricFamily(
                f"conveyor_jobs_{name}", f"Jobs {name} since the broker started.", labels=["queue"]
            )
            for name in TOTALS
        }
        for name in self.table.queues():
            stats = self.table.queue(name).stats()
            for state in ("ready", "scheduled", "processing", "dead", "waiting"):
                jobs.add_metric([name, state], getattr(stats, state))
            paused.add_metric([name], 1.0 if stats.paused else 0.0)
            oldest = stats.oldest_ready_at
            ages.add_metric([name], 0.0 if oldest is None else self.now - oldest)
            limited.add_metric([name], stats.limited)
            for field, value in stats.limits.given().items():
                limit.add_metric([name, field], value)
            t = stats.totals
            values = (t.enqueued, t.completed, t.retried, t.dead, t.expired, t.cancelled)
            for total, value in zip(TOTALS, values, strict=True):
                totals[total].add_metric([name], value)
        yield jobs
        yield paused
        yield ages
        yield limited
        yield limit
        yield from totals.values()
        yield GaugeMetricFamily(
            "conveyor_workers_connected", "Subscribed worker connections.", value=self.workers
        )
        yield GaugeMetricFamily(
            "conveyor_connections", "Open WebSocket connections.", value=self.connections
        )


def families(text: str) -> list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]:
    """Every family parsed: name, type, help and its samples, in the order written."""
    return [
        (f.name, f.type, f.documentation, [(s.name, s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(text)
    ]


def samples(body: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
    }


def test_the_table_families_parse_to_what_prometheus_client_writes() -> None:
    table = busy_table()
    registry = CollectorRegistry()
    registry.register(ReferenceCollector(table, workers=2, connections=5, now=1_010.0))
    expected = families(generate_latest(registry).decode())

    got = families(render_table(stats_of(table)(), workers=2, connections=5, now=1_010.0))

    assert got == expected
    by_name = {name: found for name, _type, _help, found in got}
    jobs = {
        (labels["queue"], labels["state"]): value
        for _, labels, value in by_name["conveyor_queue_jobs"]
    }
    states = ("ready", "scheduled", "processing", "dead")
    assert [jobs["mail.out_eu-1:hi", state] for state in states] == [2, 1, 1, 2]
    assert ("conveyor_queue_paused", {"queue": "empty"}, 1.0) in by_name["conveyor_queue_paused"]
    assert ("conveyor_queue_limited_jobs", {"queue": "limited"}, 2.0) in by_name[
        "conveyor_queue_limited_jobs"
    ]
    limits = {
        labels["limit"]: value
        for _, labels, value in by_name["conveyor_queue_limit"]
        if labels["queue"] == "limited"
    }
    assert limits == {"concurrency": 1.0, "rate": 30.0, "per_s": 60.0}


def test_each_family_has_one_help_and_one_type_line_in_the_whole_body() -> None:
    body = (
        Metrics(stats_of(busy_table()), workers=lambda: 0, connections=lambda: 0).render().decode()
    )
    types = [line.split()[2] for line in body.splitlines() if line.startswith("# TYPE ")]
    helps = [line.split()[2] for line in body.splitlines() if line.startswith("# HELP ")]
    assert len(types) == len(set(types)) == len(helps)
    assert set(types) == set(helps)
    # The table's part and prometheus_client's part are both there, and parse as one.
    names = {name for name, *_ in families(body)}
    assert {"conveyor_queue_jobs", "conveyor_jobs_enqueued", "conveyor_connections"} <= names
    assert {"conveyor_push_latency_seconds", "conveyor_gc_pause_seconds", "python_info"} <= names


def test_label_values_escape_backslash_quote_and_newline() -> None:
    raw = 'a\\b"c\nd'
    assert escape_label_value(raw) == 'a\\\\b\\"c\\nd'
    assert escape_label_value("mail.out_eu-1:hi") == "mail.out_eu-1:hi"
    line = f'm{{queue="{escape_label_value(raw)}"}} 1\n'
    [family] = text_string_to_metric_families(line)
    assert family.samples[0].labels == {"queue": raw}


def test_a_scrape_within_a_second_gets_the_same_body_and_a_later_one_new_values() -> None:
    table, _ = make_table()
    clock = ManualClock()
    workers = [1]
    metrics = Metrics(
        stats_of(table), workers=lambda: workers[0], connections=lambda: 1, clock=clock
    )
    queue = table.queue("q")
    queue.enqueue(1)
    first = metrics.render()

    queue.enqueue(2)
    workers[0] = 4
    clock.now += 0.999
    assert metrics.render() is first  # cached: nothing re-read

    clock.now += 0.002
    fresh = samples(metrics.render())
    assert fresh[("conveyor_queue_jobs", frozenset({"queue": "q", "state": "ready"}.items()))] == 2
    assert fresh[("conveyor_jobs_enqueued_total", frozenset({"queue": "q"}.items()))] == 2
    assert fresh[("conveyor_workers_connected", frozenset())] == 4


def test_with_max_age_zero_every_scrape_renders() -> None:
    table, _ = make_table()
    clock = ManualClock()
    metrics = Metrics(
        stats_of(table), workers=lambda: 0, connections=lambda: 0, clock=clock, max_age_s=0
    )
    metrics.render()
    table.queue("new")
    assert ("conveyor_queue_paused", frozenset({"queue": "new"}.items())) in samples(
        metrics.render()
    )


def test_a_table_of_five_thousand_queues_renders_every_queue() -> None:
    table, _ = make_table()
    for i in range(5_000):
        queue = table.queue(f"q{i}")
        for _ in range(i % 3):
            queue.enqueue(i)
    body = Metrics(stats_of(table), workers=lambda: 0, connections=lambda: 0).render()

    got: dict[str, Any] = {name: found for name, _type, _help, found in families(body.decode())}
    assert len(got["conveyor_queue_jobs"]) == 5 * 5_000
    assert len(got["conveyor_queue_paused"]) == 5_000
    enqueued = {labels["queue"]: value for _, labels, value in got["conveyor_jobs_enqueued"]}
    assert len(enqueued) == 5_000
    assert (enqueued["q0"], enqueued["q4001"], enqueued["q4999"]) == (0, 2, 1)


def test_the_oldest_ready_age_is_now_minus_the_oldest_ready_time_and_0_for_none() -> None:
    table, clock = make_table()
    q = table.queue("q")
    q.enqueue("first")
    clock.now += 5
    q.enqueue("urgent", priority=9)  # claimed first, but not the oldest
    table.queue("idle").enqueue("later", delay_s=60)
    clock.now += 25
    body = render_table(stats_of(table)(), workers=0, connections=0, now=clock.now)
    got = samples(body.encode())
    age = "conveyor_queue_oldest_ready_age_seconds"
    assert got[(age, frozenset({("queue", "q")}))] == 30.0
    assert got[(age, frozenset({("queue", "idle")}))] == 0.0  # nothing ready there
    handle = q.claim_one("w")
    assert handle is not None and handle.payload_json == b'"urgent"'
    body = render_table(stats_of(table)(), workers=0, connections=0, now=clock.now)
    assert samples(body.encode())[(age, frozenset({("queue", "q")}))] == 30.0


def test_push_latency_buckets_reach_five_minutes_and_job_durations_are_labelled() -> None:
    table, _clock = make_table()
    metrics = Metrics(stats_of(table), workers=lambda: 0, connections=lambda: 0, max_age_s=0)
    metrics.push_latency.observe_many("q", [0.001, 45.0, 200.0, 1000.0])
    metrics.job_duration.observe("q", "ok", [0.2])
    metrics.job_duration.observe("q", "ok", [70.0])
    metrics.job_duration.observe("q", "dead", [3.0])
    got = samples(metrics.render())
    bucket = "conveyor_push_latency_seconds_bucket"
    assert got[(bucket, frozenset({("queue", "q"), ("le", "5.0")}))] == 1
    assert got[(bucket, frozenset({("queue", "q"), ("le", "60.0")}))] == 2
    assert got[(bucket, frozenset({("queue", "q"), ("le", "300.0")}))] == 3
    assert got[(bucket, frozenset({("queue", "q"), ("le", "+Inf")}))] == 4
    ok = frozenset({("queue", "q"), ("outcome", "ok")})
    assert got[("conveyor_job_duration_seconds_count", ok)] == 2
    assert got[("conveyor_job_duration_seconds_sum", ok)] == 70.2
    assert got[("conveyor_job_duration_seconds_bucket", ok | {("le", "60.0")})] == 1
    dead = frozenset({("queue", "q"), ("outcome", "dead")})
    assert got[("conveyor_job_duration_seconds_count", dead)] == 1
