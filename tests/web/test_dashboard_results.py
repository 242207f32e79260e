"""A completed job's result on the dashboard, in headless Chromium against a real broker
(conftest.py): the job view shows it as indented JSON text (markup in it stays text),
and the job browser lists the completed jobs a queue keeps."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

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


async def test_a_completed_jobs_result_shows_in_the_job_view(broker: Broker, tab: Tab) -> None:
    page = await open_dashboard(tab, broker)
    script = "<script>window.__pwned=1</script>"
    worker = Worker(broker.url, queues=[], shutdown_timeout_s=1.0)

    @worker.handler(KEPT)
    async def build(job: Job) -> dict[str, Any]:
        return {"pages": job.payload["pages"], "title": script}

    async with Client(broker.url) as client:
        job_id = await client.enqueue(KEPT, {"pages": 12})
        async with working(worker):
            result = await asyncio.wait_for(client.result(job_id), WAIT)
        assert result == {"pages": 12, "title": script}

        await page.get_by_test_id("job-input").fill(job_id)
        await page.get_by_test_id("job-submit").click()
        view = page.get_by_test_id("job-view")
        await expect(view).to_have_attribute("data-state", "completed")
        shown = view.locator('[data-field="result"] pre')
        await expect(shown).to_have_text('{\n  "pages": 12,\n  "title": "' + script + '"\n}')
        await expect(view.locator('[data-field="completed_at"] dd')).not_to_have_text("—")
        await expect(view.locator('[data-field="state"] dd')).to_have_text("completed")

        # The job browser's Completed tab lists it.
        await page.get_by_test_id(f"open-queue-{KEPT}").click()
        completed = page.get_by_test_id("jobs-tab-completed")
        await expect(completed.locator('[data-field="count"]')).to_have_text("1")
        await completed.click()
        await expect(page.get_by_test_id(f"job-row-{job_id}")).to_be_visible()

    await expect(page.locator("main script")).to_have_count(0)
    assert await page.evaluate("window.__pwned") is None
    assert tab.seen.errors == []


async def test_a_job_not_completed_shows_no_result_field(broker: Broker, tab: Tab) -> None:
    page = await open_dashboard(tab, broker)
    async with Client(broker.url) as client:
        job_id = await client.enqueue(KEPT, {"pages": 1})
        await page.get_by_test_id("job-input").fill(job_id)
        await page.get_by_test_id("job-submit").click()
        view = page.get_by_test_id("job-view")
        await expect(view).to_have_attribute("data-state", "ready")
        await expect(view.locator('[data-field="payload"]')).to_have_count(1)
        await expect(view.locator('[data-field="result"]')).to_have_count(0)
        await expect(view.locator('[data-field="completed_at"]')).to_have_count(0)
    assert tab.seen.errors == []
