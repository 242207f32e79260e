"""Fixtures for the dashboard's browser tests: Debian's Chromium driven by Playwright.

Each test starts a real broker on port 0 in-process (``running_broker``), opens the page
it serves in headless Chromium (``/usr/bin/chromium``, never a downloaded browser; see
../shared/browser-testing.md) and drives jobs through the SDK. Tests wait on DOM states
with Playwright's ``expect`` (bounded by ``WAIT_MS``), never on sleeps.

Playwright is imported inside the fixtures, so that this file loads (and the test module
can skip with a message) on a machine without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from conveyor.broker.config import Config
from conveyor.broker.server import Broker, running_broker
from conveyor.sdk import Worker

if TYPE_CHECKING:
    from playwright.async_api import Browser, ConsoleMessage, Dialog, Page

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium tries to reach the internet.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT = 5.0  # seconds any expected state may take before the test fails
WAIT_MS = WAIT * 1000
VIEWPORT: Any = {"width": 1400, "height": 900}

BASE = Config(port=0, store="memory", disconnect_grace_s=0.0, sweep_interval_s=60.0)


def skip_without_browser() -> None:
    """Skip the calling test module unless Chromium and Playwright are here (``make
    test``, run as root, installs Chromium)."""
    if not CHROMIUM.exists():
        pytest.skip(
            f"the dashboard's browser tests need Debian's Chromium at {CHROMIUM}: install it "
            "with `apt-get update && apt-get install -y chromium` (`make test` does so when "
            "run as root)",
            allow_module_level=True,
        )
    if importlib.util.find_spec("playwright") is None:
        pytest.skip(
            "the dashboard's browser tests need Playwright: `.venv/bin/pip install playwright` "
            "(never `playwright install`: the tests drive /usr/bin/chromium)",
            allow_module_level=True,
        )


def port_of(broker: Broker) -> int:
    return int(broker.url.rsplit(":", 1)[1].split("/", 1)[0])


def page_url(broker: Broker, host: str = "127.0.0.1") -> str:
    """The dashboard's address on ``broker``'s port."""
    return f"http://{host}:{port_of(broker)}/"


@pytest.fixture
def config() -> Config:
    return BASE


# One browser serves the whole module (launching it costs about a second), so every async
# fixture and test here runs in the module's event loop (``pytestmark`` in the tests).
LOOP = "module"


@pytest_asyncio.fixture(loop_scope=LOOP)
async def broker(config: Config) -> AsyncIterator[Broker]:
    async with running_broker(config) as running:
        yield running


@pytest_asyncio.fixture(scope=LOOP, loop_scope=LOOP)
async def browser() -> AsyncIterator[Browser]:
    from playwright.async_api import async_playwright, expect

    expect.set_options(timeout=WAIT_MS)
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=15_000
        )
        try:
            yield launched
        finally:
            await launched.close()


@dataclass
class Seen:
    """What the page said besides its DOM: console messages, uncaught errors, dialogs."""

    console: list[ConsoleMessage] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    # The answer to confirm() dialogs: True accepts, False dismisses.
    confirm: bool = True

    @property
    def errors(self) -> list[str]:
        return [m.text for m in self.console if m.type == "error"] + self.page_errors


@dataclass
class Tab:
    page: Page
    seen: Seen


@pytest_asyncio.fixture(loop_scope=LOOP)
async def tab(browser: Browser) -> AsyncIterator[Tab]:
    """A fresh browser context and page, recording console errors and dialogs."""
    context = await browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(WAIT_MS)
    page = await context.new_page()
    seen = Seen()
    pending: set[asyncio.Future[None]] = set()

    def on_dialog(dialog: Dialog) -> None:
        # Decided when the dialog opens (a test may change ``seen.confirm`` right after).
        seen.dialogs.append(f"{dialog.type}: {dialog.message}")
        answer = dialog.accept() if dialog.type == "confirm" and seen.confirm else dialog.dismiss()
        pending.add(asyncio.ensure_future(answer))

    page.on("console", lambda message: seen.console.append(message))
    page.on("pageerror", lambda exc: seen.page_errors.append(str(exc)))
    page.on("dialog", on_dialog)
    try:
        yield Tab(page, seen)
    finally:
        await context.close()
        for answer in pending:
            answer.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def open_dashboard(tab: Tab, broker: Broker, token: str | None = None) -> Page:
    """Load the dashboard (with ``token`` already in sessionStorage) and wait until live."""
    from playwright.async_api import expect

    page = tab.page
    if token is not None:
        await page.add_init_script(f"sessionStorage.setItem('conveyor.token', {token!r});")
    await page.goto(page_url(broker))
    await expect(page.get_by_test_id("conn-state")).to_have_attribute("data-state", "live")
    return page


@contextlib.asynccontextmanager
async def working(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``worker`` until the block ends (its handlers must not block past it)."""
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        yield task
    finally:
        worker.stop()
        try:
            async with asyncio.timeout(worker.shutdown_timeout_s + WAIT):
                await asyncio.shield(task)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@contextlib.asynccontextmanager
async def serving(page: Callable[[], str]) -> AsyncIterator[str]:
    """A one-page HTTP server on 127.0.0.1 (another port: another origin); yields its URL.

    ``page()`` is called for each request, so a test may change what it serves.
    """

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            body = page().encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
                b"Cache-Control: no-store\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.close()
        await server.wait_closed()
