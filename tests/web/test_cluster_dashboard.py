"""The dashboard of a broker on a shared PostgreSQL table shows the whole cluster: its
queue counts, how many brokers there are, and every broker's workers with the broker
each is on. In Chromium, as the other dashboard tests."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import pytest

from conveyor.broker.server import running_broker
from conveyor.sdk import Client, Job, Worker

from ..conformance.pg import database
from ..postgres.test_brokers import _url
from .conftest import BASE, LOOP, Tab, open_dashboard, skip_without_browser, working

skip_without_browser()

from playwright.async_api import expect  # noqa: E402 (only once it is known to be here)

pytestmark = pytest.mark.asyncio(loop_scope=LOOP)


async def test_a_brokers_dashboard_shows_every_brokers_workers_and_counts(tab: Tab) -> None:
    async with database() as dsn, contextlib.AsyncExitStack() as stack:
        config = replace(BASE, store="postgres", db_path=_url(dsn))
        a = await stack.enter_async_context(running_broker(config))
        b = await stack.enter_async_context(running_broker(config))
        release = asyncio.Event()
        worker = Worker(b.url, worker_id="w-on-b", prefetch=1, shutdown_timeout_s=1.0)

        @worker.handler("reports")
        async def handle(job: Job) -> None:
            await release.wait()

        page = await open_dashboard(tab, a)
        async with Client(b.url) as client, working(worker):
            await client.enqueue_many("reports", [{"n": n} for n in range(3)])
            # Broker a's page: b's worker, on b, holding one job; the counts are the table's.
            await expect(page.get_by_test_id("server-brokers")).to_have_text("2")
            row = page.get_by_test_id("worker-row-w-on-b")
            await expect(row.locator('[data-field="broker"]')).to_have_text(b.url)
            await expect(row.locator('[data-field="in_hand"]')).to_have_text("1")
            await expect(
                page.get_by_test_id("queue-row-reports").locator('[data-field="ready"]')
            ).to_have_text("2")
            # Its detail on a: what b told of it, and where its jobs are listed.
            await row.get_by_test_id("open-worker-w-on-b").click()
            card = page.get_by_test_id("worker-detail")
            await expect(card).to_have_attribute("data-state", "elsewhere")
            await expect(page.get_by_test_id("worker-detail-count")).to_have_text("1 in hand")
            await expect(page.get_by_test_id("worker-detail-note")).to_contain_text(b.url)
            await expect(page.get_by_test_id("held-table")).to_be_hidden()
            release.set()
        await expect(page.get_by_test_id("worker-row-w-on-b")).to_have_count(0)
    assert tab.seen.errors == []
