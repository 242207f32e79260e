"""The dashboard's Schedules card, in headless Chromium against a real broker (see
conftest.py).

Each schedule's row shows its timing in words, its next and last fire as local times with
how far they are, its last job (a link that follows it in Job lookup) and whether it is
paused; with the admin role its buttons pause, resume, run now and delete (after a
confirm) through the schedule ops; a read-only viewer sees the rows and no button; what
the broker sends is shown as text; the card fits a 420 px window.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from conveyor.broker.server import Broker
from conveyor.sdk import Client
from conveyor.sdk._wire import Role

from .conftest import BASE, LOOP, Tab, open_dashboard, skip_without_browser

skip_without_browser()

from playwright.async_api import Browser, Locator, Page, expect  # noqa: E402 (once known here)

pytestmark = pytest.mark.asyncio(loop_scope=LOOP)

ADMIN = "admin-secret"
READER = "read-secret"
TOKENS = replace(BASE, tokens={ADMIN: frozenset({Role.ADMIN}), READER: frozenset({Role.READ})})
with_tokens = pytest.mark.parametrize("config", [TOKENS])

DASH = "\N{EN DASH}"  # an empty time, and the pager's range ("1 to 100")
# A time of today (or a date and time on another day), then how far it is.
CLOCK = r"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d"


def cell(page: Page, schedule_id: str, field: str) -> Locator:
    return page.get_by_test_id(f"schedule-row-{schedule_id}").locator(f'[data-field="{field}"]')


async def test_the_card_shows_timing_next_and_last_fire_and_follows_the_last_job(
    broker: Broker, tab: Tab
) -> None:
    async with Client(broker.url) as client:
        await client.set_schedule("hourly-sync", "sync", {"full": False}, every_s=3600)
        await client.set_schedule("nightly-report", "reports", cron="30 2 * * *", tz="Europe/Paris")
        job_id = await client.run_schedule("hourly-sync")
        assert job_id is not None
        page = await open_dashboard(tab, broker)
        await expect(page.locator('[data-testid^="schedule-row-"]')).to_have_count(2)
        await expect(cell(page, "hourly-sync", "timing")).to_have_text("every 1 h")
        await expect(cell(page, "nightly-report", "timing")).to_have_text(
            "cron 30 2 * * * (Europe/Paris)"
        )
        await expect(cell(page, "hourly-sync", "next_at")).to_have_text(
            re.compile(rf"^{CLOCK} \(in \d+ (s|min|h 0 min)\)$")  # the next whole hour
        )
        await expect(cell(page, "hourly-sync", "last_at")).to_have_text(
            re.compile(rf"^{CLOCK} \((now|\d+ s ago)\)$")
        )
        await expect(cell(page, "nightly-report", "last_at")).to_have_text(DASH)
        await expect(cell(page, "hourly-sync", "fired")).to_have_text("1")
        await expect(cell(page, "hourly-sync", "state")).to_have_text("active")
        await expect(cell(page, "hourly-sync", "payload")).to_have_text('{"full":false}')
        await cell(page, "hourly-sync", "last_job").get_by_role("button").click()
        await expect(page.get_by_test_id("job-input")).to_have_value(job_id)
        await expect(page.get_by_test_id("schedules-count")).to_have_text("2 schedules")
    assert tab.seen.errors == []


async def test_an_admin_pauses_resumes_runs_and_deletes(broker: Broker, tab: Tab) -> None:
    async with Client(broker.url) as client:
        await client.set_schedule("cleanup", "maint", every_s=300)
        page = await open_dashboard(tab, broker)
        await page.get_by_test_id("schedule-pause-cleanup").click()
        await expect(cell(page, "cleanup", "state")).to_have_text("paused")
        await expect(cell(page, "cleanup", "next_at")).to_have_text(DASH)
        info = await client.get_schedule("cleanup")
        assert info is not None and info.paused

        await page.get_by_test_id("schedule-resume-cleanup").click()
        await expect(cell(page, "cleanup", "state")).to_have_text("active")
        await expect(page.get_by_test_id("schedule-pause-cleanup")).to_be_visible()

        await page.get_by_test_id("schedule-run-cleanup").click()
        await expect(cell(page, "cleanup", "fired")).to_have_text("1")
        info = await client.get_schedule("cleanup")
        assert info is not None and info.last_job is not None
        await expect(cell(page, "cleanup", "last_job")).to_have_text(info.last_job)
        assert (await client.stats("maint"))["maint"]["ready"] == 1

        tab.seen.confirm = False  # a dismissed confirm deletes nothing
        await page.get_by_test_id("schedule-delete-cleanup").click()
        await expect(page.get_by_test_id("schedule-row-cleanup")).to_be_visible()
        assert len(tab.seen.dialogs) == 1
        assert await client.get_schedule("cleanup") is not None
        tab.seen.confirm = True
        await page.get_by_test_id("schedule-delete-cleanup").click()
        await expect(page.get_by_test_id("schedule-row-cleanup")).to_have_count(0)
        await expect(page.get_by_test_id("schedules-empty")).to_be_visible()
        assert await client.get_schedule("cleanup") is None
        assert any("Delete schedule cleanup?" in d for d in tab.seen.dialogs)
    assert tab.seen.errors == []


@with_tokens
async def test_a_read_only_viewer_sees_the_schedules_and_no_buttons(
    broker: Broker, tab: Tab
) -> None:
    async with Client(broker.url, ADMIN) as client:
        await client.set_schedule("cleanup", "maint", every_s=300)
    page = await open_dashboard(tab, broker, READER)
    await expect(cell(page, "cleanup", "timing")).to_have_text("every 5 min")
    await expect(page.get_by_test_id("schedule-row-cleanup").get_by_role("button")).to_have_count(0)
    for action in ("pause", "resume", "run", "delete"):
        await expect(page.get_by_test_id(f"schedule-{action}-cleanup")).to_have_count(0)
    assert tab.seen.errors == []


async def test_markup_in_a_payload_is_shown_as_text(broker: Broker, tab: Tab) -> None:
    markup = '<img src=x onerror="window.pwned=1"><b>bold</b>'
    async with Client(broker.url) as client:
        await client.set_schedule("html:test", "q-html", {"note": markup}, every_s=60)
    page = await open_dashboard(tab, broker)
    payload = cell(page, "html:test", "payload")
    await expect(payload).to_contain_text("<img src=x")
    await expect(page.get_by_test_id("schedules-body").locator("img, b")).to_have_count(0)
    assert await page.evaluate("window.pwned") is None
    assert tab.seen.errors == []


async def test_more_than_a_page_of_schedules_is_paged(broker: Broker, tab: Tab) -> None:
    async with Client(broker.url) as client:
        for n in range(105):
            await client.set_schedule(f"s{n:03}", "many", every_s=3600)
    page = await open_dashboard(tab, broker)
    rows = page.locator('[data-testid^="schedule-row-"]')
    await expect(rows).to_have_count(100)
    await expect(page.get_by_test_id("schedules-range")).to_have_text(f"1{DASH}100")
    await page.get_by_test_id("schedules-next").click()
    await expect(rows).to_have_count(5)
    await expect(page.get_by_test_id("schedule-row-s104")).to_be_visible()
    await expect(page.get_by_test_id("schedules-range")).to_have_text(f"101{DASH}105")
    await page.get_by_test_id("schedules-prev").click()
    await expect(page.get_by_test_id("schedule-row-s000")).to_be_visible()


async def test_the_card_fits_a_420_px_window(broker: Broker, browser: Browser) -> None:
    async with Client(broker.url) as client:
        await client.set_schedule(
            "a-schedule-with-a-rather-long-name", "reports", {"x": "y" * 300}, cron="@daily"
        )
    context = await browser.new_context(viewport={"width": 420, "height": 800})
    try:
        page = await context.new_page()
        await page.goto(f"{broker.url.rsplit('/ws', 1)[0].replace('ws://', 'http://')}/")
        await expect(page.get_by_test_id("conn-state")).to_have_attribute("data-state", "live")
        await expect(
            page.get_by_test_id("schedule-row-a-schedule-with-a-rather-long-name")
        ).to_be_visible()
        sizes = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert sizes[0] <= sizes[1] == 420
        table = page.get_by_test_id("schedules-table")
        box = await table.bounding_box()
        assert box is not None and 0 <= box["x"] < 420
        card = page.get_by_test_id("schedules-panel")
        card_box = await card.bounding_box()
        assert card_box is not None and card_box["x"] + card_box["width"] <= 420
    finally:
        await context.close()


async def test_the_card_follows_the_brokers_own_ticks(broker: Broker, tab: Tab) -> None:
    # No action on the page: the card asks for its page again by itself (every 3 s while
    # visible), so the jobs the broker's ticks make show up.
    async with Client(broker.url) as client:
        await client.set_schedule("every-second", "beats", every_s=1)
        page = await open_dashboard(tab, broker)
        fired = cell(page, "every-second", "fired")
        await expect(fired).to_have_text(re.compile(r"^[0-9]$"))
        shown = int(await fired.inner_text())
        await expect(fired).not_to_have_text(str(shown), timeout=8000)
        await expect(cell(page, "every-second", "last_job")).not_to_have_text(DASH)
    assert tab.seen.errors == []
