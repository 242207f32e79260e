"""Take docs/dashboard.png: the dashboard of a broker with some realistic traffic.

    .venv/bin/python scripts/screenshot.py [--seconds 50] [--out docs/dashboard.png]

Starts an in-memory broker in this process, runs a few publishers and workers through
the SDK (steady mail, bursty thumbnails with some retries, billing with dead letters, a
paused reports queue with a backlog), lets the charts fill for ``--seconds``, then opens
the page in Debian's Chromium (see ../shared/browser-testing.md) and saves a full-page
screenshot. Needs /usr/bin/chromium and the playwright package (never
``playwright install``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conveyor.broker.config import Config  # noqa: E402
from conveyor.broker.server import Broker, running_broker  # noqa: E402
from conveyor.sdk import Client, Fail, Job, Retry, Worker  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
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


async def publish(client: Client, stop: asyncio.Event) -> None:
    """Steady mail with a slow swell, bursts of thumbnails, a trickle of invoices."""
    rng = random.Random(7)
    started = time.monotonic()
    tick = 0
    while not stop.is_set():
        elapsed = time.monotonic() - started
        mails = max(1, round(6 + 4 * math.sin(elapsed / 9)))
        await client.enqueue_many(
            "emails",
            [{"to": f"user{rng.randrange(10_000)}@example.com", "template": "receipt"}] * mails,
        )
        if tick % 40 < 6:  # a burst every 10 s
            await client.enqueue_many(
                "thumbnails",
                [{"image": f"s3://uploads/{rng.randrange(10**6):06d}.jpg", "size": 256}] * 8,
            )
        if tick % 3 == 0:
            await client.enqueue(
                "billing",
                {
                    "invoice": f"INV-{rng.randrange(10**5):05d}",
                    "amount": rng.randrange(500, 90_000),
                },
                max_attempts=2,
                backoff_base_s=0.5,
            )
        tick += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


def workers(url: str) -> list[Worker]:
    rng = random.Random(11)
    mailer = Worker(url, queues=[], worker_id="mailer-7f3c", prefetch=8, shutdown_timeout_s=2)
    imaging = Worker(url, queues=[], worker_id="imaging-02a1", prefetch=4, shutdown_timeout_s=2)
    payments = Worker(url, queues=[], worker_id="payments-91be", prefetch=2, shutdown_timeout_s=2)

    @mailer.handler("emails")
    async def send(job: Job) -> None:
        await asyncio.sleep(rng.uniform(0.02, 0.2))

    @imaging.handler("thumbnails")
    async def resize(job: Job) -> None:
        await asyncio.sleep(rng.uniform(0.15, 0.45))
        if rng.random() < 0.12:
            raise Retry(delay_s=1.0, error="OSError: image store busy")

    @payments.handler("billing")
    async def charge(job: Job) -> None:
        await asyncio.sleep(rng.uniform(0.05, 0.3))
        roll = rng.random()
        if roll < 0.08:
            raise Fail("card declined: insufficient funds")
        if roll < 0.16:
            raise Retry(error="TimeoutError: payment gateway did not answer within 30 s")

    return [mailer, imaging, payments]


@contextlib.asynccontextmanager
async def traffic(broker: Broker) -> AsyncIterator[Client]:
    stop = asyncio.Event()
    async with Client(broker.url) as client:
        # A paused queue with a backlog, and some scheduled work.
        await client.pause("reports")
        await client.enqueue_many("reports", [{"report": "weekly", "team": n} for n in range(37)])
        await client.enqueue_many(
            "webhooks", [{"hook": f"https://hooks.example.com/{n}"} for n in range(5)], delay_s=900
        )
        running = [asyncio.create_task(w.run()) for w in workers(broker.url)]
        publisher = asyncio.create_task(publish(client, stop))
        try:
            yield client
        finally:
            stop.set()
            await publisher
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)


async def shoot(args: argparse.Namespace) -> None:
    from playwright.async_api import async_playwright, expect

    config = Config(port=0, store="memory", sweep_interval_s=1.0, disconnect_grace_s=0.0)
    async with running_broker(config) as broker, traffic(broker) as client:
        await asyncio.sleep(args.seconds)
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1440, "height": 900})
            await page.goto(broker.url.replace("ws://", "http://").removesuffix("/ws") + "/")
            await expect(page.get_by_test_id("conn-state")).to_have_attribute("data-state", "live")
            dead = page.locator('[data-testid^="dead-row-"]')
            await expect(dead.first).to_be_visible(timeout=10_000)
            job_id = await dead.first.get_attribute("data-job")
            assert job_id is not None
            await page.get_by_test_id("job-input").fill(job_id)
            await page.get_by_test_id("job-submit").click()
            await expect(page.get_by_test_id("job-view")).to_have_attribute("data-state", "dead")
            await page.evaluate("window.scrollTo(0, 0)")
            await page.mouse.move(0, 0)  # no hover highlight in the picture
            await page.wait_for_timeout(600)  # one more snapshot, smooth scrolling settled
            await page.screenshot(path=args.out, full_page=True)
            await browser.close()
        stats = await client.stats()
    dead = ", ".join(f"{name}: {counts['dead']} dead" for name, counts in stats.items())
    print(f"wrote {args.out} ({dead})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=50.0, help="traffic before the shot")
    parser.add_argument("--out", default=str(ROOT / "docs" / "dashboard.png"))
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    asyncio.run(shoot(args))


if __name__ == "__main__":
    main()
