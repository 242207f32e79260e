"""Dependencies on the dashboard, in headless Chromium against a real broker
(conftest.py): the job browser's Waiting tab counts and lists the jobs waiting for their
dependencies, and the job view shows a job's dependencies as links to follow and how
many it still waits for (docs/contract.md, DEP-1)."""

from __future__ import annotations

import pytest

from conveyor.broker.server import Broker
from conveyor.sdk import Client

from .conftest import LOOP, Tab, open_dashboard, skip_without_browser

skip_without_browser()

from playwright.async_api import expect  # noqa: E402 (once known here)

pytestmark = pytest.mark.asyncio(loop_scope=LOOP)


async def test_waiting_jobs_have_a_tab_and_show_their_dependencies(
    broker: Broker, tab: Tab
) -> None:
    page = await open_dashboard(tab, broker)
    async with Client(broker.url) as client:
        first = await client.enqueue("etl", {"step": "extract"}, delay_s=600)
        second = await client.enqueue("etl", {"step": "clean"})
        load = await client.enqueue("etl", {"step": "load"}, after=[first, second])
        plain = await client.enqueue("etl", {"step": "alone"})

        await page.get_by_test_id("open-queue-etl").click()
        waiting = page.get_by_test_id("jobs-tab-waiting")
        await expect(waiting.locator('[data-field="count"]')).to_have_text("1")
        await waiting.click()
        await expect(page.get_by_test_id(f"job-row-{load}")).to_be_visible()
        await expect(page.get_by_test_id(f"job-row-{plain}")).to_have_count(0)

        await page.get_by_test_id("job-input").fill(load)
        await page.get_by_test_id("job-submit").click()
        view = page.get_by_test_id("job-view")
        await expect(view).to_have_attribute("data-state", "waiting")
        await expect(view.locator('[data-field="waiting_for"] dd')).to_have_text("2")
        links = view.locator('[data-field="after"] button')
        await expect(links).to_have_text([first, second])

        # A dependency's link follows it; a job with none shows no such fields.
        await links.nth(1).click()
        await expect(page.get_by_test_id("job-input")).to_have_value(second)
        await expect(view).to_have_attribute("data-state", "ready")
        await expect(view.locator('[data-field="after"]')).to_have_count(0)
        await expect(view.locator('[data-field="waiting_for"]')).to_have_count(0)
    assert tab.seen.errors == []
