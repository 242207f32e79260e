"""``GET /metrics``: the broker in the Prometheus text format, via ``prometheus_client``.

Gauges and counters are read at scrape time from the engine's counters (a collector,
never a walk over jobs); push latency is a real histogram the dispatcher feeds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .engine import JobTable

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds from a job becoming claimable to its push: sub-millisecond to a few seconds.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class _TableCollector(Collector):
    def __init__(self, table: JobTable, workers: Callable[[], int], conns: Callable[[], int]):
        self._table = table
        self._workers = workers
        self._conns = conns

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "conveyor_queue_jobs", "Jobs in a queue by state.", labels=["queue", "state"]
        )
        paused = GaugeMetricFamily(
            "conveyor_queue_paused", "1 if the queue is paused.", labels=["queue"]
        )
        totals = {
            name: CounterMetricFamily(
                f"conveyor_jobs_{name}", f"Jobs {name} since the broker started.", labels=["queue"]
            )
            for name in (
                "enqueued",
                "completed",
                "retried",
                "dead_lettered",
                "expired",
                "cancelled",
            )
        }
        for name in self._table.queues():
            stats = self._table.queue(name).stats()
            for state in ("ready", "scheduled", "processing", "dead"):
                jobs.add_metric([name, state], getattr(stats, state))
            paused.add_metric([name], 1.0 if stats.paused else 0.0)
            t = stats.totals
            totals["enqueued"].add_metric([name], t.enqueued)
            totals["completed"].add_metric([name], t.completed)
            totals["retried"].add_metric([name], t.retried)
            totals["dead_lettered"].add_metric([name], t.dead)
            totals["expired"].add_metric([name], t.expired)
            totals["cancelled"].add_metric([name], t.cancelled)
        yield jobs
        yield paused
        yield from totals.values()
        yield GaugeMetricFamily(
            "conveyor_workers_connected", "Subscribed worker connections.", value=self._workers()
        )
        yield GaugeMetricFamily(
            "conveyor_connections", "Open WebSocket connections.", value=self._conns()
        )


class Metrics:
    """One broker's registry (never the process-global one, so brokers in one process
    do not mix)."""

    def __init__(
        self, table: JobTable, *, workers: Callable[[], int], connections: Callable[[], int]
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_TableCollector(table, workers, connections))
        self.push_latency = Histogram(
            "conveyor_push_latency_seconds",
            "Time from a job becoming claimable to its push to a worker.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
