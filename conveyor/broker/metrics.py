"""``GET /metrics``: the broker in the Prometheus text format 0.0.4.

The table's families (per-queue gauges and counters, workers, connections) are written
as plain text by ``render_table``, read at render time from the queues' counters (one
pass over the queues, never a walk over jobs). The rest comes from ``prometheus_client``:
push latency, a real histogram the dispatcher feeds; the process's own figures, memory,
CPU and open files (``process_*``); the cyclic garbage collector's counts
(``python_gc_*``) and how long each of its collections stopped the broker
(``conveyor_gc_pause_seconds``: a full one walks every pending job). ``Metrics`` joins
the two and serves one body for up to a second.
"""

from __future__ import annotations

import gc
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .engine import QueueStats

__all__ = [
    "CONTENT_TYPE",
    "GC_PAUSES",
    "GcPauses",
    "JobDurations",
    "LatencyHistogram",
    "Metrics",
    "escape_label_value",
    "render_table",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds from a job becoming claimable to its push: sub-millisecond when workers keep
# up, minutes when a queue backs up (the buckets past 5 s tell a backlog's depth).
_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)
# Seconds from a job's push to its worker's ack, retry or fail: milliseconds to an hour.
_DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    900,
    3600,
)
# Seconds one garbage collection takes: from a young generation's (the shortest) to a
# full one over a large table (the longest; measured in docs/benchmarks.md).
_GC_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


# The per-queue families, in the order they are written: (name, HELP, TYPE).
_JOBS = ("conveyor_queue_jobs", "Jobs in a queue by state.", "gauge")
_PAUSED = ("conveyor_queue_paused", "1 if the queue is paused.", "gauge")
_AGE = (
    "conveyor_queue_oldest_ready_age_seconds",
    "Seconds the oldest ready job of a queue has waited since it became ready (0: none).",
    "gauge",
)
_LIMITED = (
    "conveyor_queue_limited_jobs",
    "Ready jobs of a queue held back by a flow-control limit or back-off.",
    "gauge",
)
_LIMIT = (
    "conveyor_queue_limit",
    "A queue's flow-control limit, by name (only the limits set; rates per their period).",
    "gauge",
)
_TOTALS = tuple(
    (f"conveyor_jobs_{name}_total", f"Jobs {name} since the broker started.", "counter")
    for name in ("enqueued", "completed", "retried", "dead_lettered", "expired", "cancelled")
)
_WORKERS = ("conveyor_workers_connected", "Subscribed worker connections.", "gauge")
_CONNECTIONS = ("conveyor_connections", "Open WebSocket connections.", "gauge")


def escape_label_value(value: str) -> str:
    """``value`` as the text format 0.0.4 wants it between a label's quotes: ``\\``,
    ``"`` and newline escaped (as ``\\\\``, ``\\"`` and ``\\n``), all else as is."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _head(family: tuple[str, str, str]) -> str:
    """A family's ``# HELP`` and ``# TYPE`` lines (HELP text escapes ``\\`` and newline)."""
    name, help_text, kind = family
    help_text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


def render_table(
    queues: Mapping[str, QueueStats], *, workers: int, connections: int, now: float = 0.0
) -> str:
    """The table's families in the text format 0.0.4: per-queue job counts by state,
    paused flags, the age at ``now`` (the broker's clock) of the oldest ready job, jobs
    held back by flow control and the limits set, and running totals (one pass over the
    queues' counters, no walk over jobs), then the worker and connection gauges.

    Plain string building: prometheus_client's objects and its writer cost several times
    more per sample, and a broker may hold thousands of queues (docs/benchmarks.md).
    """
    jobs_name, paused_name = _JOBS[0], _PAUSED[0]
    jobs: list[str] = []
    paused: list[str] = []
    ages: list[str] = []
    age_name = _AGE[0]
    totals: list[list[str]] = [[] for _ in _TOTALS]
    limited: list[str] = []
    limit_lines: list[str] = []
    for name, stats in queues.items():
        label = f'{{queue="{escape_label_value(name)}"'
        jobs.append(
            f'{jobs_name}{label},state="ready"}} {stats.ready}\n'
            f'{jobs_name}{label},state="scheduled"}} {stats.scheduled}\n'
            f'{jobs_name}{label},state="processing"}} {stats.processing}\n'
            f'{jobs_name}{label},state="dead"}} {stats.dead}\n'
            f'{jobs_name}{label},state="waiting"}} {stats.waiting}\n'
        )
        paused.append(f"{paused_name}{label}}} {1 if stats.paused else 0}\n")
        oldest = stats.oldest_ready_at
        age = 0.0 if oldest is None else max(0.0, now - oldest)
        ages.append(f"{age_name}{label}}} {floatToGoString(age)}\n")  # type: ignore[no-untyped-call]
        limited.append(f"{_LIMITED[0]}{label}}} {stats.limited}\n")
        if stats.limits.any:
            for limit, value in stats.limits.given().items():
                limit_lines.append(f'{_LIMIT[0]}{label},limit="{limit}"}} {value}\n')
        t = stats.totals
        values = (t.enqueued, t.completed, t.retried, t.dead, t.expired, t.cancelled)
        for lines, (metric, _, _), value in zip(totals, _TOTALS, values, strict=True):
            lines.append(f"{metric}{label}}} {value}\n")
    parts = [_head(_JOBS), *jobs, _head(_PAUSED), *paused, _head(_AGE), *ages]
    parts += [_head(_LIMITED), *limited, _head(_LIMIT), *limit_lines]
    for family, lines in zip(_TOTALS, totals, strict=True):
        parts.append(_head(family))
        parts.extend(lines)
    parts += [_head(_WORKERS), f"{_WORKERS[0]} {workers}\n"]
    parts += [_head(_CONNECTIONS), f"{_CONNECTIONS[0]} {connections}\n"]
    return "".join(parts)


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
    """``conveyor_push_latency_seconds{queue}``: observed once per pushed job, on the event
    loop.

    prometheus_client's ``Histogram`` takes a lock and bumps a shared value per bucket on
    every observation; at tens of thousands of pushes a second that was a tenth of the
    broker's time. Here an observation is a bisect and one list slot, and the cumulative
    buckets are summed only when ``/metrics`` is scraped (on the same loop, so no lock).
    """

    def __init__(self, buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> None:
        self._bounds = buckets
        self._by_queue: dict[str, _Buckets] = {}

    def _of(self, queue: str) -> _Buckets:
        buckets = self._by_queue.get(queue)
        if buckets is None:
            buckets = self._by_queue[queue] = _Buckets(self._bounds)
        return buckets

    def observe(self, queue: str, seconds: float) -> None:
        """Count one push of a ``queue`` job ``seconds`` after it became claimable
        (negatives count 0)."""
        self._of(queue).observe_many((seconds,))

    def observe_many(self, queue: str, seconds: Iterable[float]) -> None:
        """``observe`` each of ``seconds``, all of ``queue`` (one call per run of a
        push's jobs of one queue, not per job)."""
        self._of(queue).observe_many(seconds)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "conveyor_push_latency_seconds",
            "Time from a job becoming claimable to its push to a worker.",
            labels=["queue"],
        )
        for queue, buckets in self._by_queue.items():
            family.add_metric([queue], buckets.cumulative(), buckets.sum)
        yield family


class JobDurations(Collector):
    """``conveyor_job_duration_seconds{queue,outcome}``: from a job's claim (its push
    follows at once) to the report that landed for it (``ok`` an ack, ``retry``, ``dead``
    a fail), as the broker sees it: one bisect and one list slot per job, summed at a
    scrape, as ``LatencyHistogram``; the dispatcher calls once per answer and queue.
    """

    def __init__(self, buckets: tuple[float, ...] = _DURATION_BUCKETS) -> None:
        self._bounds = buckets
        self._by_label: dict[tuple[str, str], _Buckets] = {}

    def observe(self, queue: str, outcome: str, seconds: Iterable[float]) -> None:
        """Count each of ``seconds``: jobs of ``queue`` that ended with ``outcome``."""
        buckets = self._by_label.get((queue, outcome))
        if buckets is None:
            buckets = self._by_label[(queue, outcome)] = _Buckets(self._bounds)
        buckets.observe_many(seconds)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "conveyor_job_duration_seconds",
            "Time from a job's push to its worker's ack (ok), retry or fail (dead).",
            labels=["queue", "outcome"],
        )
        for (queue, outcome), buckets in self._by_label.items():
            family.add_metric([queue, outcome], buckets.cumulative(), buckets.sum)
        yield family


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
    """One broker's ``/metrics`` body.

    The table's families come from ``render_table``; the rest (push latency, the
    process, the garbage collector) from a registry of this broker's own (never the
    process-global one, so brokers in one process do not mix) through
    ``generate_latest``. A rendered body is served again for ``max_age_s`` seconds of
    ``clock`` (monotonic): a scrape loop costs at most one render per ``max_age_s``, and
    the values a scrape reads may be that old (docs/protocol.md §1). ``max_age_s = 0``
    renders at every scrape.
    """

    def __init__(
        self,
        stats: Callable[[], Mapping[str, QueueStats]],
        *,
        workers: Callable[[], int],
        connections: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
        max_age_s: float = 1.0,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._stats = stats
        self._now = now
        self._workers = workers
        self._connections = connections
        self._clock = clock
        self.max_age_s = max_age_s
        self._body: bytes | None = None
        self._rendered_at = 0.0
        self.registry = CollectorRegistry()
        self.push_latency = LatencyHistogram()
        self.registry.register(self.push_latency)
        self.job_duration = JobDurations()
        self.registry.register(self.job_duration)
        # The process: RSS, CPU seconds, open files (read from /proc at each scrape, and
        # absent where there is none), the Python version, the collector's counts.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        GC_PAUSES.install()
        self.registry.register(GC_PAUSES)

    def render(self) -> bytes:
        """The body for one scrape: the cached one while it is younger than
        ``max_age_s``, else a fresh one (which is then cached)."""
        now = self._clock()
        if self._body is None or now - self._rendered_at >= self.max_age_s:
            table = render_table(
                self._stats(),
                workers=self._workers(),
                connections=self._connections(),
                now=self._now(),
            )
            self._body = table.encode() + generate_latest(self.registry)
            self._rendered_at = now
        return self._body
