"""The plain-HTTP side of the broker's port: the dashboard's files, ``/healthz`` and
``/metrics`` (docs/protocol.md §1).

Requests are written by hand on a raw socket, so the paths reach the broker exactly as
sent: HTTP clients and browsers would normalise ``/../`` away before sending.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conveyor.broker.metrics import GcPauses, LatencyHistogram
from conveyor.broker.server import Broker
from conveyor.broker.static import StaticFiles

from .conftest import WAIT, ClientFactory, http_get

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "conveyor" / "web"

TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


# --------------------------------------------------------------------------- static files


@pytest.fixture
def site(broker: Broker, tmp_path: Path) -> Iterator[dict[str, bytes]]:
    """A dashboard package of our own, served by the test's broker: its files by path."""
    name = f"dash_{uuid.uuid4().hex}"
    package = tmp_path / "pkgs" / name
    package.mkdir(parents=True)
    files = {
        "/index.html": b"<!doctype html><title>t</title><script src='app.js'></script>\n",
        "/app.js": b"document.title = 'x' + '<' + '/script>';\n",
        "/style.css": b"body { color: red }\n",
        "/logo.svg": b"<svg xmlns='http://www.w3.org/2000/svg'/>\n",
    }
    for path, content in files.items():
        (package / path.lstrip("/")).write_bytes(content)
    # Present in the package, but no dashboard file: never served.
    (package / "__init__.py").write_text("SECRET = 'do-not-serve'\n")
    (package / "secret.py").write_text("SECRET = 'do-not-serve'\n")
    (package / "notes.txt").write_text("do-not-serve\n")
    sys.path.insert(0, str(package.parent))
    try:
        broker.static = StaticFiles(package=name)
        yield files
    finally:
        sys.path.remove(str(package.parent))
        sys.modules.pop(name, None)


async def test_each_dashboard_file_has_its_type_revalidation_and_a_csp(
    broker: Broker, site: dict[str, bytes]
) -> None:
    for path, content in site.items():
        status, headers, body = await http_get(broker, path)
        assert status == 200, path
        assert body == content
        assert headers["content-type"] == TYPES[Path(path).suffix]
        # An upgraded broker's page shows on the next load: revalidated, never stale.
        assert headers["cache-control"] == "no-cache"
        assert headers["x-content-type-options"] == "nosniff"
        csp = headers["content-security-policy"]
        for rule in ("default-src 'self'", "script-src 'self'", "frame-ancestors 'none'"):
            assert rule in csp, (path, csp)
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp


async def test_root_and_a_query_string_serve_the_page(
    broker: Broker, site: dict[str, bytes]
) -> None:
    for target in ("/", "/?token=ignored", "/index.html?v=2"):
        status, headers, body = await http_get(broker, target)
        assert (status, body) == (200, site["/index.html"]), target
        assert headers["content-type"] == TYPES[".html"]


ESCAPES = [
    "/../etc/passwd",
    "/%2e%2e/etc/passwd",
    "/%2E%2E%2Fetc%2Fpasswd",
    "/..%2f..%2fetc/passwd",
    "/web/__init__.py",
    "/__init__.py",
    "/secret.py",
    "/notes.txt",
    "//etc/passwd",
    "/index.html/..",
    "/index.html%00.js",
    "/etc/passwd",
]


@pytest.mark.parametrize("target", ESCAPES)
async def test_no_path_reaches_anything_but_the_dashboard_files(
    broker: Broker, site: dict[str, bytes], target: str
) -> None:
    status, _headers, body = await http_get(broker, target)
    assert status == 404, target
    assert b"do-not-serve" not in body and b"root:" not in body


async def test_the_broker_serves_its_own_web_package_at_root(broker: Broker) -> None:
    web = resources.files("conveyor.web")
    status, headers, body = await http_get(broker, "/")
    assert status == 200
    assert headers["content-type"] == TYPES[".html"]
    assert body == web.joinpath("index.html").read_bytes()
    assert b"<script" in body  # the page loads its code: same-origin files, by the CSP
    for entry in WEB.iterdir():
        if entry.suffix in TYPES:
            status, headers, body = await http_get(broker, "/" + entry.name)
            assert status == 200, entry.name
            assert headers["content-type"] == TYPES[entry.suffix]
            assert body == entry.read_bytes()
    assert (await http_get(broker, "/__init__.py"))[0] == 404


async def test_health_and_metrics_are_live_data_never_cached(broker: Broker) -> None:
    status, headers, body = await http_get(broker, "/healthz")
    assert status == 200
    assert headers["cache-control"] == "no-store"
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["status"] == "ok"
    status, headers, _body = await http_get(broker, "/metrics")
    assert status == 200
    assert headers["cache-control"] == "no-store"
    assert headers["content-type"].startswith("text/plain; version=0.0.4")


# --------------------------------------------------------------------------- /metrics


async def scrape(broker: Broker) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``GET /metrics`` parsed as Prometheus text: every sample by (name, labels).

    Rendered afresh: these tests compare scrapes moments apart, inside the broker's
    one-second cache (which tests/server/test_metrics.py drives with a manual clock).
    """
    broker.metrics.max_age_s = 0.0
    status, _headers, body = await http_get(broker, "/metrics")
    assert status == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def sample(samples: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"{name}{labels} is not exported"
    return samples[key]


async def test_metrics_export_queue_gauges_counters_workers_and_push_latency(
    broker: Broker, client: ClientFactory
) -> None:
    publisher = await client()
    before = await scrape(broker)
    assert ("conveyor_push_latency_seconds_count", frozenset({("queue", "m")})) not in before
    reply = await publisher.call(
        "enqueue_batch", queue="m", jobs=[{"payload": i} for i in range(5)]
    )
    ids = reply["ids"]

    worker = await client()
    await worker.call("subscribe", worker_id="w", queues=["m"], prefetch=2)
    first, second = await worker.jobs(2)
    await worker.call("ack", id=first["id"], lease=first["lease"])
    [third] = await worker.jobs(1)
    await worker.call("retry", id=second["id"], lease=second["lease"], delay_s=3600)
    [fourth] = await worker.jobs(1)
    await worker.call("fail", id=third["id"], lease=third["lease"], error="boom")
    [fifth] = await worker.jobs(1)
    assert (await publisher.call("cancel", id=fourth["id"]))["cancelled"] is True
    await worker.next_push("cancelled")
    await publisher.call("pause", queue="m")
    # A job that expires before anyone takes it (any instant after its enqueue is late).
    await publisher.call("enqueue", queue="exp", payload=0, expires_s=1e-6)
    await publisher.call("sweep")

    samples = await scrape(broker)
    gauges = {
        state: sample(samples, "conveyor_queue_jobs", queue="m", state=state)
        for state in ("ready", "scheduled", "processing", "dead")
    }
    assert gauges == {"ready": 0, "scheduled": 1, "processing": 1, "dead": 1}
    assert fifth["id"] == ids[4]
    assert sample(samples, "conveyor_queue_paused", queue="m") == 1
    assert sample(samples, "conveyor_queue_paused", queue="exp") == 0
    counters = {
        name: sample(samples, f"conveyor_jobs_{name}_total", queue="m")
        for name in ("enqueued", "completed", "retried", "dead_lettered", "expired", "cancelled")
    }
    assert counters == {
        "enqueued": 5,
        "completed": 1,
        "retried": 1,
        "dead_lettered": 1,
        "expired": 0,
        "cancelled": 1,
    }
    assert sample(samples, "conveyor_jobs_expired_total", queue="exp") == 1
    assert sample(samples, "conveyor_workers_connected") == 1
    assert sample(samples, "conveyor_connections") == 2

    # Every push was timed, by its queue: five jobs handed out, five observations.
    assert sample(samples, "conveyor_push_latency_seconds_count", queue="m") == 5
    assert sample(samples, "conveyor_push_latency_seconds_bucket", queue="m", le="+Inf") == 5
    assert 0 <= sample(samples, "conveyor_push_latency_seconds_sum", queue="m") < 60
    assert ("conveyor_push_latency_seconds_count", frozenset({("queue", "exp")})) not in samples

    await worker.ws.close()
    # The worker's connection is gone once the broker has noticed (bounded wait).
    async with asyncio.timeout(WAIT):
        while sample(await scrape(broker), "conveyor_workers_connected") != 0:
            await publisher.call("ping")


# --------------------------------------------------------------------------- packaging


@pytest.mark.parametrize("many", [False, True], ids=["observe", "observe_many"])
def test_push_latency_histogram_buckets_are_cumulative_and_inclusive(many: bool) -> None:
    hist = LatencyHistogram(buckets=(0.001, 0.01))
    values = (-0.5, 0.0005, 0.001, 0.002, 0.01, 3.0)
    if many:  # what the dispatcher calls, once per push and queue
        hist.observe_many("q", values[:2])
        hist.observe_many("q", values[2:])
    else:
        for seconds in values:
            hist.observe("q", seconds)
    hist.observe("other", 7.0)  # counted under its own queue only
    [family] = hist.collect()
    got = {
        (s.name, s.labels.get("le")): s.value for s in family.samples if s.labels["queue"] == "q"
    }
    # "le" is inclusive: 0.001 counts in the 0.001 bucket; a negative time counts as 0.
    assert got[("conveyor_push_latency_seconds_bucket", "0.001")] == 3
    assert got[("conveyor_push_latency_seconds_bucket", "0.01")] == 5
    assert got[("conveyor_push_latency_seconds_bucket", "+Inf")] == 6
    assert got[("conveyor_push_latency_seconds_count", None)] == 6
    assert got[("conveyor_push_latency_seconds_sum", None)] == 0.0005 + 0.001 + 0.002 + 0.01 + 3.0


async def test_metrics_export_the_process_and_every_garbage_collection(broker: Broker) -> None:
    before = await scrape(broker)
    for generation in ("0", "1", "2"):  # every generation is there from the start
        sample(before, "conveyor_gc_pause_seconds_count", generation=generation)
    gc.collect(0)
    gc.collect(0)
    gc.collect(2)
    after = await scrape(broker)

    def grew(name: str, generation: str) -> float:
        return sample(after, name, generation=generation) - sample(
            before, name, generation=generation
        )

    # The broker runs in this process, so these collections are its own. (Others may
    # come due meanwhile: "at least".)
    assert grew("conveyor_gc_pause_seconds_count", "0") >= 2
    assert grew("conveyor_gc_pause_seconds_count", "2") >= 1
    assert grew("conveyor_gc_pause_seconds_sum", "2") > 0
    for generation in ("0", "1", "2"):
        count = sample(after, "conveyor_gc_pause_seconds_count", generation=generation)
        inf = sample(after, "conveyor_gc_pause_seconds_bucket", generation=generation, le="+Inf")
        assert inf == count
    assert grew("python_gc_collections_total", "2") >= 1

    # The process itself, from /proc at the scrape.
    assert sample(after, "process_resident_memory_bytes") > 10_000_000
    assert sample(after, "process_open_fds") >= 3
    assert sample(after, "process_cpu_seconds_total") > 0
    assert any(name == "python_info" for name, _ in after)


def test_gc_pauses_are_timed_per_generation_into_inclusive_buckets() -> None:
    now = [0.0]
    pauses = GcPauses(clock=lambda: now[0])
    for generation, seconds in ((0, 0.00005), (0, 0.0001), (2, 0.3)):
        now[0] = 0.0
        pauses.on_gc("start", {"generation": generation})
        now[0] = seconds
        pauses.on_gc("stop", {"generation": generation, "collected": 0, "uncollectable": 0})
    [family] = pauses.collect()
    got = {(s.name, s.labels["generation"], s.labels.get("le")): s.value for s in family.samples}
    assert got[("conveyor_gc_pause_seconds_bucket", "0", "0.0001")] == 2  # "le": inclusive
    assert got[("conveyor_gc_pause_seconds_count", "0", None)] == 2
    assert got[("conveyor_gc_pause_seconds_bucket", "2", "0.25")] == 0
    assert got[("conveyor_gc_pause_seconds_bucket", "2", "0.5")] == 1
    assert got[("conveyor_gc_pause_seconds_sum", "2", None)] == pytest.approx(0.3)
    assert got[("conveyor_gc_pause_seconds_count", "1", None)] == 0


async def test_job_durations_count_each_landed_report_by_outcome(
    broker: Broker, client: ClientFactory
) -> None:
    publisher = await client()
    for i in range(3):
        await publisher.call("enqueue", queue="dur", payload=i)
    worker = await client()
    await worker.call("subscribe", worker_id="w", queues=["dur"], prefetch=3)
    first, second, third = await worker.jobs(3)
    await worker.call("ack_batch", items=[{"id": first["id"], "lease": first["lease"]}])
    await worker.call("retry", id=second["id"], lease=second["lease"], delay_s=3600)
    await worker.call("fail", id=third["id"], lease=third["lease"])
    # A report that does not land (the lease is used up) is not counted.
    await worker.call("ack", id=first["id"], lease=first["lease"])
    got = await scrape(broker)
    for outcome in ("ok", "retry", "dead"):
        count = sample(got, "conveyor_job_duration_seconds_count", queue="dur", outcome=outcome)
        assert count == 1, outcome
    assert sample(got, "conveyor_queue_oldest_ready_age_seconds", queue="dur") == 0.0
