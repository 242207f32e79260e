"""A queue's latency on the dashboard: the age of its oldest ready job, from the broker's
own stats, in headless Chromium against a real broker whose clock the test moves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from conveyor.broker.config import Config
from conveyor.broker.scheduler import SteppedScheduler
from conveyor.broker.server import Broker, running_broker
from conveyor.sdk import Client

from .conftest import LOOP, Tab, open_dashboard, skip_without_browser

skip_without_browser()

from playwright.async_api import Page, expect  # noqa: E402 (once known here)

pytestmark = pytest.mark.asyncio(loop_scope=LOOP)


@pytest.fixture
def clock() -> SteppedScheduler:
    return SteppedScheduler()


@pytest_asyncio.fixture(loop_scope=LOOP)
async def broker(config: Config, clock: SteppedScheduler) -> AsyncIterator[Broker]:
    async with running_broker(config, scheduler=clock) as running:
        yield running


def cell(page: Page, queue: str, field: str) -> Any:
    return page.get_by_test_id(f"queue-row-{queue}").locator(f'[data-field="{field}"]')


async def test_the_oldest_ready_column_shows_how_long_the_oldest_ready_job_has_waited(
    broker: Broker, tab: Tab, clock: SteppedScheduler
) -> None:
    page = await open_dashboard(tab, broker)
    async with Client(broker.url) as client:
        first = await client.enqueue("late", "first")
        clock.advance(65)
        second = await client.enqueue("late", "second")  # (the oldest one counts, not the newest)
        await client.enqueue("early", "later", delay_s=3600)
        clock.advance(60)
        await expect(cell(page, "late", "oldest_ready")).to_have_text("2 min")
        await expect(cell(page, "early", "oldest_ready")).to_have_text("\N{EN DASH}")
        await page.get_by_test_id("open-queue-late").click()
        summary = page.get_by_test_id("queue-detail-summary")
        await expect(summary.locator('[data-field="oldest_ready"] dd')).to_have_text("2 min")
        # The oldest gone, the next one's wait shows; nothing ready, no latency at all.
        assert await client.cancel(first)
        await expect(cell(page, "late", "oldest_ready")).to_have_text("1 min")
        assert await client.cancel(second)
        await expect(cell(page, "late", "oldest_ready")).to_have_text("\N{EN DASH}")
    assert tab.seen.errors == []
