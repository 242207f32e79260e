"""The crash test: SIGKILL a loaded durable broker, restart it, lose nothing.

A real ``conveyor serve --store sqlite`` process on a fixed port takes enqueues from SDK
publishers and pushes jobs to SDK workers; it is killed with SIGKILL at seeded random
moments (after a random number of answered enqueues or handled jobs since the last
restart; a third of the time with the handlers held up meanwhile, so that the kill finds
answered jobs waiting in the broker) and restarted on the same port, and the SDK clients
reconnect by themselves.
The scenario is ``scripts/crash_soak.py`` (whose 100-kill run is the long version),
with a few kills here. Every wait in it is bounded and driven by events.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_scenario() -> ModuleType:
    path = ROOT / "scripts" / "crash_soak.py"
    spec = importlib.util.spec_from_file_location("crash_soak", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


crash_soak = _load_scenario()


@pytest.mark.parametrize("sync", ["full", "normal"])
async def test_sigkill_under_load_loses_no_answered_job(tmp_path: Path, sync: str) -> None:
    settings = crash_soak.Settings(
        db=tmp_path / "x.db",
        sync=sync,
        kills=6,
        seed=6,
        step_timeout_s=12.0,  # any one awaited event; the whole test stays under a minute
        budget_s=30.0,
        max_events=150,
        log=tmp_path / "broker.log",
    )
    result = await crash_soak.run(settings)
    print(result.summary())  # shown with -s, and with the failure report below

    kills = result.kills
    assert kills == settings.kills, result.summary()
    assert result.answered > 0 and result.handled >= result.answered, result.summary()
    # Every enqueue the broker answered was handled at least once...
    assert result.lost == [], result.summary()
    # ...and nothing was handled that no publisher sent.
    assert result.unknown == [], result.summary()
    # Repeats come only from jobs in flight at the kills: a job held by a worker whose
    # lease lapsed before it re-attached (at most workers x prefetch per kill), or an
    # enqueue whose reply the kill swallowed and whose first job was done before the
    # resend arrived (its idempotency key went with it: at most the enqueues in flight).
    assert result.redeliveries <= kills * settings.workers * settings.prefetch, result.summary()
    in_flight = settings.workers * settings.prefetch + settings.publishers * settings.concurrency
    assert result.duplicates <= kills * in_flight, result.summary()
    # After a clean final restart the broker holds nothing and completed all it stored.
    assert result.problems == [], result.summary()
    final = result.final_stats
    assert (final["ready"], final["scheduled"], final["processing"], final["dead"]) == (0,) * 4
    assert final["totals"]["completed"] == final["totals"]["enqueued"] >= result.answered
