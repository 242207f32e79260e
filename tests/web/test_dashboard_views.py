"""The dashboard's views of one worker and one queue, and its layout on a phone and a
desktop, in headless Chromium against a real broker (see conftest.py).

A worker's card lists the jobs it holds now, each with how long it has run; a queue's
row and card show its oldest ready job's age and its last hour of throughput; at 420 px
and 1400 px nothing is wider than the window and the key parts are on screen.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from conveyor.broker.server import Broker
from conveyor.sdk import Client, Fail, Job, Worker

from .conftest import (
    LOOP,
    WAIT,
    WAIT_MS,
    Tab,
    open_dashboard,
    page_url,
    skip_without_browser,
    working,
)

skip_without_browser()

from playwright.async_api import Browser, Page, expect  # noqa: E402 (once known here)

pytestmark = pytest.mark.asyncio(loop_scope=LOOP)


def cell(page: Page, queue: str, field: str) -> Any:
    return page.get_by_test_id(f"queue-row-{queue}").locator(f'[data-field="{field}"]')


# -- one worker -----------------------------------------------------------------------------


async def test_a_workers_card_lists_the_jobs_it_holds_with_how_long_each_has_run(
    broker: Broker, tab: Tab
) -> None:
    page = await open_dashboard(tab, broker)
    release = asyncio.Event()
    started = asyncio.Event()
    worker = Worker(broker.url, queues=[], worker_id="w-busy", prefetch=2, shutdown_timeout_s=1.0)

    @worker.handler("videos")
    async def transcode(job: Job) -> None:
        started.set()
        await release.wait()

    async with Client(broker.url) as client:
        ids = await client.enqueue_many("videos", [{"n": 1}, {"n": 2}, {"n": 3}])
        async with working(worker):
            await asyncio.wait_for(started.wait(), WAIT)
            row = page.get_by_test_id("worker-row-w-busy")
            await expect(row.locator('[data-field="oldest"]')).to_have_text(re.compile(r"^\d+ s$"))
            await row.get_by_test_id("open-worker-w-busy").click()
            card = page.get_by_test_id("worker-detail")
            await expect(card).to_be_visible()
            await expect(page.get_by_test_id("worker-detail-id")).to_have_text("w-busy")
            await expect(page.get_by_test_id("worker-detail-count")).to_have_text("2 in hand")
            held = page.locator('[data-testid^="held-row-"]')
            await expect(held).to_have_count(2)
            # The two it took first, oldest first (it holds two of the three: prefetch 2).
            assert [await r.get_attribute("data-job") for r in await held.all()] == ids[:2]
            first = page.get_by_test_id(f"held-row-{ids[0]}")
            await expect(first.locator('[data-field="queue"]')).to_have_text("videos")
            await expect(first.locator('[data-field="attempt"]')).to_have_text("1")
            await expect(first.locator('[data-field="since"]')).to_have_text(
                re.compile(r"^\d\d:\d\d:\d\d$")
            )
            # Running for counts up, live: 0 s, then 1 s.
            running = first.locator('[data-field="running_for"]')
            await expect(running).to_have_text(re.compile(r"^\d+ s$"))
            await expect(running).not_to_have_text("0 s", timeout=WAIT_MS)

            # A held job opens in the job view.
            await first.locator('[data-field="id"] button').click()
            await expect(page.get_by_test_id("job-view")).to_have_attribute(
                "data-state", "processing"
            )

            release.set()
            # Done with those, it takes the third, then holds nothing.
            await expect(page.get_by_test_id("worker-detail-note")).to_have_text(
                "It holds no jobs now."
            )
            await expect(page.get_by_test_id("held-table")).to_be_hidden()
        await expect(card).to_have_attribute("data-state", "gone")
        await expect(page.get_by_test_id("worker-detail-note")).to_contain_text("not connected")
    await page.get_by_test_id("worker-detail-close").click()
    await expect(card).to_be_hidden()
    assert tab.seen.errors == []


# -- one queue ------------------------------------------------------------------------------


async def test_a_queues_last_hour_shows_completed_and_failed_in_its_row_and_card(
    broker: Broker, tab: Tab
) -> None:
    page = await open_dashboard(tab, broker)
    worker = Worker(broker.url, queues=[], worker_id="w-hour", prefetch=4, shutdown_timeout_s=1.0)

    @worker.handler("mail")
    async def send(job: Job) -> None:
        if job.payload == "bad":
            raise Fail("bounced")

    async with Client(broker.url) as client:
        await client.enqueue("mail", "first")
        # The feed has sampled the queue before the traffic it counts.
        await expect(cell(page, "mail", "ready")).to_have_text("1")
        async with working(worker):
            await client.enqueue_many("mail", ["ok", "ok", "ok"])
            await client.enqueue("mail", "bad", max_attempts=1)
            await expect(cell(page, "mail", "dead")).to_have_text("1")
            await expect(page.get_by_test_id("hour-total-mail")).to_have_text(
                "4 · 1 failed", timeout=WAIT_MS
            )
    bars = cell(page, "mail", "last_hour").locator("rect.bar.completed:not([height='0.00'])")
    await expect(bars).not_to_have_count(0)
    # The rates are over the last minute: the burst still shows seconds later.
    await expect(cell(page, "mail", "rate_completed")).not_to_have_text("0")

    await page.get_by_test_id("open-queue-mail").click()
    card = page.get_by_test_id("queue-detail")
    await expect(card).to_be_visible()
    await expect(page.get_by_test_id("queue-detail-name")).to_have_text("mail")
    await expect(page.get_by_test_id("queue-hour-total")).to_have_text("4 completed, 1 failed")
    summary = page.get_by_test_id("queue-detail-summary")
    await expect(summary.locator('[data-field="dead"] dd')).to_have_text("1")
    await expect(summary.locator('[data-field="completed"] dd')).to_have_text("4")  # all time
    failed = page.get_by_test_id("queue-hour-chart").locator("rect.bar.failed:not([height='0.00'])")
    await expect(failed).to_have_count(1)
    await page.get_by_test_id("queue-detail-close").click()
    await expect(card).to_be_hidden()
    assert tab.seen.errors == []


# -- layout ---------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [420, 1400])
async def test_nothing_is_wider_than_the_window_and_the_key_parts_are_on_screen(
    broker: Broker, browser: Browser, width: int
) -> None:
    release = asyncio.Event()
    worker = Worker(
        broker.url, queues=[], worker_id="worker-with-a-long-name-0123456789", prefetch=2
    )

    @worker.handler("a-queue-with-a-rather-long-name")
    async def hold(job: Job) -> None:
        await release.wait()

    context = await browser.new_context(viewport={"width": width, "height": 800})
    try:
        page = await context.new_page()
        await page.goto(page_url(broker))
        await expect(page.get_by_test_id("conn-state")).to_have_attribute("data-state", "live")
        async with Client(broker.url) as client, working(worker):
            await client.enqueue_many("a-queue-with-a-rather-long-name", [1, 2, 3])
            await client.enqueue_many("other", [{"payload": "x" * 300}])
            await client.pause("other")
            name = "worker-with-a-long-name-0123456789"
            await page.get_by_test_id(f"open-worker-{name}").click()
            await expect(page.locator('[data-testid^="held-row-"]')).to_have_count(2)
            await page.get_by_test_id("open-queue-other").click()
            await page.get_by_test_id("job-input").fill("no-such-job-" + "x" * 60)
            await page.get_by_test_id("job-submit").click()
            await expect(page.get_by_test_id("job-gone")).to_be_visible()
            await page.evaluate("window.scrollTo(0, 0)")

            sizes = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            assert sizes[0] <= sizes[1] == width
            for test_id in (
                "conn-state",
                "server-version",
                "server-connections",
                "queues-table",
                "workers-table",
                "queue-detail-close",
                "worker-detail-close",
                "job-submit",
            ):
                await assert_on_screen(page, test_id, width)
            if width < 1000:  # the queues table cannot fit: it scrolls inside its card
                table = page.get_by_test_id("queues-table")
                hidden = await table.evaluate(
                    "t => t.parentElement.scrollWidth - t.parentElement.clientWidth"
                )
                assert hidden > 0
            release.set()
    finally:
        await context.close()


async def assert_on_screen(page: Page, test_id: str, width: int) -> None:
    """The element is visible and starts within the window's width (its left edge and,
    unless it is a table that scrolls in its card, its right edge)."""
    node = page.get_by_test_id(test_id)
    await expect(node).to_be_visible()
    box = await node.bounding_box()
    assert box is not None, test_id
    assert 0 <= box["x"] < width, (test_id, box)
    if not test_id.endswith("-table"):
        assert box["x"] + box["width"] <= width, (test_id, box)
