"""A running job's progress on the dashboard, in headless Chromium against a real broker
(conftest.py): the job view draws a bar for a fraction and shows the handler's message,
follows each new value live, and keeps the last one beside the result once the job has
completed. Values are set as text (markup in a message stays text)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from conveyor.broker.config import Config
from conveyor.broker.engine import QueueOpts
from conveyor.broker.server import Broker
from conveyor.sdk import Client, Job, Worker

from .conftest import BASE, LOOP, WAIT, Tab, open_dashboard, skip_without_browser, working

skip_without_browser()

from playwright.async_api import expect  # noqa: E402 (once known here)

pytestmark = pytest.mark.asyncio(loop_scope=LOOP)

KEPT = "reports"


@pytest.fixture
def config() -> Config:
    return replace(BASE, queue_opts={KEPT: QueueOpts(completed_retention_s=3600.0)})


async def test_a_running_jobs_progress_bar_follows_it_then_the_result_shows(
    broker: Broker, tab: Tab
) -> None:
    page = await open_dashboard(tab, broker)
    worker = Worker(broker.url, queues=[], shutdown_timeout_s=1.0, progress_interval_s=0.01)
    steps = [asyncio.Event() for _ in range(3)]
    script = "<b>bold</b>"

    @worker.handler(KEPT)
    async def build(job: Job) -> dict[str, int]:
        await job.progress(0.25, f"step 1 of 3 {script}")
        await steps[0].wait()
        await job.progress(0.75, "step 2 of 3")
        await steps[1].wait()
        return {"pages": 12}

    async with Client(broker.url) as client:
        job_id = await client.enqueue(KEPT, {"pages": 12})
        await page.get_by_test_id("job-input").fill(job_id)
        await page.get_by_test_id("job-submit").click()
        view = page.get_by_test_id("job-view")
        async with working(worker):
            await expect(view).to_have_attribute("data-state", "processing")
            bar = view.get_by_test_id("job-progress")
            label = view.get_by_test_id("job-progress-label")
            await expect(label).to_have_text(f"25% step 1 of 3 {script}")
            assert await bar.evaluate("node => node.value") == 0.25
            steps[0].set()
            await expect(label).to_have_text("75% step 2 of 3")
            assert await bar.evaluate("node => node.value") == 0.75
            steps[1].set()
            assert await asyncio.wait_for(client.result(job_id), WAIT) == {"pages": 12}
            await expect(view).to_have_attribute("data-state", "completed")
        await expect(view.locator('[data-field="result"] pre')).to_have_text('{\n  "pages": 12\n}')
        await expect(label).to_have_text("75% step 2 of 3")  # the last value, kept
    await expect(view.locator("b")).to_have_count(0)
    assert tab.seen.errors == []


async def test_a_job_that_reported_nothing_shows_no_progress(broker: Broker, tab: Tab) -> None:
    page = await open_dashboard(tab, broker)
    async with Client(broker.url) as client:
        job_id = await client.enqueue(KEPT, {"pages": 1})
        await page.get_by_test_id("job-input").fill(job_id)
        await page.get_by_test_id("job-submit").click()
        view = page.get_by_test_id("job-view")
        await expect(view).to_have_attribute("data-state", "ready")
        await expect(view.locator('[data-field="progress"]')).to_have_count(0)
    assert tab.seen.errors == []
