"""The dashboard's flow-control views, in headless Chromium against a real broker (see
conftest.py).

A queue's row shows how many ready jobs its limits hold back, with the limits in its
tooltip; its card says the limits in words and, for an admin, edits them through
``set_limits``, showing the broker's refusal of a bad value; a read-only viewer sees the
limits but no form.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

import pytest

from conveyor.broker.server import Broker
from conveyor.sdk import Client, Job, RateLimited, Worker
from conveyor.sdk._wire import Role

from .conftest import BASE, LOOP, WAIT, Tab, open_dashboard, skip_without_browser, working

skip_without_browser()

from playwright.async_api import Page, expect  # noqa: E402 (once known here)

pytestmark = pytest.mark.asyncio(loop_scope=LOOP)

ADMIN = "admin-secret"
READER = "read-secret"
APP = "app-secret"  # publishes and works: the SDK's side of the tests
TOKENS = replace(
    BASE,
    tokens={
        ADMIN: frozenset({Role.ADMIN}),
        READER: frozenset({Role.READ}),
        APP: frozenset({Role.PUBLISH, Role.WORK}),
    },
)
with_tokens = pytest.mark.parametrize("config", [TOKENS])

NO_LIMITS = {
    "concurrency": None,
    "rate": None,
    "per_s": 1.0,
    "burst": None,
    "partition_concurrency": None,
    "partition_rate": None,
    "partition_per_s": 1.0,
    "partition_burst": None,
}

# A time of today, or a date and time when it falls on another day.
CLOCK = r"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d$"


async def open_queue(page: Page, name: str) -> None:
    await page.get_by_test_id(f"open-queue-{name}").click()
    await expect(page.get_by_test_id("queue-detail-name")).to_have_text(name)


async def test_a_queue_held_back_by_its_limits_shows_its_limited_count_and_limits(
    broker: Broker, tab: Tab
) -> None:
    page = await open_dashboard(tab, broker)
    release = asyncio.Event()
    worker = Worker(broker.url, queues=[], worker_id="w-lim", prefetch=10, shutdown_timeout_s=1.0)
    taken: set[str] = set()
    three = asyncio.Event()

    @worker.handler("crm")
    async def sync(job: Job) -> None:
        taken.add(job.id)
        if len(taken) == 3:
            three.set()
        await release.wait()

    async with Client(broker.url) as client:
        await client.set_limits(
            "crm", concurrency=10, rate=100, per_s=60, burst=5, partition_concurrency=1
        )
        for key in ("acme", "globex", "initech"):
            for n in range(3):
                await client.enqueue("crm", {"n": n}, partition=key)
        async with working(worker):
            # One job of each key runs; the other two of each wait on the per-key limit.
            await asyncio.wait_for(three.wait(), WAIT)
            limited = page.get_by_test_id("limited-crm")
            await expect(limited).to_have_text("6")
            await expect(limited).to_have_class(re.compile(r"\bhas-limited\b"))
            summary = "10 at once · 100 per 60 s (burst 5) · per key: 1 at once"
            await expect(limited).to_have_attribute("title", summary)
            assert (await client.stats("crm"))["crm"]["limited"] == 6

            await open_queue(page, "crm")
            await expect(page.get_by_test_id("limits-summary")).to_have_text(summary)
            await expect(page.get_by_test_id("limits-limited")).to_have_text("6")
            await expect(page.get_by_test_id("limits-partitions")).to_have_text("3")
            # Prefilled from the limits in force; the periods only with their rates.
            form = page.get_by_test_id("limits-form")
            await expect(form).to_be_visible()
            for field, value in [
                ("concurrency", "10"),
                ("rate", "100"),
                ("per_s", "60"),
                ("burst", "5"),
                ("partition_concurrency", "1"),
                ("partition_rate", ""),
                ("partition_per_s", ""),
                ("partition_burst", ""),
            ]:
                await expect(page.get_by_test_id(f"limit-{field}")).to_have_value(value)
            release.set()
            await expect(limited).to_have_text("0")
            await expect(limited).not_to_have_class(re.compile(r"\bhas-limited\b"))
    assert tab.seen.errors == []


async def test_a_queue_backed_off_says_until_when(broker: Broker, tab: Tab) -> None:
    page = await open_dashboard(tab, broker)
    worker = Worker(broker.url, queues=[], worker_id="w-429", shutdown_timeout_s=1.0)
    hit = asyncio.Event()

    @worker.handler("upstream")
    async def call(job: Job) -> None:
        hit.set()
        raise RateLimited(600, queue=True)

    async with Client(broker.url) as client:
        await client.set_limits("upstream", concurrency=2)
        await client.enqueue("upstream", {"n": 1})
        async with working(worker):
            await asyncio.wait_for(hit.wait(), WAIT)
            limited = page.get_by_test_id("limited-upstream")
            await expect(limited).to_have_text(re.compile(r"^1 · backed off until " + CLOCK))
            await expect(limited).to_have_attribute(
                "title", re.compile(r"^2 at once; backed off until " + CLOCK)
            )
            await open_queue(page, "upstream")
            await expect(page.get_by_test_id("limits-backoff")).to_have_text(
                re.compile(r"^until " + CLOCK)
            )
    assert tab.seen.errors == []


@with_tokens
async def test_an_admin_sets_limits_through_the_form_and_a_bad_value_is_refused(
    broker: Broker, tab: Tab
) -> None:
    page = await open_dashboard(tab, broker, token=ADMIN)
    await expect(page.get_by_test_id("role")).to_have_text("admin")
    async with Client(broker.url, token=ADMIN) as client:
        await client.enqueue("geocode", {"n": 1})
        await open_queue(page, "geocode")
        await expect(page.get_by_test_id("limits-summary")).to_have_text("No limits")
        await expect(page.get_by_test_id("limited-geocode")).to_have_attribute("title", "No limits")

        # Typed over two snapshots: what is typed stays while the snapshots come.
        await page.get_by_test_id("limit-rate").fill("50")
        as_of = await page.get_by_test_id("as-of").text_content()
        await expect(page.get_by_test_id("as-of")).not_to_have_text(as_of or "")
        await expect(page.get_by_test_id("limit-rate")).to_have_value("50")
        await page.get_by_test_id("limit-per_s").fill("1.5")
        await page.get_by_test_id("limit-partition_concurrency").fill("2")
        await page.get_by_test_id("limits-save").click()
        notice = page.get_by_test_id("notice")
        summary = "50 per 1.5 s · per key: 2 at once"
        await expect(notice).to_have_text(f"Limits of geocode: {summary}.")
        await expect(page.get_by_test_id("limits-summary")).to_have_text(summary)
        await expect(page.get_by_test_id("limited-geocode")).to_have_attribute("title", summary)
        limits = (await client.stats("geocode"))["geocode"]["limits"]
        assert limits == {**NO_LIMITS, "rate": 50, "per_s": 1.5, "partition_concurrency": 2}

        # A bad value: the broker refuses it, naming the field, and nothing changes.
        await page.get_by_test_id("limit-concurrency").fill("0")
        await page.get_by_test_id("limits-save").click()
        await expect(notice).to_have_attribute("data-kind", "error")
        await expect(notice).to_have_text("set_limits refused: concurrency: must be >= 1, got 0")
        # What the operator typed is kept, to be corrected.
        await expect(page.get_by_test_id("limit-concurrency")).to_have_value("0")
        assert (await client.stats("geocode"))["geocode"]["limits"] == limits
        await expect(page.get_by_test_id("limits-summary")).to_have_text(summary)

        # Clear sends the queue alone: no limits at all.
        await page.get_by_test_id("limits-clear").click()
        await expect(notice).to_have_text("geocode has no limits now.")
        await expect(page.get_by_test_id("limits-summary")).to_have_text("No limits")
        assert (await client.stats("geocode"))["geocode"]["limits"] == NO_LIMITS
        for field in ("concurrency", "rate", "per_s", "partition_concurrency"):
            await expect(page.get_by_test_id(f"limit-{field}")).to_have_value("")
        assert any("Remove every limit of geocode?" in d for d in tab.seen.dialogs)

        # Limits set elsewhere show up in the (untouched) form.
        await client.set_limits("geocode", concurrency=7)
        await expect(page.get_by_test_id("limit-concurrency")).to_have_value("7")
        await expect(page.get_by_test_id("limits-summary")).to_have_text("7 at once")
    assert tab.seen.errors == []


@with_tokens
async def test_a_read_only_viewer_sees_the_limits_but_no_form(broker: Broker, tab: Tab) -> None:
    page = await open_dashboard(tab, broker, token=READER)
    await expect(page.get_by_test_id("role")).to_have_text("read-only")
    async with Client(broker.url, token=APP) as client:
        await client.enqueue("billing", {"invoice": 7}, partition="customer-42")
        reply = await page.evaluate(
            "(fields) => window.conveyorDashboard.request('set_limits', fields)",
            {"queue": "billing", "concurrency": 3},
        )
        assert reply["ok"] is False and reply["error"]["code"] == "forbidden", reply
    async with Client(broker.url, token=ADMIN) as admin:
        await admin.set_limits("billing", concurrency=50, partition_concurrency=1)
        await expect(page.get_by_test_id("limited-billing")).to_have_attribute(
            "title", "50 at once · per key: 1 at once"
        )
        await open_queue(page, "billing")
        await expect(page.get_by_test_id("limits-summary")).to_have_text(
            "50 at once · per key: 1 at once"
        )
        await expect(page.get_by_test_id("limits-partitions")).to_have_text("1")
        await expect(page.get_by_test_id("limits-form")).to_be_hidden()
        await expect(page.get_by_test_id("limits-save")).to_be_hidden()
        limits = (await admin.stats("billing"))["billing"]["limits"]
        assert limits == {**NO_LIMITS, "concurrency": 50, "partition_concurrency": 1}
    assert tab.seen.errors == []
