"""The queue card's job browser in headless Chromium against a real broker (conftest.py).

An operator opens a queue and browses its jobs by state, page by page (the broker's
keyset cursors, a stack of them for "previous"), searches them by id, key or payload
text, cancels the jobs selected and redrives all dead ones (admin only, after a
confirm); the open page follows the feed's counts; at 420 px the table scrolls inside
its card.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

import pytest

from conveyor.broker.server import Broker
from conveyor.sdk import Client, Fail, Job, Worker
from conveyor.sdk._wire import Role

from .conftest import BASE, LOOP, WAIT, Tab, open_dashboard, skip_without_browser, working

skip_without_browser()

from playwright.async_api import Locator, Page, expect  # noqa: E402 (once known here)

pytestmark = pytest.mark.asyncio(loop_scope=LOOP)

ADMIN = "admin-secret"
READER = "read-secret"
APP = "app-secret"
TOKENS = replace(
    BASE,
    tokens={
        ADMIN: frozenset({Role.ADMIN}),
        READER: frozenset({Role.READ}),
        APP: frozenset({Role.PUBLISH, Role.WORK}),
    },
)
DASH = "\N{EN DASH}"
PAGE = 20  # the browser's page size
# A time of today, or a date and time for another day (a job due in an hour is due
# tomorrow when the test runs in the day's last hour).
TIME = re.compile(r"^(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d$")


def rows(page: Page) -> Locator:
    return page.get_by_test_id("jobs-body").locator("tr")


async def row_ids(page: Page) -> list[str]:
    return [str(await r.get_attribute("data-job")) for r in await rows(page).all()]


async def open_queue(page: Page, queue: str) -> None:
    await page.get_by_test_id(f"open-queue-{queue}").click()
    await expect(page.get_by_test_id("jobs-panel")).to_be_visible()


async def show_state(page: Page, state: str, count: int) -> None:
    """Open the ``state`` tab, whose count reads ``count``, and wait for its first page."""
    tab = page.get_by_test_id(f"jobs-tab-{state}")
    await expect(tab.locator('[data-field="count"]')).to_have_text(str(count))
    await tab.click()
    await expect(tab).to_have_attribute("aria-selected", "true")
    await expect(rows(page)).to_have_count(min(count, PAGE))


async def dead_jobs(
    client: Client, broker: Broker, queue: str, payloads: list[object]
) -> list[str]:
    """Enqueue ``payloads`` to ``queue`` (one attempt each) and have a worker fail them all;
    return their ids once all are dead."""
    worker = Worker(broker.url, queues=[], prefetch=32, shutdown_timeout_s=1.0)
    failed = 0
    all_failed = asyncio.Event()

    @worker.handler(queue)
    async def fail(job: Job) -> None:
        nonlocal failed
        failed += 1
        if failed == len(payloads):
            all_failed.set()
        raise Fail(f"boom {job.payload}")

    ids = await client.enqueue_many(queue, payloads, max_attempts=1)
    async with working(worker):  # stopping waits until the broker answered the fails
        await asyncio.wait_for(all_failed.wait(), WAIT)
    return ids


async def test_each_state_is_browsed_page_by_page_forward_and_back(
    broker: Broker, tab: Tab
) -> None:
    page = await open_dashboard(tab, broker)
    release = asyncio.Event()
    held = 0
    all_held = asyncio.Event()
    worker = Worker(broker.url, queues=[], prefetch=22, shutdown_timeout_s=1.0)

    @worker.handler("work")
    async def hold(job: Job) -> None:
        nonlocal held
        held += 1
        if held == 22:
            all_held.set()
        await release.wait()

    async with Client(broker.url) as client:
        dead = await dead_jobs(client, broker, "work", [{"n": n} for n in range(21)])
        async with working(worker):
            processing = await client.enqueue_many("work", [{"hold": n} for n in range(22)])
            await asyncio.wait_for(all_held.wait(), WAIT)
            # Ready in claim order: the high-priority ones first.
            low = await client.enqueue_many("work", [{"ready": n} for n in range(20)])
            high = await client.enqueue_many("work", [{"urgent": n} for n in range(5)], priority=5)
            scheduled = await client.enqueue_many(
                "work", [{"later": n} for n in range(23)], delay_s=3600
            )
            await open_queue(page, "work")
            expected = {
                "ready": high + low,
                "scheduled": scheduled,
                "processing": processing,
                # The latest death first.
                "dead": None,
            }
            heads = {
                "ready": "Ready since",
                "scheduled": "Due at",
                "processing": "Running since",
                "dead": "Died at",
            }
            for state, ids in expected.items():
                total = 21 if ids is None else len(ids)
                await show_state(page, state, total)
                await expect(page.get_by_test_id("jobs-time-head")).to_have_text(heads[state])
                await expect(page.get_by_test_id("jobs-range")).to_have_text(
                    f"1{DASH}20 of {total}"
                )
                await expect(page.get_by_test_id("jobs-prev")).to_be_disabled()
                first = await row_ids(page)
                for row in (await rows(page).all())[:3]:
                    await expect(row.locator('[data-field="time"]')).to_have_text(TIME)
                await page.get_by_test_id("jobs-next").click()
                await expect(page.get_by_test_id("jobs-range")).to_have_text(
                    f"21{DASH}{total} of {total}"
                )
                await expect(rows(page)).to_have_count(total - PAGE)
                await expect(page.get_by_test_id("jobs-next")).to_be_disabled()
                second = await row_ids(page)
                if ids is not None:
                    assert first + second == ids, state
                else:
                    assert set(first + second) == set(dead) and len(first + second) == 21
                # Previous goes back to the very same first page.
                await page.get_by_test_id("jobs-prev").click()
                await expect(page.get_by_test_id("jobs-range")).to_have_text(
                    f"1{DASH}20 of {total}"
                )
                assert await row_ids(page) == first, state

            # A dead row says what killed it; every row shows its payload and attempts.
            row = page.get_by_test_id(f"job-row-{dead[0]}")
            if not await row.count():
                await page.get_by_test_id("jobs-next").click()
            await expect(row.locator('[data-field="last_error"]')).to_have_text("boom {'n': 0}")
            await expect(row.locator('[data-field="payload"]')).to_have_text('{"n":0}')
            await expect(row.locator('[data-field="attempts"]')).to_have_text("1 / 1")
            # A row's id opens the job lookup.
            await row.locator('[data-field="id"] button').click()
            await expect(page.get_by_test_id("job-view")).to_have_attribute("data-state", "dead")

            # The open page follows the feed: a job enqueued now appears without a click.
            await page.get_by_test_id("jobs-tab-ready").click()
            await expect(page.get_by_test_id("jobs-range")).to_have_text(f"1{DASH}20 of 25")
            urgent = await client.enqueue("work", {"urgent": "most"}, priority=9)
            await expect(rows(page).first).to_have_attribute("data-job", urgent)
            await expect(page.get_by_test_id("jobs-range")).to_have_text(f"1{DASH}20 of 26")
            await expect(
                page.get_by_test_id("jobs-tab-ready").locator('[data-field="count"]')
            ).to_have_text("26")
            release.set()
    assert tab.seen.errors == []


async def test_search_finds_jobs_by_id_by_key_and_by_payload_text(broker: Broker, tab: Tab) -> None:
    page = await open_dashboard(tab, broker)
    async with Client(broker.url) as client:
        await client.enqueue_many("orders", [{"customer": f"c-{n}"} for n in range(30)])
        keyed = await client.enqueue("orders", {"customer": "zed"}, key="order-7731")
        acme = [await client.enqueue("orders", {"customer": "acme", "n": n}) for n in range(3)]
        hostile = await client.enqueue("orders", {"note": '<img src=x onerror="alert(1)">'})
        long = await client.enqueue("orders", {"text": "x" * 400})
        await open_queue(page, "orders")
        await show_state(page, "ready", 36)
        search = page.get_by_test_id("jobs-search")

        await search.fill(acme[1])  # an id
        await expect(rows(page)).to_have_count(1)
        await expect(rows(page).first).to_have_attribute("data-job", acme[1])
        await expect(page.get_by_test_id("jobs-range")).to_have_text("1 matching · page 1")

        await search.fill("order-7731")  # a key
        await expect(rows(page)).to_have_count(1)
        await expect(rows(page).first).to_have_attribute("data-job", keyed)

        await search.fill("acme")  # payload text
        await expect(rows(page)).to_have_count(3)
        assert await row_ids(page) == acme

        await search.fill("onerror")
        await expect(rows(page)).to_have_count(1)
        cell = page.get_by_test_id(f"job-row-{hostile}").locator('[data-field="payload"]')
        await expect(cell).to_have_text('{"note":"<img src=x onerror=\\"alert(1)\\">"}')
        await expect(page.get_by_test_id("jobs-body").locator("img")).to_have_count(0)

        await search.fill("xxxxxxxx")  # a long payload's preview is cut short
        await expect(rows(page)).to_have_count(1)
        preview = page.get_by_test_id(f"job-row-{long}").locator('[data-field="payload"]')
        await expect(preview).to_have_text(re.compile(r'^\{"text":"x+…$'))
        assert len(await preview.inner_text()) == 121

        await search.fill("no-such-thing")
        await expect(page.get_by_test_id("jobs-table")).to_be_hidden()
        await expect(page.get_by_test_id("jobs-empty")).to_have_text(
            "No ready job matches “no-such-thing”."
        )
        # The search holds across states; cleared, the whole listing is back.
        await page.get_by_test_id("jobs-tab-scheduled").click()
        await expect(page.get_by_test_id("jobs-empty")).to_have_text(
            "No scheduled job matches “no-such-thing”."
        )
        await page.get_by_test_id("jobs-tab-ready").click()
        await search.fill("")
        await expect(page.get_by_test_id("jobs-range")).to_have_text(f"1{DASH}20 of 36")
    assert tab.seen.errors == []


async def test_cancel_selected_cancels_the_ticked_jobs_after_a_confirm(
    broker: Broker, tab: Tab
) -> None:
    page = await open_dashboard(tab, broker)
    async with Client(broker.url) as client:
        ids = await client.enqueue_many("mail", [{"n": n} for n in range(25)])
        await open_queue(page, "mail")
        await show_state(page, "ready", 25)
        cancel = page.get_by_test_id("jobs-cancel")
        await expect(cancel).to_be_disabled()
        await expect(page.get_by_test_id("jobs-redrive-all")).to_be_hidden()
        await page.get_by_test_id(f"select-{ids[1]}").check()
        await page.get_by_test_id(f"select-{ids[3]}").check()
        await expect(cancel).to_have_text("Cancel selected (2)")

        # Dismissed, nothing is cancelled.
        tab.seen.confirm = False
        async with page.expect_event("dialog"):
            await cancel.click()
        assert tab.seen.dialogs[-1] == "confirm: Cancel 2 jobs? They are deleted for good."
        assert (await client.stats("mail"))["mail"]["ready"] == 25

        tab.seen.confirm = True
        await cancel.click()
        await expect(page.get_by_test_id("jobs-result")).to_have_text("Cancelled 2 jobs.")
        await expect(page.get_by_test_id(f"job-row-{ids[1]}")).to_have_count(0)
        await expect(page.get_by_test_id(f"job-row-{ids[3]}")).to_have_count(0)
        assert await client.get_job(ids[1]) is None and await client.get_job(ids[3]) is None
        assert await client.get_job(ids[2]) is not None
        await expect(page.get_by_test_id("jobs-range")).to_have_text(f"1{DASH}20 of 23")
        await expect(cancel).to_be_disabled()

        # Select all takes the page's jobs (20 of 23), no more.
        await page.get_by_test_id("jobs-select-all").check()
        await expect(cancel).to_have_text("Cancel selected (20)")
        await page.get_by_test_id(f"select-{ids[0]}").uncheck()
        await expect(cancel).to_have_text("Cancel selected (19)")
        await page.get_by_test_id(f"select-{ids[0]}").check()
        await cancel.click()
        await expect(page.get_by_test_id("jobs-result")).to_have_text("Cancelled 20 jobs.")
        await expect(page.get_by_test_id("jobs-range")).to_have_text(f"1{DASH}3 of 3")
        assert await row_ids(page) == ids[22:]
        await expect(
            page.get_by_test_id("jobs-tab-ready").locator('[data-field="count"]')
        ).to_have_text("3")
    assert tab.seen.errors == []


async def test_redrive_all_puts_every_dead_job_back_after_a_confirm(
    broker: Broker, tab: Tab
) -> None:
    page = await open_dashboard(tab, broker)
    async with Client(broker.url) as client:
        dead = await dead_jobs(client, broker, "billing", [{"n": n} for n in range(24)])
        await open_queue(page, "billing")
        await show_state(page, "dead", 24)
        await expect(page.get_by_test_id("jobs-cancel")).to_be_hidden()
        await expect(page.get_by_test_id("jobs-select-all")).to_be_hidden()
        await expect(page.locator('[data-testid^="select-"]')).to_have_count(0)
        redrive = page.get_by_test_id("jobs-redrive-all")

        tab.seen.confirm = False
        async with page.expect_event("dialog"):
            await redrive.click()
        assert tab.seen.dialogs[-1].startswith("confirm: Redrive all 24 dead jobs of billing?")
        assert (await client.stats("billing"))["billing"]["dead"] == 24

        tab.seen.confirm = True
        await redrive.click()
        await expect(page.get_by_test_id("jobs-result")).to_have_text(
            "Redrove 24 dead jobs of billing."
        )
        await expect(page.get_by_test_id("jobs-empty")).to_have_text("No dead jobs in billing.")
        await expect(redrive).to_be_disabled()
        stats = (await client.stats("billing"))["billing"]
        assert (stats["dead"], stats["ready"]) == (0, 24)
        await show_state(page, "ready", 24)
        await page.get_by_test_id("jobs-next").click()
        await expect(rows(page)).to_have_count(4)
        assert len(dead) == 24
    assert tab.seen.errors == []


@pytest.mark.parametrize("config", [TOKENS])
async def test_a_read_only_token_browses_but_sees_no_bulk_actions(broker: Broker, tab: Tab) -> None:
    page = await open_dashboard(tab, broker, token=READER)
    await expect(page.get_by_test_id("role")).to_have_text("read-only")
    async with Client(broker.url, token=APP) as client:
        ids = await client.enqueue_many("mail", [{"n": n} for n in range(3)])
        await open_queue(page, "mail")
        await show_state(page, "ready", 3)
        assert await row_ids(page) == ids
        await expect(page.get_by_test_id("jobs-actions")).to_be_hidden()
        await expect(page.get_by_test_id("jobs-cancel")).to_be_hidden()
        await expect(page.get_by_test_id("jobs-select-all")).to_be_hidden()
        await expect(page.locator('[data-testid^="select-"]')).to_have_count(0)
        await page.get_by_test_id("jobs-tab-dead").click()
        await expect(page.get_by_test_id("jobs-empty")).to_have_text("No dead jobs in mail.")
        await expect(page.get_by_test_id("jobs-redrive-all")).to_be_hidden()
        # Forced through the page's connection, the broker refuses the bulk ops.
        for op, fields in [("cancel_batch", {"ids": ids}), ("redrive_all", {"queue": "mail"})]:
            reply = await page.evaluate(
                "([op, fields]) => window.conveyorDashboard.request(op, fields)", [op, fields]
            )
            assert reply["ok"] is False and reply["error"]["code"] == "forbidden", (op, reply)
        assert (await client.stats("mail"))["mail"]["ready"] == 3
    assert tab.seen.errors == []


async def test_at_phone_width_the_jobs_table_scrolls_inside_its_card(
    broker: Broker, tab: Tab
) -> None:
    page = tab.page
    await page.set_viewport_size({"width": 420, "height": 800})
    await open_dashboard(tab, broker)
    async with Client(broker.url) as client:
        await dead_jobs(
            client,
            broker,
            "a-queue-with-a-rather-long-name",
            [{"payload": "y" * 300, "n": n} for n in range(3)],
        )
        await client.enqueue_many("a-queue-with-a-rather-long-name", [{"text": "z" * 300}] * 25)
        await open_queue(page, "a-queue-with-a-rather-long-name")
        await show_state(page, "ready", 25)
        await page.evaluate("window.scrollTo(0, 0)")
        sizes = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert sizes[0] <= sizes[1] == 420
        wrap = page.get_by_test_id("jobs-wrap")
        hidden = await wrap.evaluate("w => w.scrollWidth - w.clientWidth")
        assert hidden > 0  # the table is wider than the card: it scrolls inside it
        for test_id in (
            "jobs-tab-ready",
            "jobs-tab-dead",
            "jobs-search",
            "jobs-cancel",
            "jobs-next",
            "jobs-range",
        ):
            node = page.get_by_test_id(test_id)
            await node.scroll_into_view_if_needed()
            box = await node.bounding_box()
            assert box is not None, test_id
            assert 0 <= box["x"] and box["x"] + box["width"] <= 420, (test_id, box)
    assert tab.seen.errors == []


async def test_on_a_wide_screen_every_state_tab_is_on_one_row(broker: Broker, tab: Tab) -> None:
    # The tabs are one segmented control: a tab wrapped to a row of its own (as when the
    # grid had a column fewer than the tabs) reads as a broken control.
    page = tab.page
    await page.set_viewport_size({"width": 1400, "height": 900})
    await open_dashboard(tab, broker)
    async with Client(broker.url) as client:
        await client.enqueue("mail", {"n": 1})
        await open_queue(page, "mail")
        await show_state(page, "ready", 1)
    tabs = await page.get_by_test_id("jobs-tabs").locator("button[data-state]").all()
    assert len(tabs) == 6
    boxes = [await t.bounding_box() for t in tabs]
    assert all(box is not None for box in boxes)
    tops = {round(box["y"]) for box in boxes if box is not None}
    assert len(tops) == 1, boxes
    assert tab.seen.errors == []


@pytest.mark.parametrize("config", [replace(BASE, max_batch=2)])
async def test_cancel_selected_sends_batches_the_broker_takes(broker: Broker, tab: Tab) -> None:
    # The broker takes at most max_batch ids a cancel_batch (its hello says how many).
    page = await open_dashboard(tab, broker)
    async with Client(broker.url) as client:
        for n in range(5):
            await client.enqueue("mail", {"n": n})
        await open_queue(page, "mail")
        await show_state(page, "ready", 5)
        await page.get_by_test_id("jobs-select-all").check()
        await page.get_by_test_id("jobs-cancel").click()
        await expect(page.get_by_test_id("jobs-result")).to_have_text("Cancelled 5 jobs.")
        await expect(page.get_by_test_id("jobs-empty")).to_have_text("No ready jobs in mail.")
        assert (await client.stats("mail"))["mail"]["ready"] == 0
    assert tab.seen.errors == []
