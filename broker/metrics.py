"""``GET /metrics``: the broker in the Prometheus text format, via ``prometheus_client``.

Gauges and counters are read at scrape time from the engine's counters (a collector,
never a walk over jobs); push latency is a real histogram the dispatcher feeds. The
process's own figures come too: memory, CPU and open files (``process_*``), the cyclic
garbage collector's counts (``python_gc_*``) and how long each of its collections
stopped the broker (``conveyor_gc_pause_seconds``: a full one walks every pending job).
"""

from __future__ import annotations

import gc
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .engine import JobTable

__all__ = ["CONTENT_TYPE", "GC_PAUSES", "GcPauses", "LatencyHistogram", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds from a job becoming claimable to its push: sub-millisecond to a few seconds.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
# Seconds one garbage collection takes: a young one well under a millisecond, a full one
# with a million pending jobs about a quarter of a second (docs/benchmarks.md).
_GC_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


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


class _Buckets:
    """A histogram's counts: an observation is a bisect and one list slot; the cumulative
    buckets are summed only when asked (at a scrape)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last slot is "+Inf" only
        self.sum = 0.0

    def observe_many(self, values: Iterable[float]) -> None:
        """Count each of ``values`` (negatives count as 0)."""
        bounds, counts = self._bounds, self._counts
        total = 0.0
        for value in values:
            if value < 0.0:
                value = 0.0
            # Prometheus buckets are "less than or equal": bisect_left puts a value equal
            # to a bound in that bound's bucket.
            counts[bisect_left(bounds, value)] += 1
            total += value
        self.sum += total

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count)`` pairs as Prometheus wants them, "+Inf" last."""
        pairs: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self._bounds, float("inf")), self._counts, strict=True):
            running += count
            pairs.append((floatToGoString(bound), running))  # type: ignore[no-untyped-call]
        return pairs


class LatencyHistogram(Collector):
    """``conveyor_push_latency_seconds``: observed once per pushed job, on the event loop.

    prometheus_client's ``Histogram`` takes a lock and bumps a shared value per bucket on
    every observation; at tens of thousands of pushes a second that was a tenth of the
    broker's time. Here an observation is a bisect and one list slot, and the cumulative
    buckets are summed only when ``/metrics`` is scraped (on the same loop, so no lock).
    """

    def __init__(self, buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> None:
        self._buckets = _Buckets(buckets)

    def observe(self, seconds: float) -> None:
        """Count one push ``seconds`` after its job became claimable (negatives count 0)."""
        self._buckets.observe_many((seconds,))

    def observe_many(self, seconds: Iterable[float]) -> None:
        """``observe`` each of ``seconds`` (one call per pushed frame, not per job)."""
        self._buckets.observe_many(seconds)

    def collect(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(
            "conveyor_push_latency_seconds",
            "Time from a job becoming claimable to its push to a worker.",
            buckets=self._buckets.cumulative(),
            sum_value=self._buckets.sum,
        )


class GcPauses(Collector):
    """``conveyor_gc_pause_seconds{generation}``: how long each collection of Python's
    cyclic garbage collector stopped the process, timed by a ``gc.callbacks`` hook.

    The collector is the process's, so this is too: ``GC_PAUSES`` is the one instance,
    ``install()`` (idempotent) hooks it once, and every broker's registry reads it. The
    hook runs in whichever thread was allocating when a collection came due, inside the
    collection; it only reads the clock and counts, so it cannot fail.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._by_generation = [_Buckets(_GC_BUCKETS) for _ in range(3)]
        self._started = 0.0
        self._installed = False

    def install(self) -> None:
        """Start timing collections (once per process, however often called)."""
        if not self._installed:
            self._installed = True
            gc.callbacks.append(self.on_gc)

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` hook: ``phase`` "start" or "stop" of a collection of
        ``info["generation"]`` (0, 1 or 2)."""
        if phase == "start":
            self._started = self._clock()
        else:
            self._by_generation[info["generation"]].observe_many((self._clock() - self._started,))

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "conveyor_gc_pause_seconds",
            "Time each collection of the cyclic garbage collector stopped the broker.",
            labels=["generation"],
        )
        for generation, buckets in enumerate(self._by_generation):
            family.add_metric([str(generation)], buckets.cumulative(), buckets.sum)
        yield family


GC_PAUSES = GcPauses()


class Metrics:
    """One broker's registry (never the process-global one, so brokers in one process
    do not mix)."""

    def __init__(
        self, table: JobTable, *, workers: Callable[[], int], connections: Callable[[], int]
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_TableCollector(table, workers, connections))
        self.push_latency = LatencyHistogram()
        self.registry.register(self.push_latency)
        # The process: RSS, CPU seconds, open files (read from /proc at each scrape, and
        # absent where there is none), the Python version, the collector's counts.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        GC_PAUSES.install()
        self.registry.register(GC_PAUSES)

    def render(self) -> bytes:
        return generate_latest(self.registry)
