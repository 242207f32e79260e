"""The dashboard in a real browser (headless Chromium) against a real broker.

What an operator sees and may do: the page loads cleanly, counts follow the broker live,
dead letters show their error, admin actions work with the admin token and are refused
without it, the banner tracks the connection, markup from the broker stays text, and a
page from another origin cannot open the broker's socket.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

import pytest

from conveyor.broker.server import Broker, running_broker
from conveyor.sdk import Client, Fail, Job, Worker
from conveyor.sdk._wire import Role

from .conftest import (
    BASE,
    LOOP,
    WAIT,
    Tab,
    open_dashboard,
    page_url,
    port_of,
    serving,
    skip_without_browser,
    working,
)

skip_without_browser()

from playwright.async_api import Locator, Page, expect  # noqa: E402 (once known here)

pytestmark = pytest.mark.asyncio(loop_scope=LOOP)

ADMIN = "admin-secret"
READER = "read-secret"
DASH = "\N{EN DASH}"  # the dead-letter range reads "1 to 20 of 25" with this dash
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


def cell(page: Page, queue: str, field: str) -> Locator:
    """A cell of a queue's row: ready, scheduled, processing, dead, paused, chart, ..."""
    return page.get_by_test_id(f"queue-row-{queue}").locator(f'[data-field="{field}"]')


async def dead_job(
    client: Client,
    broker: Broker,
    queue: str,
    payload: object,
    *,
    error: str = "boom",
    token: str | None = None,
    worker_id: str | None = None,
) -> str:
    """Enqueue a job and have a worker fail it for good; return its id once it is dead."""
    worker = Worker(broker.url, queues=[], token=token, worker_id=worker_id, shutdown_timeout_s=1.0)

    ran = asyncio.Event()

    @worker.handler(queue)
    async def fail(job: Job) -> None:
        ran.set()
        raise Fail(error)

    job_id = await client.enqueue(queue, payload)
    async with working(worker):  # stopping waits until the broker answered the fail
        await asyncio.wait_for(ran.wait(), WAIT)
    return job_id


# -- loading --------------------------------------------------------------------------------


async def test_page_loads_without_console_errors(broker: Broker, tab: Tab) -> None:
    response = await tab.page.goto(page_url(broker))
    assert response is not None and response.ok
    assert response.headers["content-type"].startswith("text/html")
    page = tab.page
    await expect(page.get_by_test_id("conn-state")).to_have_attribute("data-state", "live")
    await expect(page.get_by_test_id("server-version")).to_have_text(re.compile(r"^\d+\.\d+"))
    await expect(page.get_by_test_id("server-store")).to_have_text("memory")
    await expect(page.get_by_test_id("queues-empty")).to_be_visible()
    await expect(page.get_by_test_id("workers-empty")).to_be_visible()
    await expect(page.get_by_test_id("banner")).to_be_hidden()
    await expect(page.get_by_test_id("role")).to_have_text("admin")  # no tokens: every role
    assert tab.seen.errors == []
    assert tab.seen.dialogs == []


# -- live counts ----------------------------------------------------------------------------


async def test_counts_follow_jobs_enqueued_and_handled(broker: Broker, tab: Tab) -> None:
    page = await open_dashboard(tab, broker)
    release = asyncio.Event()
    worker = Worker(broker.url, queues=[], worker_id="w-live", prefetch=1, shutdown_timeout_s=1.0)

    @worker.handler("emails")
    async def send(job: Job) -> None:
        await release.wait()

    async with Client(broker.url) as client:
        await client.enqueue_many("emails", [{"to": f"u{i}@example.com"} for i in range(3)])
        await expect(cell(page, "emails", "ready")).to_have_text("3")
        await expect(cell(page, "emails", "processing")).to_have_text("0")

        async with working(worker):
            # The worker holds one job (prefetch 1) and waits.
            await expect(cell(page, "emails", "processing")).to_have_text("1")
            await expect(cell(page, "emails", "ready")).to_have_text("2")
            row = page.get_by_test_id("worker-row-w-live")
            await expect(row.locator('[data-field="queues"]')).to_have_text("emails")
            await expect(row.locator('[data-field="prefetch"]')).to_have_text("1")
            await expect(row.locator('[data-field="in_hand"]')).to_have_text("1")
            await expect(page.get_by_test_id("workers-count")).to_have_text("1 connected")

            release.set()
            await expect(cell(page, "emails", "ready")).to_have_text("0")
            await expect(cell(page, "emails", "processing")).to_have_text("0")
            await expect(row.locator('[data-field="in_hand"]')).to_have_text("0")
            # The chart draws the completions once a one-second sample holds them.
            completed = cell(page, "emails", "chart").locator("polyline.completed")
            await expect(completed).to_have_attribute("points", re.compile(r"\d"))
        await expect(page.get_by_test_id("worker-row-w-live")).to_have_count(0)
    assert tab.seen.errors == []


async def test_a_failed_job_shows_under_dead_letters_with_its_error(
    broker: Broker, tab: Tab
) -> None:
    page = await open_dashboard(tab, broker)
    async with Client(broker.url) as client:
        job_id = await dead_job(client, broker, "billing", {"invoice": 42})
    await expect(cell(page, "billing", "dead")).to_have_text("1")
    row = page.get_by_test_id(f"dead-row-{job_id}")
    await expect(row.locator('[data-field="last_error"]')).to_have_text("boom")
    await expect(row.locator('[data-field="attempts"]')).to_have_text("1")
    await expect(row.locator('[data-field="payload_preview"]')).to_contain_text('"invoice":42')
    await expect(page.get_by_test_id("dead-range")).to_have_text(f"1{DASH}1 of 1")

    # Following it shows every field of the job, live.
    await row.locator('[data-field="id"] button').click()
    view = page.get_by_test_id("job-view")
    await expect(view).to_have_attribute("data-state", "dead")
    await expect(view.locator('[data-field="last_error"] dd')).to_have_text("boom")
    await expect(view.locator('[data-field="queue"] dd')).to_have_text("billing")
    for name in ("max_attempts", "visibility_timeout_s", "enqueued_at", "died_at", "key"):
        await expect(view.locator(f'[data-field="{name}"]')).to_have_count(1)
    assert tab.seen.errors == []


async def test_dead_letters_are_paged_by_the_broker(broker: Broker, tab: Tab) -> None:
    page = await open_dashboard(tab, broker)
    async with Client(broker.url) as client:
        await client.enqueue_many("bulk", [{"n": i} for i in range(25)])
        worker = Worker(broker.url, queues=[], prefetch=25, shutdown_timeout_s=1.0)

        @worker.handler("bulk")
        async def fail(job: Job) -> None:
            raise Fail("nope")

        async with working(worker):
            await expect(cell(page, "bulk", "dead")).to_have_text("25")
    dead_rows = page.locator('[data-testid^="dead-row-"]')
    await expect(page.get_by_test_id("dead-range")).to_have_text(f"1{DASH}20 of 25")
    await expect(dead_rows).to_have_count(20)
    await expect(page.get_by_test_id("dead-prev")).to_be_disabled()
    await page.get_by_test_id("dead-next").click()
    await expect(page.get_by_test_id("dead-range")).to_have_text(f"21{DASH}25 of 25")
    await expect(dead_rows).to_have_count(5)
    await expect(page.get_by_test_id("dead-next")).to_be_disabled()
    await page.get_by_test_id("dead-prev").click()
    await expect(page.get_by_test_id("dead-range")).to_have_text(f"1{DASH}20 of 25")


# -- admin actions --------------------------------------------------------------------------


@with_tokens
async def test_admin_can_pause_redrive_cancel_and_purge(broker: Broker, tab: Tab) -> None:
    page = tab.page
    await page.goto(page_url(broker))
    # The broker asks for a token: a wrong one is refused, the right one kept for the tab.
    panel = page.get_by_test_id("token-panel")
    await expect(panel).to_be_visible()
    await page.get_by_test_id("token-input").fill("not-a-token")
    await page.get_by_test_id("token-submit").click()
    await expect(page.get_by_test_id("token-message")).to_contain_text("refused")
    await expect(panel).to_be_visible()
    await page.get_by_test_id("token-input").fill(ADMIN)
    await page.get_by_test_id("token-submit").click()
    await expect(page.get_by_test_id("conn-state")).to_have_attribute("data-state", "live")
    await expect(panel).to_be_hidden()
    await expect(page.get_by_test_id("role")).to_have_text("admin")
    assert await page.evaluate("sessionStorage.getItem('conveyor.token')") == ADMIN

    async with Client(broker.url, token=APP) as client:
        first = await dead_job(client, broker, "mail", {"n": 1}, token=APP)
        second = await dead_job(client, broker, "mail", {"n": 2}, token=APP)
        await expect(cell(page, "mail", "dead")).to_have_text("2")

        await page.get_by_test_id("pause-mail").click()
        await expect(cell(page, "mail", "paused")).to_have_text("paused")
        assert (await client.stats("mail"))["mail"]["paused"] is True

        await page.get_by_test_id(f"redrive-{first}").click()
        await expect(page.get_by_test_id(f"dead-row-{first}")).to_have_count(0)
        await expect(cell(page, "mail", "ready")).to_have_text("1")
        await expect(cell(page, "mail", "dead")).to_have_text("1")

        # Cancel asks first: dismissed, the job stays; accepted, it is gone.
        await page.get_by_test_id("job-input").fill(first)
        await page.get_by_test_id("job-submit").click()
        view = page.get_by_test_id("job-view")
        await expect(view).to_have_attribute("data-state", "ready")
        tab.seen.confirm = False
        async with page.expect_event("dialog"):
            await page.get_by_test_id("job-cancel").click()
        assert tab.seen.dialogs[-1].startswith("confirm: Cancel job")
        assert await client.get_job(first) is not None
        tab.seen.confirm = True
        await page.get_by_test_id("job-cancel").click()
        await expect(view).to_have_attribute("data-state", "gone")
        assert await client.get_job(first) is None

        await page.get_by_test_id("purge-dead").click()
        await expect(page.get_by_test_id(f"dead-row-{second}")).to_have_count(0)
        await expect(cell(page, "mail", "dead")).to_have_text("0")
        assert await client.get_job(second) is None

        await page.get_by_test_id("resume-mail").click()
        await expect(cell(page, "mail", "paused")).to_have_text("active")
        assert (await client.stats("mail"))["mail"]["paused"] is False
    assert len(tab.seen.dialogs) == 3  # two cancels and the purge, each confirmed first
    assert tab.seen.errors == []


@with_tokens
async def test_a_read_only_token_sees_no_actions_and_is_refused_them(
    broker: Broker, tab: Tab
) -> None:
    page = await open_dashboard(tab, broker, token=READER)
    await expect(page.get_by_test_id("role")).to_have_text("read-only")
    async with Client(broker.url, token=APP) as client:
        job_id = await dead_job(client, broker, "mail", {"n": 1}, token=APP)
        await expect(page.get_by_test_id(f"dead-row-{job_id}")).to_be_visible()
        await page.get_by_test_id("job-input").fill(job_id)
        await page.get_by_test_id("job-submit").click()
        await expect(page.get_by_test_id("job-view")).to_have_attribute("data-state", "dead")

        for prefix in ("pause-", "resume-", "redrive-", "cancel-dead-"):
            await expect(page.locator(f'[data-testid^="{prefix}"]')).to_have_count(0)
        await expect(page.get_by_test_id("job-cancel")).to_have_count(0)
        await expect(page.get_by_test_id("purge-dead")).to_be_hidden()

        # Forced through the page's own connection, the broker refuses each one.
        for op, fields in [
            ("pause", {"queue": "mail"}),
            ("resume", {"queue": "mail"}),
            ("redrive", {"id": job_id}),
            ("purge_dead", {"queue": "mail"}),
            ("cancel", {"id": job_id}),
        ]:
            reply = await page.evaluate(
                "([op, fields]) => window.conveyorDashboard.request(op, fields)", [op, fields]
            )
            assert reply["ok"] is False, (op, reply)
            assert reply["error"]["code"] == "forbidden", (op, reply)
        info = await client.get_job(job_id)
        assert info is not None and info.state == "dead"
        assert (await client.stats("mail"))["mail"]["paused"] is False
    assert tab.seen.errors == []


# -- the connection -------------------------------------------------------------------------


async def test_the_banner_shows_while_the_broker_is_away(tab: Tab) -> None:
    async with running_broker(BASE) as first:
        page = await open_dashboard(tab, first)
        port = port_of(first)
        await expect(page.get_by_test_id("banner")).to_be_hidden()
    # The broker stopped (close 1001): the page says so and keeps trying.
    await expect(page.get_by_test_id("banner")).to_be_visible()
    await expect(page.get_by_test_id("banner")).to_contain_text("reconnecting")
    await expect(page.get_by_test_id("conn-state")).to_have_attribute(
        "data-state", re.compile("disconnected|connecting")
    )
    async with running_broker(replace(BASE, port=port)) as second:
        async with Client(second.url) as client:
            await client.enqueue("after", {"back": True})
        # A reconnect attempt comes at most 5 s after the last one.
        await expect(page.get_by_test_id("banner")).to_be_hidden(timeout=WAIT * 1000 + 5000)
        await expect(page.get_by_test_id("conn-state")).to_have_attribute("data-state", "live")
        await expect(cell(page, "after", "ready")).to_have_text("1")


async def test_a_page_from_another_origin_cannot_open_the_socket(broker: Broker, tab: Tab) -> None:
    page = tab.page
    target = {"url": broker.url}

    def foreign() -> str:
        # A page from elsewhere (another port is another origin) that tries the broker's
        # socket, as a malicious site open in the operator's browser would.
        return f"""<!doctype html><title>elsewhere</title><p id="state">connecting</p>
<script>
  const ws = new WebSocket({target["url"]!r});
  const show = (text) => {{ document.getElementById("state").textContent = text; }};
  ws.onopen = () => {{ show("open"); ws.send('{{"op":"ping","rid":1}}'); }};
  ws.onmessage = () => show("answered");
  ws.onclose = (event) => show("closed " + event.code);
</script>"""

    async with serving(foreign) as elsewhere:
        await page.goto(elsewhere)
        # The broker answered the handshake 403; the page's script sees only a 1006 close.
        await expect(page.locator("#state")).to_have_text("closed 1006")
        refused = [m.text for m in tab.seen.console if m.type == "error"]
        assert any("403" in text for text in refused), refused

        # The same page is let in once the broker is told to trust its origin.
        origin = elsewhere.rstrip("/")
        async with running_broker(replace(BASE, origins=(origin,))) as trusting:
            target["url"] = trusting.url
            await page.goto(elsewhere)
            await expect(page.locator("#state")).to_have_text("answered")

    # And the dashboard, from the broker's own origin, connects.
    await open_dashboard(tab, broker)


# -- markup stays text ----------------------------------------------------------------------


async def test_markup_from_the_broker_renders_as_text(broker: Broker, tab: Tab) -> None:
    page = await open_dashboard(tab, broker)
    script = "<script>alert(1)</script>"
    image = "<img src=x onerror=window.__pwned=1>"
    error = "<img src=y onerror=window.__pwned=2><b>bold</b>"
    payload = {"note": script, "img": image}
    async with Client(broker.url) as client:
        job_id = await dead_job(client, broker, "inbox", payload, error=error, worker_id="<i>w</i>")
        hold = asyncio.Event()
        idle = Worker(broker.url, queues=[], worker_id="<b>worker</b>", shutdown_timeout_s=1.0)

        @idle.handler("other")
        async def wait(job: Job) -> None:
            await hold.wait()

        async with working(idle):
            worker_row = page.get_by_test_id("worker-row-<b>worker</b>")
            await expect(worker_row.locator('[data-field="worker_id"]')).to_have_text(
                "<b>worker</b>"
            )
            row = page.get_by_test_id(f"dead-row-{job_id}")
            await expect(row.locator('[data-field="last_error"]')).to_have_text(error)
            preview = row.locator('[data-field="payload_preview"]')
            await expect(preview).to_contain_text(script)
            await expect(preview).to_contain_text(image)

            await page.get_by_test_id("job-input").fill(job_id)
            await page.get_by_test_id("job-submit").click()
            view = page.get_by_test_id("job-view")
            await expect(view).to_have_attribute("data-state", "dead")
            await expect(view.locator('[data-field="payload"] pre')).to_contain_text(script)
            await expect(view.locator('[data-field="last_error"] dd')).to_have_text(error)

            # None of it became an element, and none of it ran.
            await expect(page.locator("main img, main script, main b, main i")).to_have_count(0)
            assert await page.evaluate("window.__pwned") is None
    assert tab.seen.dialogs == []
    assert tab.seen.errors == []
